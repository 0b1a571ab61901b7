package handlers

import (
	"net/http"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
)

// envService binds the environments domain to the request's org.
func (s *Server) envService(c echo.Context) *envs.Service {
	return s.envServiceOn(c, tenantOf(c).DB)
}

// envServiceOn is envService on a given handle (a transaction).
func (s *Server) envServiceOn(c echo.Context, db *gorm.DB) *envs.Service {
	return &envs.Service{DB: db, Box: s.Box, Org: tenantOf(c).Org.Slug, HTTPClient: s.OutboundHTTP}
}

// envFromPath reads the :id environment as the request's actor may see
// it (manage: and change it).
func (s *Server) envFromPath(c echo.Context, manage bool) (envs.Environment, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return envs.Environment{}, err
	}
	if manage {
		return s.envService(c).Manageable(c.Request().Context(), actorOf(c), id)
	}
	return s.envService(c).Get(c.Request().Context(), actorOf(c), id)
}

type healthJSON struct {
	Status         string     `json:"status"`
	Error          string     `json:"error,omitempty"`
	CheckedAt      *time.Time `json:"checked_at"`
	ChangedAt      *time.Time `json:"changed_at"`
	LatencyMS      int        `json:"latency_ms"`
	AgentdVersion  string     `json:"agentd_version,omitempty"`
	ActiveSessions int        `json:"active_sessions"`
	// ExecReporting is agentd's exec reporting at the last check:
	// netlink, unavailable or off ("" when unknown); see
	// docs/agentd-protocol.md.
	ExecReporting       string `json:"exec_reporting,omitempty"`
	ExecReportingReason string `json:"exec_reporting_reason,omitempty"`
}

// envJSON never carries a secret: only whether each is set.
type envJSON struct {
	ID            int64  `json:"id"`
	Name          string `json:"name"`
	Kind          string `json:"kind"`
	DepartmentID  *int64 `json:"department_id"`
	Private       bool   `json:"private"`
	OwnerUserID   *int64 `json:"owner_user_id"`
	URL           string `json:"url"`
	OS            string `json:"os,omitempty"`
	Deployment    string `json:"deployment,omitempty"`
	WorkspaceRoot string `json:"workspace_root,omitempty"`
	SandboxDomain string `json:"sandbox_domain,omitempty"`
	SandboxScheme string `json:"sandbox_scheme,omitempty"`
	ProxyBaseURL  string `json:"proxy_base_url,omitempty"`
	// WorkspaceMount and WorkspaceMountPath: a sandbox environment's
	// persistent session workspaces (docs/sessions.md).
	WorkspaceMount     string     `json:"workspace_mount,omitempty"`
	WorkspaceMountPath string     `json:"workspace_mount_path,omitempty"`
	APIKeySet          bool       `json:"api_key_set"`
	AgentdTokenSet     bool       `json:"agentd_token_set"`
	Health             healthJSON `json:"health"`
	CreatedBy          string     `json:"created_by"`
	CreatedAt          time.Time  `json:"created_at"`
	UpdatedAt          time.Time  `json:"updated_at"`
}

func toEnvJSON(e envs.Environment) envJSON {
	return envJSON{ID: e.ID, Name: e.Name, Kind: e.Kind, DepartmentID: e.DepartmentID, Private: e.Private(), OwnerUserID: e.OwnerUserID,
		URL: e.URL, OS: e.OS, Deployment: e.Deployment, WorkspaceRoot: e.WorkspaceRoot, SandboxDomain: e.SandboxDomain,
		SandboxScheme: e.SandboxScheme, ProxyBaseURL: e.ProxyBaseURL, WorkspaceMount: e.WorkspaceMount, WorkspaceMountPath: e.WorkspaceMountPath,
		APIKeySet: e.HasAPIKey(), AgentdTokenSet: e.HasAgentdToken(),
		Health: healthJSON{Status: e.HealthStatus, Error: e.HealthError, CheckedAt: e.HealthCheckedAt, ChangedAt: e.HealthChangedAt,
			LatencyMS: e.HealthLatencyMS, AgentdVersion: e.AgentdVersion, ActiveSessions: e.ActiveSessions,
			ExecReporting: e.ExecReporting, ExecReportingReason: e.ExecReportingReason},
		CreatedBy: e.CreatedBy, CreatedAt: e.CreatedAt.UTC(), UpdatedAt: e.UpdatedAt.UTC()}
}

// envAudit is an environment's audited shape: secrets appear only as
// "[redacted]" markers saying they are set.
func envAudit(e envs.Environment) map[string]any {
	m := map[string]any{"name": e.Name, "kind": e.Kind, "department_id": e.DepartmentID, "private": e.Private(), "url": e.URL,
		"os": e.OS, "deployment": e.Deployment, "workspace_root": e.WorkspaceRoot, "sandbox_domain": e.SandboxDomain,
		"sandbox_scheme": e.SandboxScheme, "proxy_base_url": e.ProxyBaseURL, "workspace_mount": e.WorkspaceMount,
		"workspace_mount_path": e.WorkspaceMountPath}
	if e.HasAgentdToken() {
		m["agentd_token"] = "[redacted]"
	}
	if e.HasAPIKey() {
		m["api_key"] = "[redacted]"
	}
	return m
}

