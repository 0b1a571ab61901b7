package handlers

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/views"
)

// formText returns a pointer to a submitted field, nil when absent.
func formText(c echo.Context, name string) *string {
	if _, ok := c.Request().PostForm[name]; !ok {
		if err := c.Request().ParseForm(); err != nil {
			return nil
		}
		if _, ok := c.Request().PostForm[name]; !ok {
			return nil
		}
	}
	v := c.FormValue(name)
	return &v
}

// formSecret is nil when the field was left empty: on edit forms an empty
// secret field means "keep the stored one".
func formSecret(c echo.Context, name string) *string {
	v := c.FormValue(name)
	if v == "" {
		return nil
	}
	return &v
}

func formInt(c echo.Context, name string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(c.FormValue(name)))
	return n
}

func formInt64(c echo.Context, name string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(c.FormValue(name)), 10, 64)
	return n
}

func (s *Server) deptOptions(c echo.Context) []views.Option {
	ds, err := s.visibleDepartments(c)
	if err != nil {
		return nil
	}
	out := make([]views.Option, len(ds))
	for i, d := range ds {
		out[i] = views.Option{Value: itoa(d.ID), Label: d.Name}
	}
	return out
}

// scopeLabel says who an environment or agent belongs to.
func (s *Server) scopeLabel(c echo.Context, dept *int64, owner *int64) string {
	label := "whole organization"
	if dept != nil {
		label = s.domainLabel(c.Request().Context(), tenantOf(c), rbac.DeptDomain(*dept))
	}
	if owner != nil {
		who := "user #" + itoa(*owner)
		if u, err := tenantOf(c).Dir.GetUser(c.Request().Context(), *owner); err == nil {
			who = u.Email
		}
		if dept != nil {
			return "private to " + who + ", shared with " + label
		}
		return "private to " + who
	}
	return label
}

func (s *Server) envRow(c echo.Context, e envs.Environment) (views.EnvRow, error) {
	var dept int64
	if e.DepartmentID != nil {
		dept = *e.DepartmentID
	}
	canManage, err := s.envService(c).CanManage(c.Request().Context(), actorOf(c), e)
	if err != nil {
		return views.EnvRow{}, err
	}
	return views.EnvRow{ID: e.ID, Name: e.Name, Kind: e.Kind, Scope: s.scopeLabel(c, e.DepartmentID, e.OwnerUserID), URL: e.URL, OS: e.OS,
		Deployment: e.Deployment, WorkspaceRoot: e.WorkspaceRoot, SandboxDomain: e.SandboxDomain, SandboxScheme: e.SandboxScheme,
		ProxyBaseURL: e.ProxyBaseURL, WorkspaceMount: e.WorkspaceMount, WorkspaceMountPath: e.WorkspaceMountPath,
		APIKeySet: e.HasAPIKey(), AgentdTokenSet: e.HasAgentdToken(), Health: e.HealthStatus,
		HealthError: e.HealthError, CheckedAt: e.HealthCheckedAt, LatencyMS: e.HealthLatencyMS, Version: e.AgentdVersion,
		ActiveSessions: e.ActiveSessions, ExecReporting: e.ExecReporting, ExecReportingReason: e.ExecReportingReason, CreatedBy: e.CreatedBy, CanManage: canManage, DepartmentID: dept}, nil
}

func (s *Server) renderEnvs(c echo.Context, status int, form views.EnvForm) error {
	return s.renderEnvsWith(c, status, form, "")
}

// renderEnvsWith is renderEnvs saying why the local sandbox backend was
// not registered (localErr).
func (s *Server) renderEnvsWith(c echo.Context, status int, form views.EnvForm, localErr string) error {
	svc, a := s.envService(c), actorOf(c)
	list, err := svc.List(c.Request().Context(), a)
	if err != nil {
		return err
	}
	rows := make([]views.EnvRow, len(list))
	for i, e := range list {
		if rows[i], err = s.envRow(c, e); err != nil {
			return err
		}
	}
	form.Departments = s.deptOptions(c)
	if form.CanShared, err = svc.CanCreateShared(c.Request().Context(), a); err != nil {
		return err
	}
	rows, ls := sortPage(c, rows, sortKeys[views.EnvRow]{
		"name": byText(func(e views.EnvRow) string { return e.Name }), "kind": byText(func(e views.EnvRow) string { return e.Kind }),
		"scope": byText(func(e views.EnvRow) string { return e.Scope }), "health": byText(func(e views.EnvRow) string { return e.Health }),
		"checked": func(a, b views.EnvRow) int { return cmpTime(a.CheckedAt, b.CheckedAt) },
	}, "name", nil)
	local, err := s.localOffer(c, list, localErr)
	if err != nil {
		return err
	}
	return render(c, status, views.Envs(s.orgPage(c, "Environments"), views.EnvsData{Slug: tenantOf(c).Org.Slug, Rows: rows, Form: form, List: ls,
		Local: local}))
}

