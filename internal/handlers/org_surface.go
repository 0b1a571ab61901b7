package handlers

import (
	"context"
	"time"

	"gorm.io/gorm"

	"net/http"
	"strconv"
	"strings"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/sso"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

const (
	ctxTenant = "gh.tenant"
	ctxActor  = "gh.actor"
)

func tenantOf(c echo.Context) *tenant.Tenant {
	t, _ := c.Get(ctxTenant).(*tenant.Tenant)
	return t
}

// registerOrgSurface is every route inside an organization: its pages under
// /o/:org and its JSON API under /api/v1/orgs/:org.
func (s *Server) registerOrgSurface() {
	s.registerOrgPages(s.registerOrgAPI())
}

// registerOrgAPI is the JSON API inside an organization; the pages'
// registrations add the API routes that share their handlers to its group.
func (s *Server) registerOrgAPI() *group {
	api := s.group("/api/v1/orgs/:org", orgSurface)
	api.handle(http.MethodPost, "/auth/login", rbac.Public(), s.apiOrgLogin)
	api.handle(http.MethodPost, "/auth/logout", rbac.OwnLogin(), s.apiOrgLogout)
	api.handle(http.MethodPost, "/auth/password", rbac.OwnLogin(), s.apiOrgChangePassword)
	api.handle(http.MethodGet, "/me", rbac.OwnLogin(), s.apiOrgMe)

	api.handle(http.MethodGet, "/users", rbac.Org("users", "read"), s.apiListUsers)
	api.handle(http.MethodPost, "/users", rbac.Org("users", "create"), s.apiCreateUser)
	api.handle(http.MethodGet, "/users/:id", rbac.Org("users/:id", "read"), s.apiGetUser)
	api.handle(http.MethodPatch, "/users/:id", rbac.Org("users/:id", "update"), s.apiUpdateUser)
	api.handle(http.MethodPost, "/users/:id/reset-password", rbac.Org("users/:id", "update"), s.apiResetPassword)

	api.handle(http.MethodGet, "/departments", rbac.Org("departments", "read"), s.apiListDepartments)
	api.handle(http.MethodPost, "/departments", rbac.Org("departments", "create"), s.apiCreateDepartment)
	api.handle(http.MethodGet, "/departments/:dept", rbac.Org("departments/:dept", "read"), s.apiGetDepartment)
	api.handle(http.MethodPatch, "/departments/:dept", rbac.Org("departments/:dept", "update"), s.apiUpdateDepartment)
	api.handle(http.MethodDelete, "/departments/:dept", rbac.Org("departments/:dept", "delete"), s.apiDeleteDepartment)
	api.handle(http.MethodGet, "/departments/:dept/members", rbac.Org("members", "read"), s.apiListMembers)
	api.handle(http.MethodPut, "/departments/:dept/members/:uid", rbac.Org("members", "update"), s.apiPutMember)
	api.handle(http.MethodDelete, "/departments/:dept/members/:uid", rbac.Org("members", "update"), s.apiDeleteMember)

	api.handle(http.MethodGet, "/roles", rbac.Org("roles", "read"), s.apiListRoles)
	api.handle(http.MethodPost, "/roles", rbac.Org("roles", "update"), s.apiAssignRole)
	api.handle(http.MethodDelete, "/roles", rbac.Org("roles", "update"), s.apiUnassignRole)
	api.handle(http.MethodGet, "/policies", rbac.Org("policies", "read"), s.apiListRules)
	api.handle(http.MethodPost, "/policies", rbac.Org("policies", "update"), s.apiAddRule)
	api.handle(http.MethodDelete, "/policies", rbac.Org("policies", "update"), s.apiRemoveRule)

	api.handle(http.MethodGet, "/api-keys", rbac.Authenticated(), s.apiListKeys)
	api.handle(http.MethodPost, "/api-keys", rbac.Authenticated(), s.apiCreateKey)
	api.handle(http.MethodDelete, "/api-keys/:id", rbac.Authenticated(), s.apiRevokeKey)
	// e2b keys: who may mint one for an agent is decided per agent (they
	// may start its sessions); listing and revoking follow API keys.
	api.handle(http.MethodGet, "/e2b-keys", rbac.Authenticated(), s.apiListE2BKeys)
	api.handle(http.MethodPost, "/e2b-keys", rbac.Authenticated(), s.apiCreateE2BKey)
	api.handle(http.MethodDelete, "/e2b-keys/:id", rbac.Authenticated(), s.apiRevokeE2BKey)
	api.handle(http.MethodGet, "/e2b-endpoint", rbac.Authenticated(), s.apiE2BEndpoint)

	// Environments, templates and agents: every signed-in member reaches
	// the routes; which objects they see and change is decided per object
	// (its department, its owner) in the handlers, with hidden objects
	// answering 404.
	api.handle(http.MethodGet, "/environments", rbac.Authenticated(), s.apiListEnvs)
	api.handle(http.MethodPost, "/environments", rbac.Authenticated(), s.apiCreateEnv)
	api.handle(http.MethodGet, "/environments/:id", rbac.Authenticated(), s.apiGetEnv)
	api.handle(http.MethodPatch, "/environments/:id", rbac.Authenticated(), s.apiUpdateEnv)
	api.handle(http.MethodDelete, "/environments/:id", rbac.Authenticated(), s.apiDeleteEnv)
	api.handle(http.MethodPost, "/environments/:id/test", rbac.Authenticated(), s.apiTestEnv)
	api.handle(http.MethodGet, "/environments/:id/templates", rbac.Authenticated(), s.apiListTemplates)
	api.handle(http.MethodPost, "/environments/:id/templates", rbac.Authenticated(), s.apiAddTemplate)
	api.handle(http.MethodDelete, "/environments/:id/templates/:tid", rbac.Authenticated(), s.apiDeleteTemplate)
	api.handle(http.MethodGet, "/environments/:id/backend-templates", rbac.Authenticated(), s.apiBackendTemplates)
	api.handle(http.MethodGet, "/agents", rbac.Authenticated(), s.apiListAgents)
	api.handle(http.MethodPost, "/agents", rbac.Authenticated(), s.apiCreateAgent)
	api.handle(http.MethodGet, "/agents/:id", rbac.Authenticated(), s.apiGetAgent)
	api.handle(http.MethodPatch, "/agents/:id", rbac.Authenticated(), s.apiUpdateAgent)
	api.handle(http.MethodDelete, "/agents/:id", rbac.Authenticated(), s.apiDeleteAgent)
	// Whoever may read the agent may try its execution policy.
	api.handle(http.MethodPost, "/agents/:id/exec-policy/try", rbac.Authenticated(), s.apiTryExec)
	// An agent's skill bundles and files: metadata to whoever may read
	// the agent, changes to whoever may change it (org_uploads.go).
	api.handle(http.MethodGet, "/agents/:id/uploads", rbac.Authenticated(), s.apiListUploads)
	api.handle(http.MethodPost, "/agents/:id/uploads", rbac.Authenticated(), s.apiPutUpload)
	api.handle(http.MethodDelete, "/agents/:id/uploads", rbac.Authenticated(), s.apiDeleteUpload)
	// Sessions: who may see and use one is decided per session (its user,
	// its agent's department) by the sessions service.
	api.handle(http.MethodGet, "/sessions", rbac.Authenticated(), s.apiListSessions)
	api.handle(http.MethodPost, "/sessions", rbac.Authenticated(), s.apiCreateSession)
	api.handle(http.MethodGet, "/sessions/:id", rbac.Authenticated(), s.apiGetSession)
	api.handle(http.MethodPost, "/sessions/:id/start", rbac.Authenticated(), s.apiSessionOp((*sessions.Service).Start))
	api.handle(http.MethodPost, "/sessions/:id/pause", rbac.Authenticated(), s.apiSessionOp((*sessions.Service).Pause))
	api.handle(http.MethodPost, "/sessions/:id/resume", rbac.Authenticated(), s.apiSessionOp((*sessions.Service).Resume))
	api.handle(http.MethodPost, "/sessions/:id/prepare", rbac.Authenticated(), s.apiSessionOp((*sessions.Service).Prepare))
	api.handle(http.MethodDelete, "/sessions/:id", rbac.Authenticated(), s.apiSessionOp(s.closeSession))

	s.registerTerminal(api)
	s.registerRetention(api)

	api.handle(http.MethodGet, "/audit", rbac.Org("audit", "read"), s.apiOrgAudit)
	api.handle(http.MethodGet, "/audit/export", rbac.Org("audit", "export"), s.apiOrgAuditExport)
	api.handle(http.MethodPost, "/audit/verify", rbac.Org("audit", "verify"), s.apiOrgAuditVerify)
	api.handle(http.MethodGet, "/audit/checkpoint", rbac.Org("audit", "export"), s.apiOrgCheckpoint)
	return api
}

// registerOrgPages is the pages inside an organization, and the platform
// admin's ways into it.
func (s *Server) registerOrgPages(api *group) {
	pg := s.group("/o/:org", orgSurface)
	pg.handle(http.MethodGet, "/login", rbac.Public(), s.pageOrgLogin)
	pg.handle(http.MethodPost, "/login", rbac.Public(), s.pageOrgLoginSubmit)
	pg.handle(http.MethodPost, "/logout", rbac.OwnLogin(), s.pageOrgLogout)
	pg.handle(http.MethodPost, "/leave", rbac.OwnLogin(), s.pageOrgLeave)
	pg.handle(http.MethodGet, "/password", rbac.OwnLogin(), s.pageOrgPassword)
	pg.handle(http.MethodPost, "/password", rbac.OwnLogin(), s.pageOrgPasswordSubmit)
	pg.handle(http.MethodGet, "", rbac.Authenticated(), s.pageOrgHome)
	pg.handle(http.MethodGet, "/", rbac.Authenticated(), s.pageOrgHome)
	pg.handle(http.MethodGet, "/users", rbac.Org("users", "read"), s.pageUsers)
	pg.handle(http.MethodPost, "/users", rbac.Org("users", "create"), s.pageCreateUser)
	pg.handle(http.MethodGet, "/users/:id", rbac.Org("users/:id", "read"), s.pageUser)
	pg.handle(http.MethodPost, "/users/:id/status", rbac.Org("users/:id", "update"), s.pageUserStatus)
	pg.handle(http.MethodPost, "/users/:id/name", rbac.Org("users/:id", "update"), s.pageUserName)
	pg.handle(http.MethodPost, "/users/:id/reset-password", rbac.Org("users/:id", "update"), s.pageUserReset)
	pg.handle(http.MethodPost, "/users/:id/roles", rbac.Org("roles", "update"), s.pageUserRole)
	// Dismissing a shown secret only clears the caller's own cookie.
	pg.handle(http.MethodPost, "/users/:id/dismiss-secret", rbac.Org("users/:id", "read"), s.dismissReveal(userPathParam))
	pg.handle(http.MethodGet, "/departments", rbac.Org("departments", "read"), s.pageDepartments)
	pg.handle(http.MethodPost, "/departments", rbac.Org("departments", "create"), s.pageCreateDepartment)
	pg.handle(http.MethodGet, "/departments/:dept", rbac.Org("departments/:dept", "read"), s.pageDepartment)
	pg.handle(http.MethodPost, "/departments/:dept/members", rbac.Org("members", "update"), s.pageAddMember)
	pg.handle(http.MethodPost, "/departments/:dept/members/:uid/remove", rbac.Org("members", "update"), s.pageRemoveMember)
	pg.handle(http.MethodPost, "/departments/:dept/delete", rbac.Org("departments/:dept", "delete"), s.pageDeleteDepartment)
	pg.handle(http.MethodGet, "/api-keys", rbac.Authenticated(), s.pageKeys)
	pg.handle(http.MethodPost, "/api-keys", rbac.Authenticated(), s.pageCreateKey)
	pg.handle(http.MethodPost, "/api-keys/:id/revoke", rbac.Authenticated(), s.pageRevokeKey)
	pg.handle(http.MethodPost, "/api-keys/dismiss-secret", rbac.Authenticated(), s.dismissReveal(keysPathParam))
	pg.handle(http.MethodGet, "/e2b", rbac.Authenticated(), s.pageE2B)
	pg.handle(http.MethodPost, "/e2b-keys", rbac.Authenticated(), s.pageMintE2BKey)
	pg.handle(http.MethodPost, "/e2b-keys/:id/revoke", rbac.Authenticated(), s.pageRevokeE2BKey)
	pg.handle(http.MethodPost, "/e2b/dismiss-secret", rbac.Authenticated(), s.dismissReveal(e2bPathParam))
	pg.handle(http.MethodGet, "/environments", rbac.Authenticated(), s.pageEnvs)
	pg.handle(http.MethodPost, "/environments", rbac.Authenticated(), s.pageCreateEnv)
	if s.Local != nil { // only a console started with --local-sandboxes has one to offer
		pg.handle(http.MethodPost, "/environments/local", rbac.Authenticated(), s.pageUseLocalSandboxes)
	}
	pg.handle(http.MethodGet, "/environments/:id", rbac.Authenticated(), s.pageEnv)
	pg.handle(http.MethodPost, "/environments/:id", rbac.Authenticated(), s.pageUpdateEnv)
	pg.handle(http.MethodPost, "/environments/:id/test", rbac.Authenticated(), s.pageTestEnv)
	pg.handle(http.MethodGet, "/environments/:id/connection", rbac.Authenticated(), s.pageEnvConnection)
	pg.handle(http.MethodPost, "/environments/:id/delete", rbac.Authenticated(), s.pageDeleteEnv)
	pg.handle(http.MethodPost, "/environments/:id/templates", rbac.Authenticated(), s.pageAddTemplate)
	pg.handle(http.MethodPost, "/environments/:id/templates/:tid/delete", rbac.Authenticated(), s.pageDeleteTemplate)
	pg.handle(http.MethodGet, "/agents", rbac.Authenticated(), s.pageAgents)
	pg.handle(http.MethodPost, "/agents", rbac.Authenticated(), s.pageCreateAgent)
	pg.handle(http.MethodGet, "/agents/:id", rbac.Authenticated(), s.pageAgent)
	pg.handle(http.MethodPost, "/agents/:id", rbac.Authenticated(), s.pageUpdateAgent)
	pg.handle(http.MethodPost, "/agents/:id/delete", rbac.Authenticated(), s.pageDeleteAgent)
	pg.handle(http.MethodPost, "/agents/:id/exec-policy/try", rbac.Authenticated(), s.pageTryExec)
	pg.handle(http.MethodPost, "/agents/:id/uploads", rbac.Authenticated(), s.pagePutUpload)
	pg.handle(http.MethodPost, "/agents/:id/uploads/remove", rbac.Authenticated(), s.pageRemoveUpload)
	// Adding or removing a skill is an agent update (org_agents_skills.go).
	pg.handle(http.MethodPost, "/agents/:id/skills", rbac.Authenticated(), s.pageAddSkill)
	pg.handle(http.MethodPost, "/agents/:id/skills/remove", rbac.Authenticated(), s.pageRemoveSkill)
	pg.handle(http.MethodGet, "/sessions", rbac.Authenticated(), s.pageSessions)
	pg.handle(http.MethodPost, "/sessions", rbac.Authenticated(), s.pageCreateSession)
	pg.handle(http.MethodGet, "/sessions/:id", rbac.Authenticated(), s.pageSession)
	pg.handle(http.MethodPost, "/sessions/:id/start", rbac.Authenticated(), s.pageSessionOp((*sessions.Service).Start))
	pg.handle(http.MethodPost, "/sessions/:id/pause", rbac.Authenticated(), s.pageSessionOp((*sessions.Service).Pause))
	pg.handle(http.MethodPost, "/sessions/:id/resume", rbac.Authenticated(), s.pageSessionOp((*sessions.Service).Resume))
	pg.handle(http.MethodPost, "/sessions/:id/prepare", rbac.Authenticated(), s.pageSessionOp((*sessions.Service).Prepare))
	pg.handle(http.MethodPost, "/sessions/:id/close", rbac.Authenticated(), s.pageSessionOp(s.closeSession))
	s.registerTerminalPages(pg)
	s.registerRecordings(api, pg)
	s.registerApprovals(api, pg)
	pg.handle(http.MethodGet, "/audit", rbac.Org("audit", "read"), s.pageOrgAudit)
	pg.handle(http.MethodGet, "/audit/export", rbac.Org("audit", "export"), s.apiOrgAuditExport)
	pg.handle(http.MethodPost, "/audit/verify", rbac.Org("audit", "verify"), s.pageOrgAuditVerify)
	s.registerSSO(api, pg)

	// A platform admin enters an org explicitly; it is audited in both logs.
	plat := s.group("/api/v1/orgs/:org", platformSurface)
	plat.handle(http.MethodPost, "/enter", rbac.Platform("orgs/:org", "enter"), s.apiEnterOrg)
	pp := s.group("/admin/orgs/:org", platformSurface)
	pp.handle(http.MethodPost, "/enter", rbac.Platform("orgs/:org", "enter"), s.pageEnterOrg)
}

// registerSSO is the org's single sign-on: its settings (org admins) and
// the sign-in through its provider (public; 404 while it is off).
func (s *Server) registerSSO(api, pg *group) {
	s.sso = sso.NewService(s.OutboundHTTP, s.Now)
	api.handle(http.MethodGet, "/sso", rbac.Org("sso", "read"), s.apiGetSSO)
	api.handle(http.MethodPut, "/sso", rbac.Org("sso", "update"), s.apiPutSSO)
	api.handle(http.MethodPost, "/sso/test", rbac.Org("sso", "read"), s.apiTestSSO)
	pg.handle(http.MethodGet, "/sso", rbac.Org("sso", "read"), s.pageSSO)
	pg.handle(http.MethodPost, "/sso", rbac.Org("sso", "update"), s.pageSaveSSO)
	pg.handle(http.MethodPost, "/sso/test", rbac.Org("sso", "read"), s.pageTestSSO)
	pg.handle(http.MethodGet, "/sso/login", rbac.Public(), s.pageSSOStart)
	pg.handle(http.MethodGet, "/sso/callback", rbac.Public(), s.pageSSOCallback)
}

func orgCookieName(slug string) string { return orgCookiePrefix + slug }

// authorizeOrg opens the org named in the path, authenticates its
// principal with the org's own keys and checks casbin. Deny is the
// default; objects the caller may not see answer 404. The request's
// authz.Actor carries the principal into the domain services, which check
// each object where they read it; every refusal, route-level or
// object-level, is audited once the handler returned (outside its
// transaction). A refusal that cannot be recorded fails the request.
func (s *Server) authorizeOrg(c echo.Context, perm rbac.Perm, next echo.HandlerFunc) error {
	t, err := s.Tenants.Open(c.Request().Context(), c.Param("org"))
	if err != nil {
		return err
	}
	defer t.Release()
	c.Set(ctxTenant, t)
	if perm.Scope == rbac.ScopePublic {
		return next(c)
	}
	p, err := s.orgPrincipal(c, t)
	if err != nil {
		return err
	}
	c.Set(ctxPrincipal, p)
	if p.MustChangePassword && perm.Scope != rbac.ScopeOwnLogin {
		if !wantsJSON(c) && c.Request().Method == http.MethodGet {
			return c.Redirect(http.StatusSeeOther, "/o/"+t.Org.Slug+"/password")
		}
		return apperr.New(apperr.ErrForbidden, "password_change_required",
			"Change your one-time password (POST /api/v1/orgs/%s/auth/password) before doing anything else.", t.Org.Slug)
	}
	actor := authz.New(*p, t.Enforcer, s.denialRecorder(c, t))
	c.Set(ctxActor, actor)
	err = s.routeCheck(c, actor, perm, next)
	if ferr := actor.Flush(c.Request().Context()); ferr != nil {
		s.Logger.Error("denial not recorded", "org", t.Org.Slug, "request_id", requestID(c), "error", ferr)
		return ferr
	}
	return err
}

// routeCheck is the route's declared permission; the handler runs only
// when it allows.
func (s *Server) routeCheck(c echo.Context, actor *authz.Actor, perm rbac.Perm, next echo.HandlerFunc) error {
	if perm.SignedIn() {
		return next(c)
	}
	obj := perm.Resolve(c.Param)
	var dec rbac.Decision
	var err error
	dom := rbac.DomainOrg
	if dept := c.Param("dept"); dept != "" {
		id, perr := strconv.ParseInt(dept, 10, 64)
		if perr != nil {
			return notFoundErr()
		}
		dom = rbac.DeptDomain(id)
		dec, err = actor.Decide(c.Request().Context(), dom, obj, perm.Action)
	} else {
		dec, err = actor.DecideAnywhere(c.Request().Context(), obj, perm.Action)
	}
	if err != nil {
		return err
	}
	if dec.Allowed {
		return next(c)
	}
	// Specific objects answer 404 so their existence does not leak;
	// collections answer 403.
	hidden := false
	for _, name := range c.ParamNames() {
		if name != "org" {
			hidden = true
		}
	}
	return actor.Deny(authz.Denial{Target: audit.Target{Type: "route", ID: obj, Name: c.Request().Method + " " + c.Path()},
		Domain: dom, Object: obj, Action: perm.Action, Rule: authz.RuleText(dec), Hidden: hidden}, "")
}

func notFoundErr() error { return authz.NotFound() }

// denialRecorder writes an actor's refusals to the org's audit log, each
// with the object, the action and the rule that decided.
func (s *Server) denialRecorder(c echo.Context, t *tenant.Tenant) authz.Recorder {
	return func(ctx context.Context, ds []authz.Denial) error {
		for _, d := range ds {
			answer := "forbidden"
			if d.Hidden {
				answer = "not_found"
			}
			if d.Answer != "" {
				answer = d.Answer
			}
			if err := s.orgEvent(c, t, "authz.deny", d.Target, audit.Deny, map[string]string{
				"domain": d.Domain, "object": d.Object, "action": d.Action, "rule": d.Rule, "answered": answer}); err != nil {
				return err
			}
		}
		return nil
	}
}

// actorOf is the request's acting principal for domain services.
func actorOf(c echo.Context) *authz.Actor {
	a, _ := c.Get(ctxActor).(*authz.Actor)
	return a
}

func requestID(c echo.Context) string {
	return c.Response().Header().Get(echo.HeaderXRequestID)
}

// orgPrincipal authenticates a bearer JWT or API key, or the org's sign-in
// cookie. Logins, users and keys are read through the tenant's auth cache:
// disabling a user, revoking a key or signing out through this console
// takes effect on the next request (every update or delete of those rows
// clears the cache; a new row cannot make a cached success wrong); done on
// another replica, within directory.DefaultAuthTTL.
func (s *Server) orgPrincipal(c echo.Context, t *tenant.Tenant) (*authz.Principal, error) {
	r := c.Request()
	ctx := r.Context()
	unauth := apperr.New(apperr.ErrUnauthorized, "unauthenticated", "Sign in to this organization to continue.")
	tok, hasBearer := bearer(r)
	viaCookie := false
	if !hasBearer && r.Header.Get(echo.HeaderAuthorization) != "" {
		return nil, badAuthorization(r)
	}
	if !hasBearer {
		ck, err := r.Cookie(orgCookieName(t.Org.Slug))
		if err != nil || ck.Value == "" {
			return nil, unauth
		}
		tok, viaCookie = ck.Value, true
	}
	if strings.HasPrefix(tok, "gh_") && !viaCookie {
		k, owner, err := t.Auth.VerifyKey(ctx, t.Dir, tok)
		if err != nil {
			return nil, err
		}
		p := &authz.Principal{Kind: audit.ActorAPIKey, ID: itoa(k.ID), Name: k.Name + " (gh_" + k.Prefix + ")", Subject: k.Subject()}
		if owner != nil {
			p.Name = k.Name + " (gh_" + k.Prefix + ", key of " + owner.Email + ")"
			p.UserID = owner.ID
		}
		p.KeyID = k.ID
		if k.CreatedByUserID != nil {
			p.KeyCreatorID = *k.CreatedByUserID
		}
		return p, nil
	}
	claims, err := t.Signer.Verify(tok)
	if err != nil {
		return nil, unauth
	}
	user, ok, err := t.Auth.LoginUser(ctx, t.Dir, claims.LoginID, claims.Subject)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, unauth
	}
	p := &authz.Principal{LoginID: claims.LoginID, ViaCookie: viaCookie}
	switch {
	case strings.HasPrefix(claims.Subject, "user:"):
		if user == nil || user.Status != directory.StatusActive {
			return nil, unauth
		}
		u := *user
		p.Kind, p.ID, p.Name, p.Subject, p.UserID, p.MustChangePassword = audit.ActorUser, itoa(u.ID), u.Email, claims.Subject, u.ID, u.MustChangePassword
	case strings.HasPrefix(claims.Subject, "platform:"):
		adminID := strings.TrimPrefix(claims.Subject, "platform:")
		// An entered admin's org sign-in ends with their platform sign-in
		// (logout, expiry, deletion).
		if ok, err := s.Platform.LoginActive(ctx, claims.Parent, adminID); err != nil {
			return nil, err
		} else if !ok {
			return nil, unauth
		}
		p.Kind, p.ID, p.Name, p.Subject = audit.ActorPlatformAdmin, adminID, claims.Name, rbac.PlatformSubject
	default:
		return nil, unauth
	}
	return p, nil
}

