package handlers

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/tenant"
	"github.com/gatehouse/gatehouse/internal/views"
)

// orgLogin signs an org user in with per-address and per-account
// throttling and audits the outcome. Unknown email, wrong password and a
// disabled account fail identically.
func (s *Server) orgLogin(c echo.Context, email, password string) (directory.User, loginResponse, error) {
	t := tenantOf(c)
	ctx := c.Request().Context()
	email = auth.NormalizeEmail(email)
	var u directory.User
	if err := s.passwordSignInAllowed(c, email); err != nil {
		return u, loginResponse{}, err
	}
	keys := auth.LoginKeys{Address: "org:" + t.Org.Slug + ":ip:" + c.RealIP(), Account: "org:" + t.Org.Slug + ":acct:" + email}
	err := s.Throttle.Attempt(ctx, keys, s.Sleep, func() (bool, error) {
		var ok bool
		var err error
		u, ok, err = t.Dir.CheckLogin(ctx, email, password)
		return ok, err
	})
	if err != nil {
		err = platform.LoginError(err)
		var ae *apperr.Error
		reason := "error"
		if errors.As(err, &ae) {
			reason = ae.Code
		}
		actor := audit.Actor{Type: audit.ActorAnonymous, Name: email}
		if aerr := s.appendOrg(c, t, actor, "user.login", audit.Target{Type: "organization", ID: t.Org.Slug}, audit.Deny, map[string]string{"reason": reason}); aerr != nil {
			return u, loginResponse{}, aerr
		}
		return u, loginResponse{}, err
	}
	actor := audit.Actor{Type: audit.ActorUser, ID: itoa(u.ID), Name: u.Email}
	tok, exp, err := s.openLogin(c, directory.UserSubject(u.ID), u.Email, "", actor, "user.login", audit.Target{Type: "user", ID: itoa(u.ID), Name: u.Email}, nil, nil)
	if err != nil {
		return u, loginResponse{}, err
	}
	return u, loginResponse{Token: tok, ExpiresAt: exp, MustChangePassword: u.MustChangePassword}, nil
}

// appendOrg appends an event with an explicit actor (before a principal
// exists, at sign-in).
func (s *Server) appendOrg(c echo.Context, t *tenant.Tenant, actor audit.Actor, action string, target audit.Target, decision string, details any) error {
	return s.appendTo(c, t.Audit, "org "+t.Org.Slug, requestEvent(c, actor, action, target, decision, details))
}

func (s *Server) apiOrgLogin(c echo.Context) error {
	var req loginRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	_, resp, err := s.orgLogin(c, req.Email, req.Password)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, resp)
}

func (s *Server) apiOrgLogout(c echo.Context) error {
	if err := s.orgLogout(c); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) orgLogout(c echo.Context) error {
	p := principalOf(c)
	if p.LoginID == "" {
		return apperr.New(apperr.ErrInvalid, "not_a_login", "API keys have no sign-in to end; revoke the key instead.")
	}
	return s.mutate(c, func(m *orgTx) error {
		if err := m.Dir.RevokeLogin(c.Request().Context(), p.LoginID); err != nil {
			return err
		}
		return m.audit("user.logout", audit.Target{Type: p.Kind, ID: p.ID, Name: p.Name}, nil)
	})
}

func (s *Server) orgChangePassword(c echo.Context, current, next string) error {
	p := principalOf(c)
	if p.Kind != audit.ActorUser || p.KeyID != 0 {
		return apperr.New(apperr.ErrForbidden, "not_a_user", "Only a signed-in user can change their password.")
	}
	return s.mutate(c, func(m *orgTx) error {
		if err := m.Dir.ChangePassword(c.Request().Context(), p.UserID, current, next); err != nil {
			return err
		}
		return m.audit("user.password_change", audit.Target{Type: "user", ID: p.ID, Name: p.Name}, nil)
	})
}

func (s *Server) apiOrgChangePassword(c echo.Context) error {
	var req passwordRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if err := s.orgChangePassword(c, req.Current, req.New); err != nil {
		return apiPasswordFields(err)
	}
	return c.NoContent(http.StatusNoContent)
}

type meResponse struct {
	Kind        string           `json:"kind"`
	ID          string           `json:"id"`
	Name        string           `json:"name"`
	Org         string           `json:"org"`
	Assignments []assignmentJSON `json:"roles"`
	MustChange  bool             `json:"must_change_password"`
}

type assignmentJSON struct {
	Subject string `json:"subject"`
	Role    string `json:"role"`
	Domain  string `json:"domain"`
}

