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
