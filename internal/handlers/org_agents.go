package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
)

func (s *Server) agentService(c echo.Context) *agents.Service {
	return &agents.Service{DB: tenantOf(c).DB, Envs: s.envService(c)}
}

func agentDomain(a agents.Agent) string {
	if a.DepartmentID != nil {
		return rbac.DeptDomain(*a.DepartmentID)
	}
	return rbac.DomainOrg
}

// canSeeAgent: an org-wide agent is everyone's to see; a department's
// agent its members'.
func (s *Server) canSeeAgent(c echo.Context, a agents.Agent) bool {
	if a.DepartmentID == nil {
		return true
	}
	ok, _ := s.allowedOn(c, agentDomain(a), "agents/"+itoa(a.ID), "read")
	return ok
}

func (s *Server) canManageAgent(c echo.Context, a agents.Agent) bool {
	ok, _ := s.allowedOn(c, agentDomain(a), "agents/"+itoa(a.ID), "update")
	return ok
}

// canUseEnvFor tells the agents package which environments the caller may
// attach: visible ones, and private ones only when shared with a department.
func (s *Server) canUseEnvFor(c echo.Context) func(envs.Environment) bool {
	return func(e envs.Environment) bool {
		if e.Private() && e.DepartmentID == nil {
			return false
		}
		return s.canSeeEnv(c, e)
	}
}

func (s *Server) visibleAgent(c echo.Context, manage bool) (agents.Agent, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return agents.Agent{}, err
	}
	a, err := s.agentService(c).Get(c.Request().Context(), id)
	if errors.Is(err, apperr.ErrNotFound) || (err == nil && !s.canSeeAgent(c, a)) {
		return a, notFoundErr()
	}
	if err != nil {
		return a, err
	}
	if manage && !s.canManageAgent(c, a) {
		return a, apperr.New(apperr.ErrForbidden, "forbidden", "You may see agent %q but not change it.", a.Name)
	}
	return a, nil
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
	CommandPolicy        []string        `json:"command_policy"`
	CreatedBy            string          `json:"created_by"`
	CreatedAt            time.Time       `json:"created_at"`
	UpdatedAt            time.Time       `json:"updated_at"`
}

func toAgentJSON(a agents.Agent) agentJSON {
	ids := a.EnvironmentIDs
	if ids == nil {
		ids = []int64{}
	}
	pol := a.Policy()
	if pol == nil {
		pol = []string{}
	}
	return agentJSON{ID: a.ID, DepartmentID: a.DepartmentID, Name: a.Name, Description: a.Description, Config: json.RawMessage(a.Config),
		SandboxMode: a.SandboxMode, TemplateID: a.TemplateID, EnvironmentIDs: ids, DefaultEnvironmentID: a.DefaultEnvironmentID,
		IdleTimeoutSeconds: a.IdleTimeoutSeconds, ReclaimAfterSeconds: a.ReclaimAfterSeconds, CommandPolicy: pol,
		CreatedBy: a.CreatedBy, CreatedAt: a.CreatedAt.UTC(), UpdatedAt: a.UpdatedAt.UTC()}
}

func agentTarget(a agents.Agent) audit.Target {
	return audit.Target{Type: "agent", ID: itoa(a.ID), Name: a.Name}
}

func (s *Server) visibleAgents(c echo.Context) ([]agents.Agent, error) {
	all, err := s.agentService(c).List(c.Request().Context(), nil)
	if err != nil {
		return nil, err
	}
	out := []agents.Agent{}
	for _, a := range all {
		if s.canSeeAgent(c, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

func (s *Server) apiListAgents(c echo.Context) error {
	list, err := s.visibleAgents(c)
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
}

func (r agentRequest) input() agents.Input {
	in := agents.Input{DepartmentID: r.DepartmentID, Name: r.Name, Description: r.Description, SandboxMode: r.SandboxMode,
		TemplateID: r.TemplateID, EnvironmentIDs: r.EnvironmentIDs, DefaultEnvironmentID: r.DefaultEnvironmentID, CommandPolicy: r.CommandPolicy}
	if len(r.Config) > 0 {
		cfg := string(r.Config)
		in.Config = &cfg
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

// agentAllowedIn checks that the caller may create or move an agent into
// a department (or org-wide when dept is nil or 0).
func (s *Server) agentAllowedIn(c echo.Context, dept *int64) error {
	dom := rbac.DomainOrg
	if dept != nil && *dept != 0 {
		dom = rbac.DeptDomain(*dept)
	}
	// Permission first: a department one may not use and one that does
	// not exist must look the same.
	if ok, err := s.allowedOn(c, dom, "agents", "create"); err != nil || !ok {
		return apperr.New(apperr.ErrForbidden, "forbidden", "You may not configure agents there: department owners manage their department's agents, org admins all.")
	}
	if dom != rbac.DomainOrg {
		if _, err := tenantOf(c).Dir.GetDepartment(c.Request().Context(), *dept); err != nil {
			return &apperr.ValidationError{Fields: map[string]string{"department_id": "That department does not exist."}}
		}
	}
	return nil
}

func (s *Server) createAgent(c echo.Context, req agentRequest) (agents.Agent, error) {
	if err := s.agentAllowedIn(c, req.DepartmentID); err != nil {
		return agents.Agent{}, err
	}
	var a agents.Agent
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if a, err = m.Agents().Create(c.Request().Context(), req.input(), principalOf(c).Name, s.canUseEnvFor(c)); err != nil {
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
	a, err := s.visibleAgent(c, false)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toAgentJSON(a))
}

func (s *Server) updateAgent(c echo.Context, req agentRequest) (agents.Agent, error) {
	a, err := s.visibleAgent(c, true)
	if err != nil {
		return a, err
	}
	if req.DepartmentID != nil {
		if err := s.agentAllowedIn(c, req.DepartmentID); err != nil {
			return a, err
		}
	}
	var after agents.Agent
	err = s.mutate(c, func(m *orgTx) error {
		before, updated, err := m.Agents().Update(c.Request().Context(), a.ID, req.input(), s.canUseEnvFor(c))
		if err != nil {
			return err
		}
		after = updated
		return m.audit("agent.update", agentTarget(after), map[string]any{"before": toAgentJSON(before), "after": toAgentJSON(after)})
	})
	return after, err
}

func (s *Server) apiUpdateAgent(c echo.Context) error {
	return jsonCall(c, http.StatusOK, func(req agentRequest) (agentJSON, error) {
		a, err := s.updateAgent(c, req)
		return toAgentJSON(a), err
	})
}

func (s *Server) deleteAgent(c echo.Context) (agents.Agent, error) {
	a, err := s.visibleAgent(c, true)
	if err != nil {
		return a, err
	}
	return a, s.mutate(c, func(m *orgTx) error {
		if _, err := m.Agents().Delete(c.Request().Context(), a.ID); err != nil {
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