// orgEvent appends to the org's audit log for the current request.
func (s *Server) orgEvent(c echo.Context, t *tenant.Tenant, action string, target audit.Target, decision string, details any) error {
	return s.appendOrg(c, t, principalOf(c).AuditActor(), action, target, decision, details)
}

// orgTx is one transaction on the org's database: domain services bound
// to it, and audit records that commit with the change or not at all.
type orgTx struct {
	s   *Server
	c   echo.Context
	tx  *gorm.DB
	Dir *directory.Directory
}

// Envs is the environments service inside the transaction.
func (m *orgTx) Envs() *envs.Service { return m.s.envServiceOn(m.c, m.tx) }

// Agents is the agents service inside the transaction.
func (m *orgTx) Agents() *agents.Service {
	return &agents.Service{DB: m.tx, Envs: m.Envs()}
}

// Sessions is the sessions service inside the transaction.
func (m *orgTx) Sessions() *sessions.Service { return m.s.sessionServiceOn(m.c, m.tx) }

// Actor is the request's acting principal.
func (m *orgTx) Actor() *authz.Actor { return actorOf(m.c) }

// audit appends the mutation's record in the same transaction.
func (m *orgTx) audit(action string, target audit.Target, details any) error {
	return m.auditAs(principalOf(m.c).AuditActor(), action, target, details)
}

