package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
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

func (s *Server) envRow(c echo.Context, e envs.Environment) views.EnvRow {
	var dept int64
	if e.DepartmentID != nil {
		dept = *e.DepartmentID
	}
	return views.EnvRow{ID: e.ID, Name: e.Name, Kind: e.Kind, Scope: s.scopeLabel(c, e.DepartmentID, e.OwnerUserID), URL: e.URL, OS: e.OS,
		Deployment: e.Deployment, WorkspaceRoot: e.WorkspaceRoot, SandboxDomain: e.SandboxDomain, SandboxScheme: e.SandboxScheme,
		ProxyBaseURL: e.ProxyBaseURL, APIKeySet: e.HasAPIKey(), AgentdTokenSet: e.HasAgentdToken(), Health: e.HealthStatus,
		HealthError: e.HealthError, CheckedAt: e.HealthCheckedAt, LatencyMS: e.HealthLatencyMS, Version: e.AgentdVersion,
		ActiveSessions: e.ActiveSessions, CreatedBy: e.CreatedBy, CanManage: s.canManageEnv(c, e), DepartmentID: dept}
}

func (s *Server) renderEnvs(c echo.Context, status int, form views.EnvForm) error {
	list, err := s.visibleEnvs(c)
	if err != nil {
		return err
	}
	rows := make([]views.EnvRow, len(list))
	for i, e := range list {
		rows[i] = s.envRow(c, e)
	}
	form.Departments = s.deptOptions(c)
	form.CanShared = s.canCreateShared(c)
	return render(c, status, views.Envs(s.orgPage(c, "Environments"), views.EnvsData{Slug: tenantOf(c).Org.Slug, Rows: rows, Form: form}))
}

// canCreateShared reports whether the caller may add non-private
// environments anywhere.
func (s *Server) canCreateShared(c echo.Context) bool {
	ok, _ := tenantOf(c).Enforcer.AllowedAnywhere(c.Request().Context(), principalOf(c).Subject, "environments", "create")
	return ok
}

func (s *Server) pageEnvs(c echo.Context) error {
	return s.renderEnvs(c, http.StatusOK, views.EnvForm{})
}

func envRequestFromForm(c echo.Context, creating bool) envRequest {
	req := envRequest{Name: formText(c, "name"), URL: formText(c, "url"), OS: formText(c, "os"), Deployment: formText(c, "deployment"),
		WorkspaceRoot: formText(c, "workspace_root"), SandboxDomain: formText(c, "sandbox_domain"), SandboxScheme: formText(c, "sandbox_scheme"),
		ProxyBaseURL: formText(c, "proxy_base_url"), APIKey: formSecret(c, "api_key"), AgentdToken: formSecret(c, "agentd_token")}
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
		ProxyBaseURL: deref(req.ProxyBaseURL), Private: req.Private}
	if req.DepartmentID != nil {
		f.DepartmentID = *req.DepartmentID
	}
	return f
}

// formFailure re-renders a form with inline errors for input problems and
// returns other errors to the error handler.
func formFailure(err error) (map[string]string, bool) {
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return ve.Fields, true
	}
	var ae *apperr.Error
	if errors.As(err, &ae) && (errors.Is(err, apperr.ErrForbidden) || errors.Is(err, apperr.ErrConflict) || errors.Is(err, apperr.ErrInvalid)) {
		return map[string]string{"form": ae.Message}, true
	}
	return nil, false
}

