package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/views"
)

func (s *Server) agentService(c echo.Context) *agents.Service {
	return &agents.Service{DB: tenantOf(c).DB, Envs: s.envService(c)}
}

// agentFromPath reads the :id agent as the request's actor may see it.
func (s *Server) agentFromPath(c echo.Context) (agents.Agent, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return agents.Agent{}, err
	}
	return s.agentService(c).Get(c.Request().Context(), actorOf(c), id)
}

type agentJSON struct {
	ID                   int64           `json:"id"`
	DepartmentID         *int64          `json:"department_id"`
	Name                 string          `json:"name"`
	Description          string          `json:"description"`
	Config               json.RawMessage `json:"config"`
	SandboxMode          string          `json:"sandbox_mode"`
	TemplateID           *int64          `json:"template_id"`
	EnvironmentIDs       []int64         `json:"environment_ids"`
	DefaultEnvironmentID int64           `json:"default_environment_id"`
	IdleTimeoutSeconds   int             `json:"idle_timeout_seconds"`
	ReclaimAfterSeconds  int             `json:"reclaim_after_seconds"`
	// CommandPolicy (legacy) is the patterns of ExecPolicy's text deny
	// rules.
	CommandPolicy     []string    `json:"command_policy"`
	ExecPolicy        policy.Exec `json:"exec_policy"`
	ExecPolicyVersion string      `json:"exec_policy_version"`
	CreatedBy         string      `json:"created_by"`
	CreatedAt         time.Time   `json:"created_at"`
	UpdatedAt         time.Time   `json:"updated_at"`
}

func toAgentJSON(a agents.Agent) agentJSON {
	ids := a.EnvironmentIDs
	if ids == nil {
		ids = []int64{}
	}
	// A damaged stored policy shows as read (the gateway runs nothing
	// with it): the agent can still be read and mended.
	p, _ := a.Exec()
	if p.Rules == nil {
		p.Rules = []policy.ExecRule{}
	}
	return agentJSON{ID: a.ID, DepartmentID: a.DepartmentID, Name: a.Name, Description: a.Description, Config: json.RawMessage(a.Config),
		SandboxMode: a.SandboxMode, TemplateID: a.TemplateID, EnvironmentIDs: ids, DefaultEnvironmentID: a.DefaultEnvironmentID,
		IdleTimeoutSeconds: a.IdleTimeoutSeconds, ReclaimAfterSeconds: a.ReclaimAfterSeconds, CommandPolicy: agents.TextPatterns(p),
		ExecPolicy: p, ExecPolicyVersion: a.ExecVersion(),
		CreatedBy: a.CreatedBy, CreatedAt: a.CreatedAt.UTC(), UpdatedAt: a.UpdatedAt.UTC()}
}

func agentTarget(a agents.Agent) audit.Target { return agents.Target(a) }

func (s *Server) apiListAgents(c echo.Context) error {
	list, err := s.agentService(c).List(c.Request().Context(), actorOf(c))
	if err != nil {
		return err
	}
	out := make([]agentJSON, len(list))
	for i, a := range list {
		out[i] = toAgentJSON(a)
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out})
}

type agentRequest struct {
	DepartmentID         *int64          `json:"department_id"`
	Name                 *string         `json:"name"`
	Description          *string         `json:"description"`
	Config               json.RawMessage `json:"config"`
	SandboxMode          *string         `json:"sandbox_mode"`
	TemplateID           *int64          `json:"template_id"`
	EnvironmentIDs       []int64         `json:"environment_ids"`
	DefaultEnvironmentID *int64          `json:"default_environment_id"`
	IdleTimeoutSeconds   *int            `json:"idle_timeout_seconds"`
	ReclaimAfterSeconds  *int            `json:"reclaim_after_seconds"`
	CommandPolicy        []string        `json:"command_policy"`
	ExecPolicy           json.RawMessage `json:"exec_policy"`
}

