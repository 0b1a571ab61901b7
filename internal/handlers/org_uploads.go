package handlers

import (
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/views"
)

// maxUploadBody is the body limit of the upload routes: one bundle or file
// at agents.MaxUploadBytes, plus room for a form's other fields.
const maxUploadBody = agents.MaxUploadBytes + 1<<20

// isUploadRoute reports the routes whose bodies may be as large as an
// upload (the route pattern, as echo matched it): the uploads form and
// the agent page's "Add a skill" form, which may carry a bundle.
func isUploadRoute(route string) bool {
	return strings.HasSuffix(route, "/agents/:id/uploads") || strings.HasSuffix(route, "/agents/:id/skills")
}

type uploadJSON struct {
	Kind      string    `json:"kind"`
	Name      string    `json:"name"`
	Format    string    `json:"format,omitempty"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
	CreatedBy string    `json:"created_by"`
	UpdatedAt time.Time `json:"updated_at"`
}

func toUploadJSON(u agents.Upload) uploadJSON {
	return uploadJSON{Kind: u.Kind, Name: u.Name, Format: u.Format, Size: u.Size, SHA256: u.SHA256, CreatedBy: u.CreatedBy, UpdatedAt: u.UpdatedAt.UTC()}
}

// uploadAudit is what the audit log keeps of an upload: never its bytes.
func uploadAudit(u *agents.Upload) map[string]any {
	if u == nil {
		return nil
	}
	return map[string]any{"kind": u.Kind, "name": u.Name, "format": u.Format, "size": u.Size, "sha256": u.SHA256}
}

func (s *Server) apiListUploads(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	list, err := s.agentService(c).Uploads(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	out := make([]uploadJSON, len(list))
	for i, u := range list {
		out[i] = toUploadJSON(u)
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out, "max_bytes": agents.MaxUploadBytes})
}

// readUpload reads an upload from a multipart form (fields kind, name and
// file) or, for API clients, a raw body with kind, name and filename in
// the query string.
func readUpload(c echo.Context) (agents.UploadInput, error) {
	r := c.Request()
	in := agents.UploadInput{By: principalOf(c).AuditActor().Name}
	if strings.HasPrefix(r.Header.Get(echo.HeaderContentType), echo.MIMEMultipartForm) {
		if err := r.ParseMultipartForm(8 << 20); err != nil {
			return in, uploadReadError(err)
		}
		in.Kind, in.Name = r.FormValue("kind"), r.FormValue("name")
		f, h, err := r.FormFile("file")
		if err != nil {
			return in, apperr.New(apperr.ErrInvalid, "upload_missing", "Choose a file to upload (form field \"file\").")
		}
		defer func() { _ = f.Close() }()
		if in.Body, err = readAll(f, h); err != nil {
			return in, err
		}
		in.FileName = h.Filename
		if in.Name == "" && in.Kind == agents.UploadFile {
			in.Name = h.Filename
		}
		return in, nil
	}
	q := c.QueryParams()
	in.Kind, in.Name, in.FileName = q.Get("kind"), q.Get("name"), q.Get("filename")
	if in.FileName == "" {
		in.FileName = in.Name
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, agents.MaxUploadBytes+1))
	if err != nil {
		return in, uploadReadError(err)
	}
	in.Body = body
	return in, nil
}

func readAll(f multipart.File, h *multipart.FileHeader) ([]byte, error) {
	if h.Size > agents.MaxUploadBytes {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(io.LimitReader(f, agents.MaxUploadBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read the uploaded file: %w", err)
	}
	return b, nil
}

func tooLarge() error {
	return apperr.New(apperr.ErrInvalid, "upload_too_large", "The upload is larger than the 50 MiB limit per bundle or file.")
}

// uploadReadError says what went wrong reading an upload's body.
func uploadReadError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge()
	}
	return apperr.New(apperr.ErrInvalid, "upload_unreadable", "The upload could not be read: %v.", err)
}

// putUpload stores an upload with its audit record (name, size, hash;
// never contents) in one transaction.
func (s *Server) putUpload(c echo.Context, in agents.UploadInput) (agents.Upload, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return agents.Upload{}, err
	}
	var out agents.Upload
	err = s.mutate(c, func(m *orgTx) error {
		ag, err := m.Agents().Manageable(c.Request().Context(), m.Actor(), id)
		if err != nil {
			return err
		}
		before, after, err := m.Agents().PutUpload(c.Request().Context(), m.Actor(), id, in)
		if err != nil {
			return err
		}
		out = after
		action := "agent.upload"
		if before != nil {
			action = "agent.upload_replace"
		}
		return m.audit(action, agentTarget(ag), map[string]any{"before": uploadAudit(before), "after": uploadAudit(&after)})
	})
	return out, err
}

func (s *Server) removeUpload(c echo.Context, kind, name string) (agents.Upload, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return agents.Upload{}, err
	}
	var out agents.Upload
	err = s.mutate(c, func(m *orgTx) error {
		ag, err := m.Agents().Manageable(c.Request().Context(), m.Actor(), id)
		if err != nil {
			return err
		}
		if out, err = m.Agents().RemoveUpload(c.Request().Context(), m.Actor(), id, kind, name); err != nil {
			return err
		}
		return m.audit("agent.upload_remove", agentTarget(ag), map[string]any{"before": uploadAudit(&out)})
	})
	return out, err
}

// apiPutUpload stores (or replaces) a skill bundle or file of the agent.
func (s *Server) apiPutUpload(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	// Who may not change the agent learns nothing from the body's rules.
	if _, err := s.agentService(c).Manageable(c.Request().Context(), actorOf(c), id); err != nil {
		return err
	}
	in, err := readUpload(c)
	if err != nil {
		return err
	}
	u, err := s.putUpload(c, in)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toUploadJSON(u))
}

func (s *Server) apiDeleteUpload(c echo.Context) error {
	kind, name := c.QueryParam("kind"), c.QueryParam("name")
	if kind == "" || name == "" {
		id, err := idParam(c, "id")
		if err != nil {
			return err
		}
		if _, err := s.agentService(c).Manageable(c.Request().Context(), actorOf(c), id); err != nil {
			return err
		}
		v := apperr.Validation()
		v.Add("name", "Say which upload to remove: kind (skill or file) and name in the query.")
		return v.Err()
	}
	if _, err := s.removeUpload(c, kind, name); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Agent page: uploads.

func (s *Server) agentUploads(c echo.Context, a agents.Agent) ([]views.UploadRow, error) {
	list, err := s.agentService(c).Uploads(c.Request().Context(), actorOf(c), a.ID)
	if err != nil {
		return nil, err
	}
	rows := make([]views.UploadRow, len(list))
	for i, u := range list {
		rows[i] = views.UploadRow{Kind: u.Kind, Name: u.Name, Format: u.Format, Size: u.Size, SHA256: u.SHA256, By: u.CreatedBy, Updated: views.When(u.UpdatedAt)}
	}
	return rows, nil
}

func (s *Server) pagePutUpload(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	back := "/o/" + tenantOf(c).Org.Slug + "/agents/" + itoa(id)
	if _, err := s.agentService(c).Manageable(c.Request().Context(), actorOf(c), id); err != nil {
		return err
	}
	in, err := readUpload(c)
	if err == nil {
		var u agents.Upload
		if u, err = s.putUpload(c, in); err == nil {
			s.setFlash(c, fmt.Sprintf("Uploaded %s %s (%d bytes, sha256 %s).", u.Kind, u.Name, u.Size, u.SHA256))
			return c.Redirect(http.StatusSeeOther, back)
		}
	}
	if fields, _, ok := formFailure(err); ok {
		s.setFlash(c, "The upload was refused: "+fieldMessages(fields))
		return c.Redirect(http.StatusSeeOther, back)
	}
	var ae *apperr.Error
	if errors.As(err, &ae) && errors.Is(err, apperr.ErrInvalid) {
		s.setFlash(c, "The upload was refused: "+ae.Message)
		return c.Redirect(http.StatusSeeOther, back)
	}
	return err
}

func (s *Server) pageRemoveUpload(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	back := "/o/" + tenantOf(c).Org.Slug + "/agents/" + itoa(id)
	kind, name := c.FormValue("kind"), c.FormValue("name")
	if name == "" || c.FormValue("confirm") != name {
		if _, err := s.agentService(c).Manageable(c.Request().Context(), actorOf(c), id); err != nil {
			return err
		}
		s.setFlash(c, "Type the name exactly to remove it.")
		return c.Redirect(http.StatusSeeOther, back)
	}
	u, err := s.removeUpload(c, kind, name)
	if err != nil {
		return err
	}
	s.setFlash(c, "Removed "+u.Kind+" "+u.Name+".")
	return c.Redirect(http.StatusSeeOther, back)
}