func envTarget(e envs.Environment) audit.Target { return envs.Target(e) }

func (s *Server) apiListEnvs(c echo.Context) error {
	list, err := s.envService(c).List(c.Request().Context(), actorOf(c))
	if err != nil {
		return err
	}
	out := make([]envJSON, len(list))
	for i, e := range list {
		out[i] = toEnvJSON(e)
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out})
}

type envRequest struct {
	Name               *string `json:"name"`
	Kind               string  `json:"kind"`
	DepartmentID       *int64  `json:"department_id"`
	Private            bool    `json:"private"`
	URL                *string `json:"url"`
	OS                 *string `json:"os"`
	Deployment         *string `json:"deployment"`
	WorkspaceRoot      *string `json:"workspace_root"`
	SandboxDomain      *string `json:"sandbox_domain"`
	SandboxScheme      *string `json:"sandbox_scheme"`
	ProxyBaseURL       *string `json:"proxy_base_url"`
	WorkspaceMount     *string `json:"workspace_mount"`
	WorkspaceMountPath *string `json:"workspace_mount_path"`
	APIKey             *string `json:"api_key"`
	AgentdToken        *string `json:"agentd_token"`
}

func (r envRequest) input() envs.Input {
	return envs.Input{Name: r.Name, Kind: r.Kind, DepartmentID: r.DepartmentID, URL: r.URL, OS: r.OS, Deployment: r.Deployment,
		WorkspaceRoot: r.WorkspaceRoot, SandboxDomain: r.SandboxDomain, SandboxScheme: r.SandboxScheme, ProxyBaseURL: r.ProxyBaseURL,
		WorkspaceMount: r.WorkspaceMount, WorkspaceMountPath: r.WorkspaceMountPath, APIKey: r.APIKey, AgentdToken: r.AgentdToken, Private: r.Private}
}

// createEnv adds an environment where the actor may; envs decides where.
func (s *Server) createEnv(c echo.Context, req envRequest) (envs.Environment, error) {
	var e envs.Environment
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if e, err = m.Envs().Create(c.Request().Context(), m.Actor(), req.input()); err != nil {
			return err
		}
		return m.audit("environment.create", envTarget(e), map[string]any{"after": envAudit(e)})
	})
	return e, err
}

func (s *Server) apiCreateEnv(c echo.Context) error {
	return jsonCall(c, http.StatusCreated, func(req envRequest) (envJSON, error) {
		e, err := s.createEnv(c, req)
		return toEnvJSON(e), err
	})
}

func (s *Server) apiGetEnv(c echo.Context) error {
	e, err := s.envFromPath(c, false)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toEnvJSON(e))
}

func (s *Server) updateEnv(c echo.Context, req envRequest) (envs.Environment, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return envs.Environment{}, err
	}
	var after envs.Environment
	err = s.mutate(c, func(m *orgTx) error {
		before, updated, err := m.Envs().Update(c.Request().Context(), m.Actor(), id, req.input())
		if err != nil {
			return err
		}
		after = updated
		b, a := envAudit(before), envAudit(after)
		if req.AgentdToken != nil {
			a["agentd_token"] = "[redacted: replaced]"
		}
		if req.APIKey != nil {
			a["api_key"] = "[redacted: replaced]"
		}
		return m.audit("environment.update", envTarget(after), map[string]any{"before": b, "after": a})
	})
	return after, err
}

func (s *Server) apiUpdateEnv(c echo.Context) error {
	var req envRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Kind != "" {
		return &apperr.ValidationError{Fields: map[string]string{"kind": "The kind of an environment cannot change; create a new one."}}
	}
	e, err := s.updateEnv(c, req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toEnvJSON(e))
}

func (s *Server) deleteEnv(c echo.Context) (envs.Environment, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return envs.Environment{}, err
	}
	var e envs.Environment
	return e, s.mutate(c, func(m *orgTx) error {
		var err error
		if e, err = m.Envs().Delete(c.Request().Context(), m.Actor(), id); err != nil {
			return err
		}
		return m.audit("environment.delete", envTarget(e), map[string]any{"before": envAudit(e)})
	})
}

func (s *Server) apiDeleteEnv(c echo.Context) error {
	if _, err := s.deleteEnv(c); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// testEnv runs a health check now ("Test connection"), records and audits it.
func (s *Server) testEnv(c echo.Context) (envs.Environment, envs.Health, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return envs.Environment{}, envs.Health{}, err
	}
	e, h, err := s.envService(c).Test(c.Request().Context(), actorOf(c), id, tenantOf(c).Audit, 10*time.Second)
	if err != nil {
		return e, h, err
	}
	return e, h, s.audited(c, "environment.test", envTarget(e), map[string]any{"result": h.Status})
}

func (s *Server) apiTestEnv(c echo.Context) error {
	e, _, err := s.testEnv(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toEnvJSON(e))
}

// Templates.

