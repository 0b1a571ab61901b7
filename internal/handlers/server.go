// Package handlers is the HTTP surface: one route table per surface (pages,
// JSON API), each route declaring the permission it needs next to its
// registration, and thin handlers that decode, call a domain package and
// write.
package handlers

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd/release"
	"github.com/gatehouse/gatehouse/internal/anchor"
	"github.com/gatehouse/gatehouse/internal/apidoc"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/metrics"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/sso"
	"github.com/gatehouse/gatehouse/internal/tenant"
	"github.com/gatehouse/gatehouse/internal/terminal"
	"github.com/gatehouse/gatehouse/web"
)

// Deps are what the handlers need, built in main.
type Deps struct {
	Catalog       *gorm.DB
	Orgs          *orgs.Service
	Platform      *platform.Service
	PlatformAudit *audit.Log
	Tenants       *tenant.Registry
	// Anchors keeps the signed checkpoints of every org's audit chain
	// head; verify and export take one and check against them.
	Anchors *anchor.Service
	// Box seals and opens secrets (environment tokens, backend keys).
	Box *sealed.Box
	// OutboundHTTP reaches agentd hosts and sandbox backends.
	OutboundHTTP *http.Client
	// BaseURL is the console's public address; browser terminals open only
	// from it (or from the host the browser addressed).
	BaseURL string
	// Gateway is the audited terminal gateway.
	Gateway *gateway.Gateway
	// Terminal bridges browser terminals to the gateway (nil: one over
	// Gateway).
	Terminal *terminal.Bridge
	// SessionsRT is the process's agent-session runtime (hot-path cache).
	SessionsRT *sessions.Runtime
	// Throttle slows repeated org sign-in failures per address and account.
	Throttle      *auth.Throttle
	Sleep         func(context.Context, time.Duration)
	Logger        *slog.Logger
	SecureCookies bool
	TrustProxy    bool
	Now           func() time.Time
	// Metrics counts requests by route pattern; nil records nothing.
	Metrics *metrics.Metrics
	// Local is the console's local sandbox backend (--local-sandboxes),
	// offered on the environments page; nil without one.
	Local *LocalBackend
	// E2B configures the E2B-compatible endpoint.
	E2B E2BEndpoint
	// Agentd is the agentd builds served at /downloads/agentd/ and offered
	// by the connect page; nil serves none.
	Agentd *release.Catalog
	// ApprovalNotifier releases the approval waiters of this process when
	// a request is decided here; share it with the gateway (nil: New
	// makes one).
	ApprovalNotifier *approvals.Notifier
	// ApprovalRule adds the allow rule of an approval decided with scope
	// "rule" to the agent's execution policy (nil: that scope is refused
	// as not available yet).
	ApprovalRule func(ctx context.Context, tx *gorm.DB, actor *authz.Actor, a approvals.Approval) error
	// ApprovalQueue builds an org's approval queue (console.ApprovalQueue:
	// shared notifier, webhook); nil: one over the tenant with
	// ApprovalNotifier.
	ApprovalQueue func(t *tenant.Tenant) *approvals.Service
}

// Server holds the echo instance and the declared route table.
type Server struct {
	Deps
	e      *echo.Echo
	routes []Route
	sso    *sso.Service
	apiDoc apidoc.Served
}

// Route is one registered route and what it requires.
type Route struct {
	Method string
	Path   string
	Perm   rbac.Perm
}

// New builds the server and registers every surface.
func New(d Deps) *Server {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.ApprovalNotifier == nil {
		d.ApprovalNotifier = approvals.NewNotifier()
	}
	if d.SessionsRT == nil {
		d.SessionsRT = sessions.NewRuntime()
	}
	if d.Terminal == nil {
		d.Terminal = &terminal.Bridge{Gateway: d.Gateway, Logger: d.Logger}
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	if d.TrustProxy {
		e.IPExtractor = echo.ExtractIPFromXFFHeader()
	} else {
		e.IPExtractor = echo.ExtractIPDirect()
	}
	s := &Server{Deps: d, e: e}
	e.HTTPErrorHandler = s.handleError
	e.Use(middleware.RequestID())
	e.Use(s.recoverer)
	e.Use(s.accessLog)
	e.Use(securityHeaders)
	e.Use(limitBody(maxBodyBytes, map[string]int64{
		http.MethodPut + " /api/v1/orgs/:org/sessions/:id/files": gateway.MaxWriteBytes,
	}))
	e.Use(s.csrf)

	s.registerPublic()
	s.registerPlatformAPI()
	s.registerPlatformPages()
	s.registerOrgSurface()
	s.registerE2B()
	// Unknown paths answer 404 through the same error handler.
	notFound := func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusNotFound, "There is nothing at this address.")
	}
	e.RouteNotFound("/*", notFound)
	// Inside an org, a wrong address still shows the org's navigation and
	// who is signed in, rather than looking like a signed-out page.
	e.RouteNotFound("/o/:org/*", func(c echo.Context) error {
		if t, err := s.Tenants.Open(c.Request().Context(), c.Param("org")); err == nil {
			defer t.Release()
			c.Set(ctxTenant, t)
			if p, err := s.orgPrincipal(c, t); err == nil {
				c.Set(ctxPrincipal, p)
			}
		}
		return notFound(c)
	})
	return s
}

