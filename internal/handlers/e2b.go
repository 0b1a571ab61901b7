package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// E2BEndpoint is the E2B-compatible API's configuration.
type E2BEndpoint struct {
	// Service resolves data-plane sandbox ids (the data plane's; the
	// control plane reads the org's rows itself).
	Service *e2b.Service
	// Domain is the data plane's wildcard domain ("" when none).
	Domain string
	// PublicURL is the data plane as one host (E2B_SANDBOX_URL); "" means
	// the console's BaseURL.
	PublicURL string
}

const ctxE2BKey = "gh.e2bkey"

// registerE2B mounts the E2B-compatible control plane (internal/e2b) of
// each org at /e2b/orgs/:org (the SDK's E2B_API_URL). Every route takes an
// e2b key of the org (authorizeE2B); what it reaches is decided by the
// sessions service as the key's owner, so each is declared authenticated.
func (s *Server) registerE2B() {
	cp := &e2b.ControlPlane{Console: e2bConsole{s}, Box: s.Box, Domain: s.E2B.Domain, Now: s.Now, Logger: s.Logger}
	g := s.group("/e2b/orgs/:org", e2bSurface)
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		g.handle(http.MethodPost, p, rbac.Authenticated(), cp.Create)
		g.handle(http.MethodGet, p, rbac.Authenticated(), cp.List)
		g.handle(http.MethodPost, p+"/:sandboxID/connect", rbac.Authenticated(), cp.Connect)
	}
	g.handle(http.MethodPost, "/sandboxes/:sandboxID/resume", rbac.Authenticated(), cp.Connect)
	g.handle(http.MethodGet, "/sandboxes/:sandboxID", rbac.Authenticated(), cp.Get)
	g.handle(http.MethodDelete, "/sandboxes/:sandboxID", rbac.Authenticated(), cp.Kill)
	g.handle(http.MethodPost, "/sandboxes/:sandboxID/timeout", rbac.Authenticated(), cp.Timeout)
	g.handle(http.MethodPost, "/sandboxes/:sandboxID/pause", rbac.Authenticated(), cp.Pause)
	g.handle(http.MethodGet, "/templates", rbac.Authenticated(), cp.Templates)
}

// authorizeE2B opens the org in the path and authenticates an e2b key of
// it (X-API-Key, or a bearer token; e2b.Authenticate): the key acts as its
// owner, restricted to its agent.
func (s *Server) authorizeE2B(c echo.Context, next echo.HandlerFunc) error {
	t, err := s.Tenants.Open(c.Request().Context(), c.Param("org"))
	if err != nil {
		return err
	}
	defer t.Release()
	c.Set(ctxTenant, t)
	tok := c.Request().Header.Get(e2b.KeyHeader)
	if tok == "" {
		tok, _ = bearer(c.Request())
	}
	k, p, err := e2b.Authenticate(c.Request().Context(), t, tok)
	if err != nil {
		return err
	}
	c.Set(ctxPrincipal, &p)
	c.Set(ctxE2BKey, k)
	actor := authz.New(p, t.Enforcer, s.denialRecorder(c, t))
	c.Set(ctxActor, actor)
	err = next(c)
	if ferr := actor.Flush(c.Request().Context()); ferr != nil {
		s.Logger.Error("denial not recorded", "org", t.Org.Slug, "request_id", requestID(c), "error", ferr)
		return ferr
	}
	return err
}

// e2bConsole is the console's side of the control plane's requests.
type e2bConsole struct{ s *Server }

func (e e2bConsole) Request(c echo.Context) e2b.Request {
	k, _ := c.Get(ctxE2BKey).(directory.APIKey)
	return e2b.Request{Tenant: tenantOf(c), Actor: actorOf(c), Key: k, Sessions: e.s.sessionService(c)}
}

func (e2bConsole) Event(c echo.Context, action string, target audit.Target, details any) audit.Event {
	return requestEvent(c, principalOf(c).AuditActor(), action, target, audit.Allow, details)
}

func (e2bConsole) SessionRecord(sess sessions.Session) any { return toSessionJSON(sess) }

func (e e2bConsole) CloseSession(c echo.Context, svc *sessions.Service, id int64) error {
	_, err := e.s.closeSession(svc, c.Request().Context(), actorOf(c), id)
	return err
}

func (e2bConsole) JSONError(err error) error { return jsonError(err) }