type templateJSON struct {
	ID                int64  `json:"id"`
	EnvironmentID     int64  `json:"environment_id"`
	BackendTemplateID string `json:"backend_template_id"`
	Name              string `json:"name"`
	Image             string `json:"image"`
	WritableLayerMB   int    `json:"writable_layer_mb"`
	VCPU              int    `json:"vcpu"`
	MemoryMB          int    `json:"memory_mb"`
	Ports             struct {
		Envd   int `json:"envd"`
		Agentd int `json:"agentd"`
		Probe  int `json:"probe,omitempty"`
	} `json:"ports"`
	BackendStatus string    `json:"backend_status"`
	Ready         bool      `json:"ready"`
	CreatedAt     time.Time `json:"created_at"`
}

func toTemplateJSON(t envs.Template) templateJSON {
	j := templateJSON{ID: t.ID, EnvironmentID: t.EnvironmentID, BackendTemplateID: t.BackendTemplateID, Name: t.Name, Image: t.Image,
		WritableLayerMB: t.WritableLayerMB, VCPU: t.VCPU, MemoryMB: t.MemoryMB, BackendStatus: t.BackendStatus, Ready: t.Ready(), CreatedAt: t.CreatedAt.UTC()}
	j.Ports.Envd, j.Ports.Agentd, j.Ports.Probe = t.EnvdPort, t.AgentdPort, t.ProbePort
	return j
}

func templateTarget(t envs.Template) audit.Target {
	return audit.Target{Type: "template", ID: itoa(t.ID), Name: t.Name}
}

func (s *Server) apiListTemplates(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	ts, err := s.envService(c).Templates(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	out := make([]templateJSON, len(ts))
	for i, t := range ts {
		out[i] = toTemplateJSON(t)
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out})
}

type backendTemplateJSON struct {
	ID          string   `json:"template_id"`
	Aliases     []string `json:"aliases"`
	CPU         int      `json:"cpu_count"`
	MemoryMB    int      `json:"memory_mb"`
	DiskSizeMB  int      `json:"disk_size_mb"`
	BuildStatus string   `json:"build_status"`
}

func (s *Server) apiBackendTemplates(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	ts, err := s.envService(c).BackendTemplates(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	out := make([]backendTemplateJSON, len(ts))
	for i, t := range ts {
		out[i] = backendTemplateJSON{ID: t.ID, Aliases: t.Aliases, CPU: t.CPU, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB, BuildStatus: t.BuildStatus}
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out})
}

type templateRequest struct {
	// Import copies the resources from the backend's template of this id.
	Import            bool   `json:"import"`
	BackendTemplateID string `json:"backend_template_id"`
	Name              string `json:"name"`
	Image             string `json:"image"`
	WritableLayerMB   int    `json:"writable_layer_mb"`
	VCPU              int    `json:"vcpu"`
	MemoryMB          int    `json:"memory_mb"`
	EnvdPort          int    `json:"envd_port"`
	AgentdPort        int    `json:"agentd_port"`
	ProbePort         int    `json:"probe_port"`
}

func (s *Server) addTemplate(c echo.Context, req templateRequest) (envs.Template, error) {
	envID, err := idParam(c, "id")
	if err != nil {
		return envs.Template{}, err
	}
	ctx := c.Request().Context()
	in := envs.TemplateInput{BackendTemplateID: req.BackendTemplateID, Name: req.Name, Image: req.Image,
		WritableLayerMB: req.WritableLayerMB, VCPU: req.VCPU, MemoryMB: req.MemoryMB, EnvdPort: req.EnvdPort, AgentdPort: req.AgentdPort, ProbePort: req.ProbePort}
	if req.Import {
		// Ask the backend before the transaction: no database lock is held
		// across a network call.
		if in, err = s.envService(c).ImportInput(ctx, actorOf(c), envID, strings.TrimSpace(req.BackendTemplateID)); err != nil {
			return envs.Template{}, err
		}
	}
	var t envs.Template
	err = s.mutate(c, func(m *orgTx) error {
		var err error
		if t, err = m.Envs().AddTemplate(ctx, m.Actor(), envID, in); err != nil {
			return err
		}
		return m.audit("template.create", templateTarget(t), map[string]any{"after": toTemplateJSON(t)})
	})
	return t, err
}

func (s *Server) apiAddTemplate(c echo.Context) error {
	return jsonCall(c, http.StatusCreated, func(req templateRequest) (templateJSON, error) {
		t, err := s.addTemplate(c, req)
		return toTemplateJSON(t), err
	})
}

func (s *Server) deleteTemplate(c echo.Context) (envs.Template, error) {
	envID, err := idParam(c, "id")
	if err != nil {
		return envs.Template{}, err
	}
	tid, err := idParam(c, "tid")
	if err != nil {
		return envs.Template{}, err
	}
	var t envs.Template
	return t, s.mutate(c, func(m *orgTx) error {
		var err error
		if t, err = m.Envs().DeleteTemplate(c.Request().Context(), m.Actor(), envID, tid); err != nil {
			return err
		}
		return m.audit("template.delete", templateTarget(t), map[string]any{"before": toTemplateJSON(t)})
	})
}

func (s *Server) apiDeleteTemplate(c echo.Context) error {
	if _, err := s.deleteTemplate(c); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