func (r agentRequest) input() agents.Input {
	in := agents.Input{DepartmentID: r.DepartmentID, Name: r.Name, Description: r.Description, SandboxMode: r.SandboxMode,
		TemplateID: r.TemplateID, EnvironmentIDs: r.EnvironmentIDs, DefaultEnvironmentID: r.DefaultEnvironmentID, CommandPolicy: r.CommandPolicy}
	if len(r.Config) > 0 {
		cfg := string(r.Config)
		in.Config = &cfg
	}
	if len(r.ExecPolicy) > 0 && string(r.ExecPolicy) != "null" {
		raw := string(r.ExecPolicy)
		in.ExecPolicy = &raw
	}
	if r.IdleTimeoutSeconds != nil {
		d := time.Duration(*r.IdleTimeoutSeconds) * time.Second
		in.IdleTimeout = &d
	}
	if r.ReclaimAfterSeconds != nil {
		d := time.Duration(*r.ReclaimAfterSeconds) * time.Second
		in.ReclaimAfter = &d
	}
	return in
}

func (s *Server) createAgent(c echo.Context, req agentRequest) (agents.Agent, error) {
	var a agents.Agent
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if a, err = m.Agents().Create(c.Request().Context(), m.Actor(), req.input()); err != nil {
			return err
		}
		return m.audit("agent.create", agentTarget(a), map[string]any{"after": toAgentJSON(a)})
	})
	return a, err
}

func (s *Server) apiCreateAgent(c echo.Context) error {
	return jsonCall(c, http.StatusCreated, func(req agentRequest) (agentJSON, error) {
		a, err := s.createAgent(c, req)
		return toAgentJSON(a), err
	})
}

func (s *Server) apiGetAgent(c echo.Context) error {
	a, err := s.agentFromPath(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toAgentJSON(a))
}

func (s *Server) updateAgent(c echo.Context, req agentRequest) (agents.Agent, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return agents.Agent{}, err
	}
	var after agents.Agent
	err = s.mutate(c, func(m *orgTx) error {
		after, err = m.updateAgent(c.Request().Context(), id, req.input())
		return err
	})
	return after, err
}

// updateAgent changes agent id inside the transaction and audits it as
// agent.update with the agent before and after.
func (m *orgTx) updateAgent(ctx context.Context, id int64, in agents.Input) (agents.Agent, error) {
	before, after, err := m.Agents().Update(ctx, m.Actor(), id, in)
	if err != nil {
		return after, err
	}
	return after, m.audit("agent.update", agentTarget(after), map[string]any{"before": toAgentJSON(before), "after": toAgentJSON(after)})
}

func (s *Server) apiUpdateAgent(c echo.Context) error {
	return jsonCall(c, http.StatusOK, func(req agentRequest) (agentJSON, error) {
		a, err := s.updateAgent(c, req)
		return toAgentJSON(a), err
	})
}

func (s *Server) deleteAgent(c echo.Context) (agents.Agent, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return agents.Agent{}, err
	}
	var a agents.Agent
	return a, s.mutate(c, func(m *orgTx) error {
		var err error
		if a, err = m.Agents().Delete(c.Request().Context(), m.Actor(), id); err != nil {
			return err
		}
		return m.audit("agent.delete", agentTarget(a), map[string]any{"before": toAgentJSON(a)})
	})
}