func (s *Server) pageCreateEnv(c echo.Context) error {
	req := envRequestFromForm(c, true)
	e, err := s.createEnv(c, req)
	if fields, ok := formFailure(err); ok {
		f := envFormFrom(req)
		f.Errors = fields
		return s.renderEnvs(c, http.StatusBadRequest, f)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Environment "+e.Name+" was added. Use Test connection to check it now.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/environments/"+itoa(e.ID))
}

func (s *Server) renderEnv(c echo.Context, status int, e envs.Environment, form *views.EnvForm, tplErrs map[string]string) error {
	ctx := c.Request().Context()
	svc := s.envService(c)
	row := s.envRow(c, e)
	d := views.EnvDetailData{Slug: tenantOf(c).Org.Slug, Env: row, TemplateErrors: tplErrs}
	if form != nil {
		d.Form = *form
	} else {
		d.Form = views.EnvForm{Kind: e.Kind, Name: e.Name, DepartmentID: row.DepartmentID, URL: e.URL, OS: e.OS, Deployment: e.Deployment,
			WorkspaceRoot: e.WorkspaceRoot, SandboxDomain: e.SandboxDomain, SandboxScheme: e.SandboxScheme, ProxyBaseURL: e.ProxyBaseURL}
	}
	d.Form.Departments = s.deptOptions(c)
	if e.Kind == envs.KindSandbox {
		ts, err := svc.Templates(ctx, e.ID)
		if err != nil {
			return err
		}
		for _, t := range ts {
			d.Templates = append(d.Templates, views.TemplateRow{ID: t.ID, BackendTemplateID: t.BackendTemplateID, Name: t.Name, Image: t.Image,
				VCPU: t.VCPU, MemoryMB: t.MemoryMB, WritableLayerMB: t.WritableLayerMB, EnvdPort: t.EnvdPort, AgentdPort: t.AgentdPort,
				ProbePort: t.ProbePort, Status: t.BackendStatus})
		}
		if row.CanManage {
			bts, err := svc.BackendTemplates(ctx, e.ID)
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

func (s *Server) pageEnv(c echo.Context) error {
	e, err := s.visibleEnv(c, false)
	if err != nil {
		return err
	}
	return s.renderEnv(c, http.StatusOK, e, nil, nil)
}

func (s *Server) pageUpdateEnv(c echo.Context) error {
	req := envRequestFromForm(c, false)
	e, err := s.updateEnv(c, req)
	if fields, ok := formFailure(err); ok {
		cur, gerr := s.visibleEnv(c, false)
		if gerr != nil {
			return gerr
		}
		f := envFormFrom(req)
		f.Kind, f.Errors = cur.Kind, fields
		return s.renderEnv(c, http.StatusBadRequest, cur, &f, nil)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Environment "+e.Name+" was saved.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/environments/"+itoa(e.ID))
}

func (s *Server) pageTestEnv(c echo.Context) error {
	e, h, err := s.testEnv(c)
	if err != nil {
		return err
	}
	msg := "Connection OK: " + h.Status + "."
	if h.Error != "" {
		msg = "Connection " + h.Status + ": " + h.Error
	}
	s.setFlash(c, msg)
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/environments/"+itoa(e.ID))
}

func (s *Server) pageDeleteEnv(c echo.Context) error {
	e, err := s.visibleEnv(c, true)
	if err != nil {
		return err
	}
	if c.FormValue("confirm") != e.Name {
		s.setFlash(c, "Type the environment's name exactly to remove it.")
		return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/environments/"+itoa(e.ID))
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
	_, err := s.addTemplate(c, req)
	if fields, ok := formFailure(err); ok {
		e, gerr := s.visibleEnv(c, false)
		if gerr != nil {
			return gerr
		}
		return s.renderEnv(c, http.StatusBadRequest, e, nil, fields)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Template registered.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/environments/"+c.Param("id"))
}

func (s *Server) pageDeleteTemplate(c echo.Context) error {
	t, err := s.deleteTemplate(c)
	if err != nil {
		return err
	}
	s.setFlash(c, "Template "+t.Name+" was removed.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/environments/"+c.Param("id"))
}

// Agent pages.

func (s *Server) agentForm(c echo.Context, a agents.Agent) views.AgentForm {
	f := views.AgentForm{Name: a.Name, Description: a.Description, Config: a.Config, SandboxMode: a.SandboxMode,
		IdleMinutes: a.IdleTimeoutSeconds / 60, ReclaimMins: a.ReclaimAfterSeconds / 60, Policy: strings.Join(a.Policy(), "\n")}
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
	s.fillAgentChoices(c, &f, a.EnvironmentIDs, a.DefaultEnvironmentID)
	return f
}

func (s *Server) fillAgentChoices(c echo.Context, f *views.AgentForm, checked []int64, def int64) {
	f.Departments = s.deptOptions(c)
	list, _ := s.visibleEnvs(c)
	use := s.canUseEnvFor(c)
	svc := s.envService(c)
	for _, e := range list {
		if !use(e) {
			continue
		}
		f.Envs = append(f.Envs, views.EnvChoice{ID: e.ID, Label: e.Name + " (" + e.Kind + ")", Checked: containsID(checked, e.ID), Default: e.ID == def})
		if e.Kind == envs.KindSandbox {
			ts, _ := svc.Templates(c.Request().Context(), e.ID)
			for _, t := range ts {
				f.Templates = append(f.Templates, views.Option{Value: itoa(t.ID), Label: e.Name + " / " + t.Name + " (" + t.BackendStatus + ")"})
			}
		}
	}
}

func containsID(xs []int64, x int64) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
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
	req.CommandPolicy = []string{}
	for _, line := range strings.Split(c.FormValue("command_policy"), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			req.CommandPolicy = append(req.CommandPolicy, line)
		}
	}
	return req
}

func agentFormFrom(c echo.Context, req agentRequest) views.AgentForm {
	f := views.AgentForm{Name: deref(req.Name), Description: deref(req.Description), Config: c.FormValue("config"), SandboxMode: deref(req.SandboxMode),
		IdleMinutes: formInt(c, "idle_minutes"), ReclaimMins: formInt(c, "reclaim_minutes"), Policy: c.FormValue("command_policy")}
	if req.DepartmentID != nil {
		f.DepartmentID = *req.DepartmentID
	}
	if req.TemplateID != nil {
		f.TemplateID = *req.TemplateID
	}
	return f
}

func (s *Server) agentRows(c echo.Context) ([]views.AgentRow, error) {
	list, err := s.visibleAgents(c)
	if err != nil {
		return nil, err
	}
	svc := s.envService(c)
	rows := make([]views.AgentRow, len(list))
	for i, a := range list {
		cfg, _ := agents.ParseConfig(a.Config, apperr.Validation())
		def := "#" + itoa(a.DefaultEnvironmentID)
		if e, err := svc.Get(c.Request().Context(), a.DefaultEnvironmentID); err == nil {
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
	canCreate, _ := tenantOf(c).Enforcer.AllowedAnywhere(c.Request().Context(), principalOf(c).Subject, "agents", "create")
	return render(c, status, views.Agents(s.orgPage(c, "Agents"), views.AgentsData{Slug: tenantOf(c).Org.Slug, Rows: rows, Form: form, CanCreate: canCreate}))
}

func (s *Server) pageAgents(c echo.Context) error {
	return s.renderAgents(c, http.StatusOK, s.agentForm(c, agents.Agent{}))
}

func (s *Server) pageCreateAgent(c echo.Context) error {
	req := agentRequestFromForm(c)
	a, err := s.createAgent(c, req)
	if fields, ok := formFailure(err); ok {
		f := agentFormFrom(c, req)
		s.fillAgentChoices(c, &f, req.EnvironmentIDs, deref64(req.DefaultEnvironmentID))
		f.Errors = fields
		return s.renderAgents(c, http.StatusBadRequest, f)
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
	ctx := c.Request().Context()
	svc := s.envService(c)
	cfg, _ := agents.ParseConfig(a.Config, apperr.Validation())
	d := views.AgentDetailData{Slug: tenantOf(c).Org.Slug, ID: a.ID, Name: a.Name, Description: a.Description,
		Department: s.scopeLabel(c, a.DepartmentID, nil), Model: cfg.Model, Config: a.Config, SandboxMode: a.SandboxMode,
		IdleMinutes: a.IdleTimeoutSeconds / 60, ReclaimMins: a.ReclaimAfterSeconds / 60, Policy: a.Policy(), CanManage: s.canManageAgent(c, a)}
	for _, id := range a.EnvironmentIDs {
		name := "#" + itoa(id)
		if e, err := svc.Get(ctx, id); err == nil {
			name = e.Name + " (" + e.Kind + ", " + e.HealthStatus + ")"
		}
		d.Environments = append(d.Environments, name)
		if id == a.DefaultEnvironmentID {
			d.Default = name
		}
	}
	if a.TemplateID != nil {
		if t, err := svc.GetTemplate(ctx, *a.TemplateID); err == nil {
			d.Template = t.Name + " — " + strconv.Itoa(t.VCPU) + " vCPU, " + strconv.Itoa(t.MemoryMB) + " MiB RAM, " + strconv.Itoa(t.WritableLayerMB) + " MiB disk (" + t.BackendStatus + ")"
		}
	}
	if form != nil {
		d.Form = *form
	} else {
		d.Form = s.agentForm(c, a)
	}
	return render(c, status, views.AgentDetail(s.orgPage(c, a.Name), d))
}

func (s *Server) pageAgent(c echo.Context) error {
	a, err := s.visibleAgent(c, false)
	if err != nil {
		return err
	}
	return s.renderAgent(c, http.StatusOK, a, nil)
}

func (s *Server) pageUpdateAgent(c echo.Context) error {
	req := agentRequestFromForm(c)
	a, err := s.updateAgent(c, req)
	if fields, ok := formFailure(err); ok {
		cur, gerr := s.visibleAgent(c, false)
		if gerr != nil {
			return gerr
		}
		f := agentFormFrom(c, req)
		s.fillAgentChoices(c, &f, req.EnvironmentIDs, deref64(req.DefaultEnvironmentID))
		f.Errors = fields
		return s.renderAgent(c, http.StatusBadRequest, cur, &f)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Agent "+a.Name+" was saved.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/agents/"+itoa(a.ID))
}

func (s *Server) pageDeleteAgent(c echo.Context) error {
	a, err := s.visibleAgent(c, true)
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