func (s *Server) pageEnvs(c echo.Context) error {
	return s.renderEnvs(c, http.StatusOK, views.EnvForm{})
}

func envRequestFromForm(c echo.Context, creating bool) envRequest {
	req := envRequest{Name: formText(c, "name"), URL: formText(c, "url"), OS: formText(c, "os"), Deployment: formText(c, "deployment"),
		WorkspaceRoot: formText(c, "workspace_root"), SandboxDomain: formText(c, "sandbox_domain"), SandboxScheme: formText(c, "sandbox_scheme"),
		ProxyBaseURL: formText(c, "proxy_base_url"), WorkspaceMount: formText(c, "workspace_mount"),
		WorkspaceMountPath: formText(c, "workspace_mount_path"), APIKey: formSecret(c, "api_key"), AgentdToken: formSecret(c, "agentd_token")}
	dept := formInt64(c, "department_id")
	req.DepartmentID = &dept
	if creating {
		req.Kind = c.FormValue("kind")
		req.Private = c.FormValue("private") == "true"
	}
	return req
}

func envFormFrom(req envRequest) views.EnvForm {
	f := views.EnvForm{Kind: req.Kind, Name: deref(req.Name), URL: deref(req.URL), OS: deref(req.OS), Deployment: deref(req.Deployment),
		WorkspaceRoot: deref(req.WorkspaceRoot), SandboxDomain: deref(req.SandboxDomain), SandboxScheme: deref(req.SandboxScheme),
		ProxyBaseURL: deref(req.ProxyBaseURL), WorkspaceMount: deref(req.WorkspaceMount), WorkspaceMountPath: deref(req.WorkspaceMountPath),
		Private: req.Private}
	if req.DepartmentID != nil {
		f.DepartmentID = *req.DepartmentID
	}
	return f
}

// formFailure says whether a failed form is shown again with inline errors
// (input problems, refusals, conflicts), and with which status; other
// errors go to the error handler.
func formFailure(err error) (map[string]string, int, bool) {
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return ve.Fields, http.StatusBadRequest, true
	}
	var ae *apperr.Error
	if errors.As(err, &ae) && (errors.Is(err, apperr.ErrForbidden) || errors.Is(err, apperr.ErrConflict) || errors.Is(err, apperr.ErrInvalid)) {
		status, _ := classify(err)
		return map[string]string{"form": ae.Message}, status, true
	}
	return nil, 0, false
}

func (s *Server) pageCreateEnv(c echo.Context) error {
	req := envRequestFromForm(c, true)
	generated := generateAgentdToken(&req)
	e, err := s.createEnv(c, req)
	if fields, status, ok := formFailure(err); ok {
		f := envFormFrom(req)
		f.Errors = fields
		return s.renderEnvs(c, status, f)
	}
	if err != nil {
		return err
	}
	if generated != "" {
		return s.envCreatedWithToken(c, e, generated)
	}
	s.setFlash(c, "Environment "+e.Name+" was added. Use Test connection to check it now.")
	return c.Redirect(http.StatusSeeOther, envPagePath(c, e.ID))
}

func (s *Server) renderEnv(c echo.Context, status int, e envs.Environment, form *views.EnvForm, tplErrs map[string]string) error {
	ctx := c.Request().Context()
	svc, a := s.envService(c), actorOf(c)
	row, err := s.envRow(c, e)
	if err != nil {
		return err
	}
	d := views.EnvDetailData{Slug: tenantOf(c).Org.Slug, Env: row, TemplateErrors: tplErrs, Connect: s.hostConnect(c, e, row)}
	if form != nil {
		d.Form = *form
	} else {
		d.Form = views.EnvForm{Kind: e.Kind, Name: e.Name, DepartmentID: row.DepartmentID, URL: e.URL, OS: e.OS, Deployment: e.Deployment,
			WorkspaceRoot: e.WorkspaceRoot, SandboxDomain: e.SandboxDomain, SandboxScheme: e.SandboxScheme, ProxyBaseURL: e.ProxyBaseURL,
			WorkspaceMount: e.WorkspaceMount, WorkspaceMountPath: e.WorkspaceMountPath}
	}
	d.Form.Departments = s.deptOptions(c)
	if d.NextAgent, err = s.nextAgentStep(c, e); err != nil {
		return err
	}
	if e.Kind == envs.KindSandbox {
		ts, err := svc.Templates(ctx, a, e.ID)
		if err != nil {
			return err
		}
		for _, t := range ts {
			d.Templates = append(d.Templates, views.TemplateRow{ID: t.ID, BackendTemplateID: t.BackendTemplateID, Name: t.Name, Image: t.Image,
				VCPU: t.VCPU, MemoryMB: t.MemoryMB, WritableLayerMB: t.WritableLayerMB, EnvdPort: t.EnvdPort, AgentdPort: t.AgentdPort,
				ProbePort: t.ProbePort, Status: t.BackendStatus})
		}
		if row.CanManage {
			bts, err := svc.BackendTemplates(ctx, a, e.ID)
			if err != nil {
				_, body := classify(err)
				d.BackendError = body.Message
			}
			for _, t := range bts {
				label := t.ID
				if len(t.Aliases) > 0 {
					label = strings.Join(t.Aliases, ", ") + " (" + t.ID + ")"
				}
				label += " — " + strconv.Itoa(t.CPU) + " vCPU, " + strconv.Itoa(t.MemoryMB) + " MiB, " + t.BuildStatus
				d.BackendTemplates = append(d.BackendTemplates, views.Option{Value: t.ID, Label: label})
			}
		}
	}
	return render(c, status, views.EnvDetail(s.orgPage(c, e.Name), d))
}