func (s *Server) apiDeleteAgent(c echo.Context) error {
	if _, err := s.deleteAgent(c); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Agent pages.

func (s *Server) agentForm(c echo.Context, a agents.Agent) (views.AgentForm, error) {
	f := views.AgentForm{Name: a.Name, Description: a.Description, Config: a.Config, SandboxMode: a.SandboxMode,
		IdleMinutes: a.IdleTimeoutSeconds / 60, ReclaimMins: a.ReclaimAfterSeconds / 60}
	p, err := a.Exec()
	if err != nil {
		p = policy.DefaultExec()
	}
	f.Exec = execPolicyForm(p)
	if a.DepartmentID != nil {
		f.DepartmentID = *a.DepartmentID
	}
	if a.TemplateID != nil {
		f.TemplateID = *a.TemplateID
	}
	if f.IdleMinutes == 0 {
		f.IdleMinutes = int(agents.DefaultIdleTimeout.Minutes())
	}
	if f.ReclaimMins == 0 {
		f.ReclaimMins = int(agents.DefaultReclaimAfter.Minutes())
	}
	if f.Config == "" {
		f.Config = `{"model": ""}`
	}
	return f, s.fillAgentChoices(c, &f, a.EnvironmentIDs, a.DefaultEnvironmentID)
}

// fillAgentChoices offers the environments the actor may attach and their
// templates.
func (s *Server) fillAgentChoices(c echo.Context, f *views.AgentForm, checked []int64, def int64) error {
	ctx, a, svc := c.Request().Context(), actorOf(c), s.envService(c)
	f.Slug = tenantOf(c).Org.Slug
	if err := s.agentPlaces(c, f); err != nil {
		return err
	}
	list, err := svc.List(ctx, a)
	if err != nil {
		return err
	}
	var ready []int64
	defer func() {
		// With exactly one ready template there is nothing to choose:
		// "none" would only make a per-session agent's form fail.
		if f.TemplateID == 0 && len(ready) == 1 {
			f.TemplateID = ready[0]
		}
	}()
	for _, e := range list {
		if ok, err := svc.Usable(ctx, a, e); err != nil {
			return err
		} else if !ok {
			continue
		}
		f.Envs = append(f.Envs, views.EnvChoice{ID: e.ID, Label: e.Name + " (" + e.Kind + ")", Checked: slices.Contains(checked, e.ID), Default: e.ID == def, Sandbox: e.Kind == envs.KindSandbox})
		if e.Kind == envs.KindSandbox {
			ts, err := svc.Templates(ctx, a, e.ID)
			if err != nil {
				return err
			}
			for _, t := range ts {
				f.Templates = append(f.Templates, views.Option{Value: itoa(t.ID), Label: e.Name + " / " + t.Name + " (" + t.BackendStatus + ")"})
				if t.Ready() {
					ready = append(ready, t.ID)
				}
			}
		}
	}
	return nil
}

// agentPlaces offers only the places the actor may configure agents in,
// and preselects the narrowest: a department owner's form starts on their
// department, never on "whole organization", which the server would refuse.
func (s *Server) agentPlaces(c echo.Context, f *views.AgentForm) error {
	ctx, a := c.Request().Context(), actorOf(c)
	var err error
	if f.CanOrgWide, err = a.Allowed(ctx, rbac.DomainOrg, "agents", "create"); err != nil {
		return err
	}
	f.Departments = nil
	for _, o := range s.deptOptions(c) {
		id, err := parseID(o.Value)
		if err != nil {
			continue
		}
		ok, err := a.Allowed(ctx, rbac.DeptDomain(id), "agents", "create")
		if err != nil {
			return err
		}
		if ok || id == f.DepartmentID {
			f.Departments = append(f.Departments, o)
		}
	}
	if f.DepartmentID == 0 && !f.CanOrgWide && len(f.Departments) > 0 {
		f.DepartmentID, _ = parseID(f.Departments[0].Value)
	}
	return nil
}

// visibleEnvsByID maps the environments the actor may see by id, for
// naming them on agent pages without a lookup (and a refusal) per id.
func (s *Server) visibleEnvsByID(c echo.Context) (map[int64]envs.Environment, error) {
	list, err := s.envService(c).List(c.Request().Context(), actorOf(c))
	if err != nil {
		return nil, err
	}
	out := make(map[int64]envs.Environment, len(list))
	for _, e := range list {
		out[e.ID] = e
	}
	return out, nil
}

func agentRequestFromForm(c echo.Context) agentRequest {
	_ = c.Request().ParseForm()
	req := agentRequest{Name: formText(c, "name"), Description: formText(c, "description"), SandboxMode: formText(c, "sandbox_mode")}
	dept := formInt64(c, "department_id")
	req.DepartmentID = &dept
	tid := formInt64(c, "template_id")
	req.TemplateID = &tid
	def := formInt64(c, "default_environment_id")
	req.DefaultEnvironmentID = &def
	req.EnvironmentIDs = []int64{}
	for _, v := range c.Request().PostForm["environment_ids"] {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			req.EnvironmentIDs = append(req.EnvironmentIDs, n)
		}
	}
	if cfg := c.FormValue("config"); cfg != "" {
		if json.Valid([]byte(cfg)) {
			req.Config = json.RawMessage(cfg)
		} else {
			// Let the domain explain what is wrong with it.
			b, _ := json.Marshal(cfg)
			req.Config = b
		}
	}
	idle, reclaim := formInt(c, "idle_minutes")*60, formInt(c, "reclaim_minutes")*60
	req.IdleTimeoutSeconds, req.ReclaimAfterSeconds = &idle, &reclaim
	if p, _, ok := execPolicyFromForm(c); ok {
		req.ExecPolicy, _ = json.Marshal(p)
	} else if _, legacy := c.Request().PostForm["command_policy"]; legacy {
		req.CommandPolicy = []string{}
		for _, line := range strings.Split(c.FormValue("command_policy"), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				req.CommandPolicy = append(req.CommandPolicy, line)
			}
		}
	}
	return req
}

