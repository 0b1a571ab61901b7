package handlers

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/views"
)

// Agent page: skills. Adding or removing a skill is an update of the
// agent's configuration through the same service call and audit record
// as saving its JSON; adding by upload also stores the bundle, as the
// uploads form does, in the same transaction.

// agentSkills lists a's skills as its page shows them.
func agentSkills(a agents.Agent) []views.SkillRow {
	cfg, _ := agents.ParseConfig(a.Config, apperr.Validation())
	rows := make([]views.SkillRow, len(cfg.Skills))
	for i, sk := range cfg.Skills {
		rows[i] = views.SkillRow{Name: sk.Name, Source: sk.Shown(), SHA256: sk.SHA256}
	}
	return rows
}

// skillFormFrom reads the "Add a skill" form (multipart, for its file).
func skillFormFrom(c echo.Context) views.SkillForm {
	return views.SkillForm{Name: strings.TrimSpace(c.FormValue("name")), Kind: c.FormValue("kind"),
		URL: strings.TrimSpace(c.FormValue("url")), Path: strings.TrimSpace(c.FormValue("path")), SHA256: strings.TrimSpace(c.FormValue("sha256"))}
}

// skillFromForm is the skill f describes, or the fields it lacks for its
// kind. An upload's source and pin are set once the bundle is stored.
func skillFromForm(f views.SkillForm) (agents.Skill, error) {
	sk := agents.Skill{Name: f.Name, SHA256: f.SHA256}
	v := apperr.Validation()
	switch f.Kind {
	case "url":
		sk.Source = f.URL
		if !strings.HasPrefix(f.URL, "https://") && !strings.HasPrefix(f.URL, "http://") {
			v.Add("url", "Enter the skill's URL, starting with https:// (or http://).")
		}
	case "path":
		sk.Source = f.Path
		if !strings.HasPrefix(f.Path, "/") {
			v.Add("path", "Enter an absolute path inside the environment, starting with /.")
		}
	case "upload":
		sk.Source, sk.SHA256 = agents.UploadSource+f.Name, ""
	default:
		v.Add("kind", "Choose where the skill comes from: a URL, a path or an uploaded bundle.")
	}
	return sk, v.Err()
}

// changeSkills applies change to the agent's stored configuration and
// saves it as an audited agent update, after storing upload (when set)
// with its own audit record; one transaction, so a refused skill leaves
// no bundle behind. change sees the stored upload (nil without one).
func (s *Server) changeSkills(c echo.Context, upload *agents.UploadInput, change func(config string, u *agents.Upload) (string, error)) (agents.Agent, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return agents.Agent{}, err
	}
	ctx := c.Request().Context()
	var after agents.Agent
	err = s.mutate(c, func(m *orgTx) error {
		cur, err := m.Agents().Manageable(ctx, m.Actor(), id)
		if err != nil {
			return err
		}
		var stored *agents.Upload
		if upload != nil {
			// The skill is checked before its bundle is stored: a name
			// the skill refuses should not be reported as the upload's.
			if _, err := change(cur.Config, &agents.Upload{SHA256: strings.Repeat("0", 64)}); err != nil {
				return err
			}
			before, u, err := m.Agents().PutUpload(ctx, m.Actor(), id, *upload)
			if err != nil {
				return err
			}
			action := "agent.upload"
			if before != nil {
				action = "agent.upload_replace"
			}
			if err := m.audit(action, agentTarget(cur), map[string]any{"before": uploadAudit(before), "after": uploadAudit(&u)}); err != nil {
				return err
			}
			stored = &u
		}
		cfg, err := change(cur.Config, stored)
		if err != nil {
			return err
		}
		after, err = m.updateAgent(ctx, id, agents.Input{Config: &cfg})
		return err
	})
	return after, err
}

// pageAddSkill adds a skill from the agent page's form: by URL, by path,
// or by uploading a bundle, which is stored and attached as
// upload:<name> pinned to its SHA-256.
func (s *Server) pageAddSkill(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	// Who may not change the agent learns nothing from the form's rules.
	a, err := s.agentService(c).Manageable(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	if err := c.Request().ParseMultipartForm(8 << 20); err != nil && !errors.Is(err, http.ErrNotMultipart) {
		return s.refuseSkill(c, views.SkillForm{}, uploadReadError(err))
	}
	f := skillFormFrom(c)
	sk, err := skillFromForm(f)
	if err != nil {
		return s.refuseSkill(c, f, err)
	}
	var upload *agents.UploadInput
	if f.Kind == "upload" {
		in, err := readUpload(c)
		if err != nil {
			if errors.Is(err, apperr.ErrInvalid) {
				err = fileError(err)
			}
			return s.refuseSkill(c, f, err)
		}
		in.Kind, in.Name = agents.UploadSkill, f.Name
		upload = &in
	}
	a, err = s.changeSkills(c, upload, func(config string, u *agents.Upload) (string, error) {
		add := sk
		if u != nil {
			add.SHA256 = u.SHA256
		}
		return agents.AddSkill(config, add)
	})
	if err != nil {
		return s.refuseSkill(c, f, err)
	}
	msg := "Skill " + sk.Name + " was added."
	if upload != nil {
		msg = "Skill " + sk.Name + " was uploaded and added, pinned to its SHA-256."
	}
	s.setFlash(c, msg)
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/agents/"+itoa(a.ID)+"#skills")
}

// fileError puts an upload's refusal beside the form's file field.
func fileError(err error) error {
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return err
	}
	var ae *apperr.Error
	if errors.As(err, &ae) {
		v := apperr.Validation()
		v.Add("file", "%s", ae.Message)
		return v.Err()
	}
	return err
}

// refuseSkill shows the agent page again with the form as sent and why
// it was refused; any other error is the error page's.
func (s *Server) refuseSkill(c echo.Context, f views.SkillForm, err error) error {
	fields, status, ok := formFailure(err)
	if !ok {
		return err
	}
	cur, gerr := s.agentFromPath(c)
	if gerr != nil {
		return gerr
	}
	f.Errors = fields
	return s.renderAgentPage(c, status, cur, agentPageState{skill: &f})
}

// pageRemoveSkill removes a skill from the agent's configuration; its
// uploaded bundle, if any, stays.
func (s *Server) pageRemoveSkill(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	a, err := s.agentService(c).Manageable(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	back := "/o/" + tenantOf(c).Org.Slug + "/agents/" + itoa(a.ID) + "#skills"
	name := c.FormValue("name")
	_, err = s.changeSkills(c, nil, func(config string, _ *agents.Upload) (string, error) {
		return agents.RemoveSkill(config, name)
	})
	if fields, _, ok := formFailure(err); ok {
		s.setFlash(c, "The skill was not removed: "+fieldMessages(fields))
		return c.Redirect(http.StatusSeeOther, back)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Skill "+name+" was removed.")
	return c.Redirect(http.StatusSeeOther, back)
}