// nextAgentStep reports whether the environment's page leads on to the
// agents page: the viewer may configure agents and no agent they see runs
// in e yet, so an environment just added is not a dead end.
func (s *Server) nextAgentStep(c echo.Context, e envs.Environment) (bool, error) {
	svc, ctx := s.agentService(c), c.Request().Context()
	if ok, err := svc.CanCreate(ctx, actorOf(c)); err != nil || !ok {
		return false, err
	}
	as, err := svc.List(ctx, actorOf(c))
	if err != nil {
		return false, err
	}
	for _, a := range as {
		if slices.Contains(a.EnvironmentIDs, e.ID) {
			return false, nil
		}
	}
	return true, nil
}

func (s *Server) pageEnv(c echo.Context) error {
	e, err := s.envFromPath(c, false)
	if err != nil {
		return err
	}
	return s.renderEnv(c, http.StatusOK, e, nil, nil)
}

func (s *Server) pageUpdateEnv(c echo.Context) error {
	req := envRequestFromForm(c, false)
	e, err := s.updateEnv(c, req)
	if fields, status, ok := formFailure(err); ok {
		cur, gerr := s.envFromPath(c, false)
		if gerr != nil {
			return gerr
		}
		f := envFormFrom(req)
		f.Kind, f.Errors = cur.Kind, fields
		return s.renderEnv(c, status, cur, &f, nil)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Environment "+e.Name+" was saved.")
	return c.Redirect(http.StatusSeeOther, envPagePath(c, e.ID))
}

func (s *Server) pageTestEnv(c echo.Context) error {
	e, h, err := s.testEnv(c)
	if err != nil {
		return err
	}
	msg := connectionMessage(e, h)
	if wantsJSON(c) { // the page's script shows it in place
		return c.JSON(http.StatusOK, newEnvConnection(e, h, s.Now()))
	}
	s.setFlash(c, msg)
	return c.Redirect(http.StatusSeeOther, envPagePath(c, e.ID))
}

func (s *Server) pageDeleteEnv(c echo.Context) error {
	e, err := s.envFromPath(c, true)
	if err != nil {
		return err
	}
	if c.FormValue("confirm") != e.Name {
		s.setFlash(c, "Type the environment's name exactly to remove it.")
		return c.Redirect(http.StatusSeeOther, envPagePath(c, e.ID))
	}
	if _, err := s.deleteEnv(c); err != nil {
		return err
	}
	s.setFlash(c, "Environment "+e.Name+" was removed.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/environments")
}

func (s *Server) pageAddTemplate(c echo.Context) error {
	req := templateRequest{Import: c.FormValue("import") == "true", BackendTemplateID: c.FormValue("backend_template_id"), Name: c.FormValue("name"),
		Image: c.FormValue("image"), VCPU: formInt(c, "vcpu"), MemoryMB: formInt(c, "memory_mb"), WritableLayerMB: formInt(c, "writable_layer_mb")}
	t, err := s.addTemplate(c, req)
	if fields, status, ok := formFailure(err); ok {
		e, gerr := s.envFromPath(c, false)
		if gerr != nil {
			return gerr
		}
		return s.renderEnv(c, status, e, nil, fields)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Template registered.")
	return c.Redirect(http.StatusSeeOther, envPagePath(c, t.EnvironmentID))
}

func (s *Server) pageDeleteTemplate(c echo.Context) error {
	t, err := s.deleteTemplate(c)
	if err != nil {
		return err
	}
	s.setFlash(c, "Template "+t.Name+" was removed.")
	return c.Redirect(http.StatusSeeOther, envPagePath(c, t.EnvironmentID))
}