func (s *Server) apiOrgMe(c echo.Context) error {
	p, t := principalOf(c), tenantOf(c)
	resp := meResponse{Kind: p.Kind, ID: p.ID, Name: p.Name, Org: t.Org.Slug, MustChange: p.MustChangePassword, Assignments: []assignmentJSON{}}
	as, err := t.Enforcer.Assignments(p.Subject, "")
	if err != nil {
		return err
	}
	for _, a := range as {
		resp.Assignments = append(resp.Assignments, assignmentJSON(a))
	}
	return c.JSON(http.StatusOK, resp)
}

// enterOrg lets a platform admin into an org as an org-admin, for a
// sign-in recorded in both the platform and the org audit log.
func (s *Server) enterOrg(c echo.Context) (string, error) {
	ctx := c.Request().Context()
	t, err := s.Tenants.Open(ctx, c.Param("org"))
	if err != nil {
		return "", err
	}
	defer t.Release()
	c.Set(ctxTenant, t)
	p := principalOf(c)
	target := audit.Target{Type: "organization", ID: t.Org.Slug, Name: t.Org.Name}
	if err := s.platformEvent(c, p.AuditActor(), "org.enter", target, audit.Allow, nil); err != nil {
		return "", err
	}
	tok, _, err := s.openLogin(c, "platform:"+p.ID, p.Name, p.LoginID, p.AuditActor(), "org.enter", target, nil, nil)
	return tok, err
}

func (s *Server) apiEnterOrg(c echo.Context) error {
	tok, err := s.enterOrg(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]string{"token": tok})
}

func (s *Server) pageEnterOrg(c echo.Context) error {
	tok, err := s.enterOrg(c)
	if err != nil {
		return err
	}
	s.setLoginCookie(c, orgCookieName(c.Param("org")), tok, s.Now().Add(s.Platform.Signer.TTL()))
	return c.Redirect(http.StatusSeeOther, "/o/"+c.Param("org")+"/")
}

// orgPage builds page state for an org page with navigation limited to
// what the principal may open.
func (s *Server) orgPage(c echo.Context, title string) views.Page {
	csrf, _ := c.Get(ctxCSRF).(string)
	t := tenantOf(c)
	base := "/o/" + t.Org.Slug
	p := views.Page{Title: title + " · " + t.Org.Name, CSRF: csrf, Flash: s.takeFlash(c), LogoutURL: base + "/logout"}
	pr := principalOf(c)
	if pr == nil {
		return p
	}
	p.User = pr.Name
	if pr.Kind == audit.ActorPlatformAdmin {
		p.ActingOrg, p.LeaveURL = t.Org.Name, base+"/leave"
	}
	if pr.MustChangePassword {
		return p
	}
	path := c.Path()
	items := []struct{ label, href, obj, act string }{
		{"Home", base + "/", "", ""},
		{"Users", base + "/users", "users", "read"},
		{"Departments", base + "/departments", "departments", "read"},
		{"Agents", base + "/agents", "", ""},
		{"Sessions", base + "/sessions", "", ""},
		{"Environments", base + "/environments", "", ""},
		{"API keys", base + "/api-keys", "", ""},
		// Those who may start some agent's sessions may mint e2b keys.
		{"E2B endpoint", base + "/e2b", "agents/*", "use"},
		{"Recordings", base + "/recordings", "recordings", "read"},
		// Those who may decide some department's requests see the queue
		// and how many wait for them; requesters reach it by its address.
		{"Approvals", base + "/approvals", approvals.Object, approvals.ActionDecide},
		{"Audit log", base + "/audit", "audit", "read"},
		{"Single sign-on", base + "/sso", "sso", "read"},
	}
	for _, it := range items {
		if it.obj != "" {
			ok, err := t.Enforcer.AllowedAnywhere(c.Request().Context(), pr.Subject, it.obj, it.act)
			if err != nil {
				// The page itself was authorized; a failed check here only
				// hides a link, and is logged rather than shown as a denial.
				s.Logger.Error("navigation check failed", "org", t.Org.Slug, "object", it.obj, "request_id", requestID(c), "error", err)
			}
			if !ok {
				continue
			}
		}
		rel, target := strings.TrimPrefix(path, "/o/:org"), strings.TrimPrefix(it.href, base)
		active := rel == target || (target != "/" && strings.HasPrefix(rel, target))
		n := views.NavItem{Label: it.label, Href: it.href, Active: active}
		if it.label == "Approvals" {
			n.TestID, n.Count = "nav-approvals", s.pendingCount(c)
		}
		p.Nav = append(p.Nav, n)
	}
	return p
}

// orgLoginForm is the org's sign-in form, with its provider when SSO is
// on; next is where to go after.
func (s *Server) orgLoginForm(c echo.Context, next string) views.LoginForm {
	t := tenantOf(c)
	return s.withSSO(c, views.LoginForm{Action: "/o/" + t.Org.Slug + "/login", Heading: "Sign in to " + t.Org.Name, Next: next})
}

