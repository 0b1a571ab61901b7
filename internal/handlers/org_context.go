package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/audit"
)

// pageOrgLeave ends a platform admin's org sign-in (org.leave in both
// logs, like entering) and returns them to the organization's platform
// page; their platform sign-in stays. Anyone else leaving signs out.
func (s *Server) pageOrgLeave(c echo.Context) error {
	p, t := principalOf(c), tenantOf(c)
	if p.Kind != audit.ActorPlatformAdmin {
		return s.pageOrgLogout(c)
	}
	target := audit.Target{Type: "organization", ID: t.Org.Slug, Name: t.Org.Name}
	if err := s.mutate(c, func(m *orgTx) error {
		if err := m.Dir.RevokeLogin(c.Request().Context(), p.LoginID); err != nil {
			return err
		}
		return m.audit("org.leave", target, nil)
	}); err != nil {
		return err
	}
	if err := s.platformEvent(c, p.AuditActor(), "org.leave", target, audit.Allow, nil); err != nil {
		return err
	}
	s.clearCookie(c, orgCookieName(t.Org.Slug))
	s.setFlash(c, "You left "+t.Org.Name+". You are back on the platform pages.")
	return c.Redirect(http.StatusSeeOther, "/admin/orgs/"+t.Org.Slug)
}

// afterOrgSignOut is where signing out of an organization lands: the
// platform pages while the browser's platform sign-in is still live (an
// entered admin, or someone who holds both), else the org's sign-in page.
// The flash says which sign-in ended and which remains.
func (s *Server) afterOrgSignOut(c echo.Context) string {
	t := tenantOf(c)
	if s.platformSignedIn(c) {
		s.setFlash(c, "You are signed out of "+t.Org.Name+". You are still signed in to the platform pages; use Sign out there to end that too.")
		return "/admin/orgs/" + t.Org.Slug
	}
	s.setFlash(c, "You are signed out of "+t.Org.Name+".")
	return "/o/" + t.Org.Slug + "/login"
}

// platformSignedIn reports whether the request carries a live platform
// sign-in cookie.
func (s *Server) platformSignedIn(c echo.Context) bool {
	ck, err := c.Cookie(platformCookie)
	if err != nil || ck.Value == "" {
		return false
	}
	_, _, err = s.Platform.Authenticate(c.Request().Context(), ck.Value)
	return err == nil
}