// ServeHTTP makes Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.e.ServeHTTP(w, r) }

// Routes lists every registered route with its permission, for the route
// matrix test and the docs.
func (s *Server) Routes() []Route { return append([]Route(nil), s.routes...) }

// group is a path prefix with its middleware; routes are added through
// handle so each declares a permission.
type group struct {
	s       *Server
	g       *echo.Group
	prefix  string
	surface surface
}

// surface says whose principals a group's routes authenticate: platform
// admins, or the principals of the org named in the path.
type surface int

const (
	platformSurface surface = iota
	orgSurface
	// e2bSurface is the E2B-compatible control plane: org principals
	// authenticated by e2b keys only, errors in E2B's shape.
	e2bSurface
)

func (s *Server) group(prefix string, sf surface, mw ...echo.MiddlewareFunc) *group {
	return &group{s: s, g: s.e.Group(prefix, mw...), prefix: prefix, surface: sf}
}

// handle registers a route. A route without a valid permission cannot be
// registered: the program refuses to start.
func (g *group) handle(method, path string, perm rbac.Perm, h echo.HandlerFunc) {
	if !perm.Valid() {
		panic(fmt.Sprintf("route %s %s%s registered without a permission", method, g.prefix, path))
	}
	g.s.routes = append(g.s.routes, Route{Method: method, Path: g.prefix + path, Perm: perm})
	g.g.Add(method, path, h, g.s.authorize(g.surface, perm))
}

func (s *Server) registerPublic() {
	pub := s.group("", platformSurface)
	pub.handle(http.MethodGet, "/healthz", rbac.Public(), s.healthz)
	pub.handle(http.MethodGet, "/readyz", rbac.Public(), s.readyz)
	// agentd for hosts that have no credential yet (docs/agents.md).
	pub.handle(http.MethodGet, "/downloads/agentd/SHA256SUMS", rbac.Public(), s.downloadAgentdSums)
	pub.handle(http.MethodHead, "/downloads/agentd/SHA256SUMS", rbac.Public(), s.downloadAgentdSums)
	pub.handle(http.MethodGet, "/downloads/agentd/:platform", rbac.Public(), s.downloadAgentd)
	pub.handle(http.MethodHead, "/downloads/agentd/:platform", rbac.Public(), s.downloadAgentd)
	pub.handle(http.MethodGet, "/static/*", rbac.Public(), echo.WrapHandler(staticHandler()))
	pub.handle(http.MethodGet, "/docs/:name", rbac.Public(), s.pageDoc)
	pub.handle(http.MethodGet, "/", rbac.Public(), func(c echo.Context) error {
		return c.Redirect(http.StatusSeeOther, "/admin/orgs")
	})
}

func staticHandler() http.Handler {
	fs := http.StripPrefix("/static/", http.FileServer(http.FS(web.Static)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		fs.ServeHTTP(w, r)
	})
}