func agentFormFrom(c echo.Context, req agentRequest) views.AgentForm {
	f := views.AgentForm{Name: deref(req.Name), Description: deref(req.Description), Config: c.FormValue("config"), SandboxMode: deref(req.SandboxMode),
		IdleMinutes: formInt(c, "idle_minutes"), ReclaimMins: formInt(c, "reclaim_minutes")}
	if _, pf, ok := execPolicyFromForm(c); ok {
		f.Exec = pf
	} else {
		f.Exec = execPolicyForm(policy.DefaultExec())
	}
	if req.DepartmentID != nil {
		f.DepartmentID = *req.DepartmentID
	}
	if req.TemplateID != nil {
		f.TemplateID = *req.TemplateID
	}
	return f
}

func (s *Server) agentRows(c echo.Context) ([]views.AgentRow, error) {
	list, err := s.agentService(c).List(c.Request().Context(), actorOf(c))
	if err != nil {
		return nil, err
	}
	byID, err := s.visibleEnvsByID(c)
	if err != nil {
		return nil, err
	}
	rows := make([]views.AgentRow, len(list))
	for i, a := range list {
		cfg, _ := agents.ParseConfig(a.Config, apperr.Validation())
		def := "#" + itoa(a.DefaultEnvironmentID)
		if e, ok := byID[a.DefaultEnvironmentID]; ok {
			def = e.Name
		}
		rows[i] = views.AgentRow{ID: a.ID, Name: a.Name, Department: s.scopeLabel(c, a.DepartmentID, nil), SandboxMode: a.SandboxMode, Default: def, Model: cfg.Model}
	}
	return rows, nil
}

func (s *Server) renderAgents(c echo.Context, status int, form views.AgentForm) error {
	rows, err := s.agentRows(c)
	if err != nil {
		return err
	}
	canCreate, err := s.agentService(c).CanCreate(c.Request().Context(), actorOf(c))
	if err != nil {
		return err
	}
	rows, ls := sortPage(c, rows, sortKeys[views.AgentRow]{
		"name": byText(func(a views.AgentRow) string { return a.Name }), "department": byText(func(a views.AgentRow) string { return a.Department }),
		"model": byText(func(a views.AgentRow) string { return a.Model }), "sandbox": byText(func(a views.AgentRow) string { return a.SandboxMode }),
		"default": byText(func(a views.AgentRow) string { return a.Default }),
	}, "name", nil)
	return render(c, status, views.Agents(s.orgPage(c, "Agents"), views.AgentsData{Slug: tenantOf(c).Org.Slug, Rows: rows, Form: form, CanCreate: canCreate, List: ls}))
}

func (s *Server) pageAgents(c echo.Context) error {
	f, err := s.agentForm(c, agents.Agent{})
	if err != nil {
		return err
	}
	return s.renderAgents(c, http.StatusOK, f)
}