func (s *Server) pageOrgLogin(c echo.Context) error {
	return render(c, http.StatusOK, views.Login(s.orgPage(c, "Sign in"), s.orgLoginForm(c, c.QueryParam("next"))))
}

func (s *Server) pageOrgLoginSubmit(c echo.Context) error {
	t := tenantOf(c)
	email, next := c.FormValue("email"), c.FormValue("next")
	u, resp, err := s.orgLogin(c, email, c.FormValue("password"))
	if err != nil {
		status, body := classify(err)
		if status >= 500 {
			return err
		}
		f := s.orgLoginForm(c, next)
		f.Email, f.Error = email, body.Message
		return render(c, status, views.Login(s.orgPage(c, "Sign in"), f))
	}
	s.setLoginCookie(c, orgCookieName(t.Org.Slug), resp.Token, resp.ExpiresAt)
	if u.MustChangePassword {
		return c.Redirect(http.StatusSeeOther, "/o/"+t.Org.Slug+"/password")
	}
	return c.Redirect(http.StatusSeeOther, safeNext(next, "/o/"+t.Org.Slug+"/"))
}

func (s *Server) pageOrgLogout(c echo.Context) error {
	t := tenantOf(c)
	if principalOf(c).LoginID != "" {
		if err := s.orgLogout(c); err != nil {
			return err
		}
	}
	s.clearCookie(c, orgCookieName(t.Org.Slug))
	return c.Redirect(http.StatusSeeOther, s.afterOrgSignOut(c))
}

func (s *Server) pageOrgPassword(c echo.Context) error {
	return render(c, http.StatusOK, views.ChangePassword(s.orgPage(c, "Change password"),
		views.PasswordForm{Action: "/o/" + tenantOf(c).Org.Slug + "/password", Required: principalOf(c).MustChangePassword}))
}

func (s *Server) pageOrgPasswordSubmit(c echo.Context) error {
	t := tenantOf(c)
	err := s.orgChangePassword(c, c.FormValue("current"), c.FormValue("new"))
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return render(c, http.StatusBadRequest, views.ChangePassword(s.orgPage(c, "Change password"),
			views.PasswordForm{Action: "/o/" + t.Org.Slug + "/password", Required: principalOf(c).MustChangePassword, Errors: ve.Fields}))
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Your password was changed.")
	return c.Redirect(http.StatusSeeOther, "/o/"+t.Org.Slug+"/")
}

func (s *Server) pageOrgHome(c echo.Context) error {
	p, t := principalOf(c), tenantOf(c)
	var roles []views.RoleRow
	as, err := t.Enforcer.Assignments(p.Subject, "")
	if err != nil {
		return err
	}
	for _, a := range as {
		roles = append(roles, views.RoleRow{Role: a.Role, Domain: s.domainLabel(c.Request().Context(), t, a.Domain)})
	}
	if p.Kind == audit.ActorPlatformAdmin {
		// An entered platform admin acts as an org admin of the whole
		// organization (rbac.PlatformSubject), which no assignment lists.
		roles = append(roles, views.RoleRow{Role: rbac.RoleOrgAdmin, Domain: "whole organization, as platform admin"})
	}
	glance, err := s.orgGlance(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.OrgHome(s.orgPage(c, "Home"), views.OrgHomeData{Org: t.Org.Name, Slug: t.Org.Slug, Roles: roles, Glance: glance}))
}

// domainLabel names a casbin domain for people.
func (s *Server) domainLabel(ctx context.Context, t *tenant.Tenant, dom string) string {
	return s.domainLabels(ctx, t, []string{dom})(dom)
}

// domainLabels names casbin domains for people, reading the departments
// doms name in one query, for pages that name many. A department that
// cannot be read (deleted, or the query failed) is named by its number.
func (s *Server) domainLabels(ctx context.Context, t *tenant.Tenant, doms []string) func(dom string) string {
	// deptID is the department dom names: its id as written, and as a
	// number (0 when it is not one).
	deptID := func(dom string) (string, int64, bool) {
		id, ok := strings.CutPrefix(dom, "dept:")
		n, _ := parseID(id)
		return id, n, ok
	}
	var ids []int64
	for _, dom := range doms {
		if _, n, ok := deptID(dom); ok && n != 0 {
			ids = append(ids, n)
		}
	}
	names := map[int64]string{}
	if len(ids) > 0 {
		depts, err := t.Dir.ListDepartments(ctx, ids)
		if err != nil {
			s.Logger.Warn("read department names", "org", t.Org.Slug, "error", err)
		}
		for _, d := range depts {
			names[d.ID] = d.Name
		}
	}
	return func(dom string) string {
		id, n, ok := deptID(dom)
		if !ok {
			return "whole organization"
		}
		if name, found := names[n]; found {
			return "department " + name
		}
		return "department #" + id
	}
}