// auditAs is audit with an explicit actor (at sign-in, before a principal
// exists).
func (m *orgTx) auditAs(actor audit.Actor, action string, target audit.Target, details any) error {
	_, err := tenantOf(m.c).Audit.AppendTx(m.c.Request().Context(), m.tx, requestEvent(m.c, actor, action, target, audit.Allow, details))
	return err
}

// mutate runs fn in one transaction so that nothing is half-written: a
// change whose audit record cannot be written is rolled back. Casbin
// writes go through their own adapter connection and stay outside fn.
func (s *Server) mutate(c echo.Context, fn func(m *orgTx) error) error {
	return tenantOf(c).DB.WithContext(c.Request().Context()).Transaction(func(tx *gorm.DB) error {
		return fn(&orgTx{s: s, c: c, tx: tx, Dir: tenantOf(c).Dir.In(tx)})
	})
}

// audited runs a mutation's audit record; callers return its error so a
// change that cannot be recorded is reported, never silently accepted.
func (s *Server) audited(c echo.Context, action string, target audit.Target, details any) error {
	return s.orgEvent(c, tenantOf(c), action, target, audit.Allow, details)
}

func idParam(c echo.Context, name string) (int64, error) {
	id, err := strconv.ParseInt(c.Param(name), 10, 64)
	if err != nil || id < 1 {
		return 0, notFoundErr()
	}
	return id, nil
}

// openLogin creates an org sign-in for subject (tied to a parent
// platform sign-in when set), signs its token, runs within (when set) and
// records action with details, all in one transaction: no login exists
// without its audit record.
func (s *Server) openLogin(c echo.Context, subject, name, parent string, actor audit.Actor, action string, target audit.Target, details any, within func(m *orgTx) error) (string, time.Time, error) {
	t := tenantOf(c)
	var tok string
	var exp time.Time
	err := s.mutate(c, func(m *orgTx) error {
		sid, err := m.Dir.CreateLogin(c.Request().Context(), subject, t.Signer.TTL())
		if err != nil {
			return err
		}
		if tok, exp, err = t.Signer.IssueChild(subject, sid, name, parent); err != nil {
			return err
		}
		if within != nil {
			if err := within(m); err != nil {
				return err
			}
		}
		return m.auditAs(actor, action, target, details)
	})
	return tok, exp, err
}