func (s *Server) pageCreateAgent(c echo.Context) error {
	req := agentRequestFromForm(c)
	a, err := s.createAgent(c, req)
	if fields, status, ok := formFailure(err); ok {
		f := agentFormFrom(c, req)
		if err := s.fillAgentChoices(c, &f, req.EnvironmentIDs, deref64(req.DefaultEnvironmentID)); err != nil {
			return err
		}
		f.Errors = fields
		f.Exec = withRuleErrors(f.Exec, fields)
		return s.renderAgents(c, status, f)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Agent "+a.Name+" was created.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/agents/"+itoa(a.ID))
}

func deref64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func (s *Server) renderAgent(c echo.Context, status int, a agents.Agent, form *views.AgentForm) error {
	return s.renderAgentPage(c, status, a, agentPageState{form: form})
}

// agentPageState is what a refused or answered form puts back on the
// agent's page: the edit form as sent, what the "try a command" box
// decided, the "Add a skill" form as sent. Nil parts show as new.
type agentPageState struct {
	form  *views.AgentForm
	try   *views.ExecTry
	skill *views.SkillForm
}

// renderAgentPage renders the agent's page with st's forms.
func (s *Server) renderAgentPage(c echo.Context, status int, a agents.Agent, st agentPageState) error {
	form, try := st.form, st.try
	ctx, actor := c.Request().Context(), actorOf(c)
	canManage, err := s.agentService(c).CanManage(ctx, actor, a)
	if err != nil {
		return err
	}
	byID, err := s.visibleEnvsByID(c)
	if err != nil {
		return err
	}
	cfg, _ := agents.ParseConfig(a.Config, apperr.Validation())
	d := views.AgentDetailData{Slug: tenantOf(c).Org.Slug, ID: a.ID, Name: a.Name, Description: a.Description,
		Department: s.scopeLabel(c, a.DepartmentID, nil), Model: cfg.Model, Config: a.Config, SandboxMode: a.SandboxMode,
		IdleMinutes: a.IdleTimeoutSeconds / 60, ReclaimMins: a.ReclaimAfterSeconds / 60, CanManage: canManage}
	if p, err := a.Exec(); err != nil {
		d.ExecDamaged = true
	} else {
		d.Exec = execPolicyForm(p)
		d.Exec.Rules = slices.DeleteFunc(d.Exec.Rules, func(r views.ExecRuleRow) bool { return r.Blank })
	}
	d.ExecVersion = a.ExecVersion()
	if try != nil {
		d.Try = *try
	}
	for _, id := range a.EnvironmentIDs {
		name := "#" + itoa(id)
		e, ok := byID[id]
		if ok {
			name = e.Name + " (" + e.Kind + ", " + e.HealthStatus + ")"
		}
		d.Environments = append(d.Environments, name)
		if id == a.DefaultEnvironmentID {
			d.Default = name
		}
		if !ok || e.Kind != envs.KindSandbox || a.TemplateID == nil {
			continue
		}
		ts, err := s.envService(c).Templates(ctx, actor, id)
		if err != nil {
			return err
		}
		for _, t := range ts {
			if t.ID == *a.TemplateID {
				d.Template = t.Name + " — " + strconv.Itoa(t.VCPU) + " vCPU, " + strconv.Itoa(t.MemoryMB) + " MiB RAM, " + strconv.Itoa(t.WritableLayerMB) + " MiB disk (" + t.BackendStatus + ")"
			}
		}
	}
	if form != nil {
		d.Form = *form
	} else if d.Form, err = s.agentForm(c, a); err != nil {
		return err
	}
	if d.Sessions, err = s.agentSessions(c, a, byID); err != nil {
		return err
	}
	d.Skills = views.AgentSkillsData{Slug: d.Slug, AgentID: a.ID, CanManage: canManage, Rows: agentSkills(a)}
	if st.skill != nil {
		d.Skills.Form = *st.skill
	}
	d.Uploads = views.AgentUploadsData{Slug: d.Slug, AgentID: a.ID, CanManage: canManage}
	if d.Uploads.Rows, err = s.agentUploads(c, a); err != nil {
		return err
	}
	return render(c, status, views.AgentDetail(s.orgPage(c, a.Name), d))
}

func (s *Server) pageAgent(c echo.Context) error {
	a, err := s.agentFromPath(c)
	if err != nil {
		return err
	}
	return s.renderAgent(c, http.StatusOK, a, nil)
}

func (s *Server) pageUpdateAgent(c echo.Context) error {
	req := agentRequestFromForm(c)
	a, err := s.updateAgent(c, req)
	if fields, status, ok := formFailure(err); ok {
		cur, gerr := s.agentFromPath(c)
		if gerr != nil {
			return gerr
		}
		f := agentFormFrom(c, req)
		if err := s.fillAgentChoices(c, &f, req.EnvironmentIDs, deref64(req.DefaultEnvironmentID)); err != nil {
			return err
		}
		f.Errors = fields
		f.Exec = withRuleErrors(f.Exec, fields)
		return s.renderAgent(c, status, cur, &f)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Agent "+a.Name+" was saved.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/agents/"+itoa(a.ID))
}

func (s *Server) pageDeleteAgent(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	a, err := s.agentService(c).Manageable(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	if c.FormValue("confirm") != a.Name {
		s.setFlash(c, "Type the agent's name exactly to delete it.")
		return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/agents/"+itoa(a.ID))
	}
	if _, err := s.deleteAgent(c); err != nil {
		return err
	}
	s.setFlash(c, "Agent "+a.Name+" was deleted.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/agents")
}