// registerPlatformAPI is the platform JSON API.
func (s *Server) registerPlatformAPI() {
	api := s.group("/api/v1", platformSurface)
	api.handle(http.MethodGet, "/openapi.json", rbac.Public(), s.apiOpenAPI)
	api.handle(http.MethodPost, "/auth/login", rbac.Public(), s.apiLogin)
	api.handle(http.MethodPost, "/auth/logout", rbac.OwnLogin(), s.apiLogout)
	api.handle(http.MethodPost, "/auth/password", rbac.OwnLogin(), s.apiChangePassword)
	api.handle(http.MethodGet, "/orgs", rbac.Platform("orgs", "read"), s.apiListOrgs)
	api.handle(http.MethodPost, "/orgs", rbac.Platform("orgs", "create"), s.apiCreateOrg)
	api.handle(http.MethodGet, "/orgs/:org", rbac.Platform("orgs/:org", "read"), s.apiGetOrg)
	api.handle(http.MethodPatch, "/orgs/:org", rbac.Platform("orgs/:org", "update"), s.apiUpdateOrg)
	api.handle(http.MethodDelete, "/orgs/:org", rbac.Platform("orgs/:org", "delete"), s.apiDeleteOrg)
	api.handle(http.MethodPost, "/orgs/:org/suspend", rbac.Platform("orgs/:org", "suspend"), s.apiSuspendOrg)
	api.handle(http.MethodPost, "/orgs/:org/resume", rbac.Platform("orgs/:org", "resume"), s.apiResumeOrg)
	api.handle(http.MethodGet, "/orphan-databases", rbac.Platform("orphan-databases", "read"), s.apiListOrphans)
	api.handle(http.MethodDelete, "/orphan-databases/:kind/:name", rbac.Platform("orphan-databases", "delete"), s.apiRemoveOrphan)
	api.handle(http.MethodGet, "/audit", rbac.Platform("audit", "read"), s.apiPlatformAudit)
	api.handle(http.MethodGet, "/audit/export", rbac.Platform("audit", "export"), s.apiPlatformAuditExport)
	api.handle(http.MethodPost, "/audit/verify", rbac.Platform("audit", "verify"), s.apiPlatformAuditVerify)
	api.handle(http.MethodGet, "/audit/checkpoints/:org", rbac.Platform("audit", "export"), s.apiPlatformOrgCheckpoint)
}

// registerPlatformPages is the platform admin console.
func (s *Server) registerPlatformPages() {
	pg := s.group("", platformSurface)
	pg.handle(http.MethodGet, "/login", rbac.Public(), s.pageLogin)
	pg.handle(http.MethodPost, "/login", rbac.Public(), s.pageLoginSubmit)
	pg.handle(http.MethodGet, "/login/org", rbac.Public(), s.pageFindOrgLogin)
	pg.handle(http.MethodPost, "/logout", rbac.OwnLogin(), s.pageLogout)
	pg.handle(http.MethodGet, "/admin/password", rbac.OwnLogin(), s.pagePassword)
	pg.handle(http.MethodPost, "/admin/password", rbac.OwnLogin(), s.pagePasswordSubmit)
	pg.handle(http.MethodGet, "/admin/orgs", rbac.Platform("orgs", "read"), s.pageOrgs)
	pg.handle(http.MethodGet, "/admin/orgs/new", rbac.Platform("orgs", "create"), s.pageOrgNew)
	pg.handle(http.MethodPost, "/admin/orgs", rbac.Platform("orgs", "create"), s.pageOrgCreate)
	pg.handle(http.MethodGet, "/admin/orgs/:org", rbac.Platform("orgs/:org", "read"), s.pageOrgDetail)
	pg.handle(http.MethodPost, "/admin/orgs/:org/suspend", rbac.Platform("orgs/:org", "suspend"), s.pageOrgSuspend)
	pg.handle(http.MethodPost, "/admin/orgs/:org/resume", rbac.Platform("orgs/:org", "resume"), s.pageOrgResume)
	pg.handle(http.MethodGet, "/admin/orgs/:org/delete", rbac.Platform("orgs/:org", "delete"), s.pageOrgDeleteConfirm)
	pg.handle(http.MethodPost, "/admin/orgs/:org/delete", rbac.Platform("orgs/:org", "delete"), s.pageOrgDelete)
	pg.handle(http.MethodPost, "/admin/orphan-databases/remove", rbac.Platform("orphan-databases", "delete"), s.pageRemoveOrphan)
	pg.handle(http.MethodGet, "/admin/audit", rbac.Platform("audit", "read"), s.pagePlatformAudit)
	pg.handle(http.MethodGet, "/admin/audit/export", rbac.Platform("audit", "export"), s.apiPlatformAuditExport)
	pg.handle(http.MethodPost, "/admin/audit/verify", rbac.Platform("audit", "verify"), s.pagePlatformAuditVerify)
}
