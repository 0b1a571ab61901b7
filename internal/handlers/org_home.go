package handlers

import (
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/views"
)

// glanceItems is how many agents, environments, sessions and events the
// org home lists; each box links to its full page.
const glanceItems = 5

// orgGlance is the org at a glance for the home page, as the viewer may
// see it: agents, environments with their health, recent sessions, and
// recent activity from the audit log when the viewer may read it.
func (s *Server) orgGlance(c echo.Context) (views.OrgGlance, error) {
	ctx, actor := c.Request().Context(), actorOf(c)
	var g views.OrgGlance
	agentList, err := s.agentService(c).List(ctx, actor)
	if err != nil {
		return g, err
	}
	g.AgentCount = len(agentList)
	for _, a := range agentList[:min(len(agentList), glanceItems)] {
		g.Agents = append(g.Agents, views.GlanceItem{ID: a.ID, Label: a.Name, Note: s.scopeLabel(c, a.DepartmentID, nil)})
	}
	envList, err := s.envService(c).List(ctx, actor)
	if err != nil {
		return g, err
	}
	g.EnvCount = len(envList)
	for _, e := range envList {
		if e.HealthStatus == envs.HealthDegraded || e.HealthStatus == envs.HealthUnreachable {
			g.EnvsUnhealthy++
		}
	}
	for _, e := range envList[:min(len(envList), glanceItems)] {
		g.Envs = append(g.Envs, views.GlanceItem{ID: e.ID, Label: e.Name, Note: e.Kind, Status: e.HealthStatus})
	}
	page, err := s.sessionService(c).List(ctx, actor, sessions.ListFilter{Limit: glanceItems})
	if err != nil {
		return g, err
	}
	if g.Sessions, err = s.sessionRows(c, page.Items, nil); err != nil {
		return g, err
	}
	if g.Checklist, err = s.setupChecklist(c, g); err != nil {
		return g, err
	}
	if g.CanAudit, err = actor.Allowed(ctx, rbac.DomainOrg, "audit", "read"); err != nil {
		return g, err
	}
	if g.CanAudit {
		// Reading the log is recorded wherever it happens. Views of the
		// log (this one included) are left out of the list, or every
		// visit would push the org's real activity off it.
		evs, err := tenantOf(c).Audit.Query(ctx, audit.Filter{}, 0, 10*glanceItems)
		if err != nil {
			return g, err
		}
		var shown []audit.Event
		for _, e := range evs {
			if !strings.HasPrefix(e.Action, "audit.") && len(shown) < glanceItems {
				shown = append(shown, e)
			}
		}
		g.Activity = auditRows(shown)
		if err := s.audited(c, "audit.view", audit.Target{Type: "audit_log"}, map[string]any{"page": "home", "shown": len(shown)}); err != nil {
			return g, err
		}
	}
	return g, nil
}

// setupChecklist is the first-run checklist an org's admins see on its
// home until everything in it is done: the order in which an empty org
// becomes useful (people, a department to put them in, an environment to
// run on, an agent on it, a first session), each step linked to where it
// is done and ticked from what the org holds now. Others see none (nil).
func (s *Server) setupChecklist(c echo.Context, g views.OrgGlance) ([]views.SetupStep, error) {
	ctx, actor := c.Request().Context(), actorOf(c)
	if ok, err := actor.Allowed(ctx, rbac.DomainOrg, "users", "create"); err != nil || !ok {
		return nil, err
	}
	t := tenantOf(c)
	users, err := t.Dir.ListUsers(ctx, 0, 2)
	if err != nil {
		return nil, err
	}
	others := 0
	for _, u := range users {
		if u.ID != principalOf(c).UserID {
			others++
		}
	}
	depts, err := t.Dir.ListDepartments(ctx, nil)
	if err != nil {
		return nil, err
	}
	base := "/o/" + t.Org.Slug
	sessionHref := base + "/agents"
	if len(g.Agents) > 0 {
		sessionHref = base + "/agents/" + itoa(g.Agents[0].ID) + "#sessions"
	}
	steps := []views.SetupStep{
		{Key: "people", Name: "Add people", Href: base + "/users", Done: others > 0,
			Note: "Each gets a one-time password to send them, with the address where they sign in."},
		{Key: "department", Name: "Create a department", Href: base + "/departments", Done: len(depts) > 0,
			Note: "Members and department owners belong to one; agents and environments can too."},
		{Key: "environment", Name: "Connect an environment", Href: base + "/environments", Done: g.EnvCount > 0,
			Note: "A host running agentd, or a sandbox backend: where commands run."},
		{Key: "agent", Name: "Configure an agent", Href: base + "/agents", Done: g.AgentCount > 0,
			Note: "Its model and skills, and the environments it may use."},
		{Key: "session", Name: "Start the first session", Href: sessionHref, Done: len(g.Sessions) > 0,
			Note: "Open the agent and choose New session; its terminal opens from the session's page."},
	}
	all := true
	for i := range steps {
		if !steps[i].Done && all {
			steps[i].Next = true
			all = false
		}
	}
	if all {
		return nil, nil
	}
	return steps, nil
}
