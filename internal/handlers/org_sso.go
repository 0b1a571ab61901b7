package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sso"
	"github.com/gatehouse/gatehouse/internal/views"
)

// ssoStateCookie binds a sign-in under way to the browser that started
// it. Lax, not Strict: it must come back on the provider's top-level
// redirect to the callback.
func ssoStateCookie(slug string) string { return "gh_sso_" + slug }

func (s *Server) ssoStore(c echo.Context, db *gorm.DB) *sso.Store {
	return &sso.Store{DB: db, Box: s.Box, Org: tenantOf(c).Org.Slug, Now: s.Now}
}

func (s *Server) ssoConfig(c echo.Context) (sso.Config, bool, error) {
	return s.ssoStore(c, tenantOf(c).DB).Load(c.Request().Context())
}

// ssoCallbackURL is the redirect URI registered at the provider.
func (s *Server) ssoCallbackURL(c echo.Context) string {
	return s.absURL(c, "/o/"+tenantOf(c).Org.Slug+"/sso/callback")
}

// Settings (org admins).

func (s *Server) apiGetSSO(c echo.Context) error {
	cfg, _, err := s.ssoConfig(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, cfg.View())
}

func (s *Server) apiPutSSO(c echo.Context) error {
	var u sso.Update
	if err := decodeJSON(c, &u); err != nil {
		return err
	}
	after, err := s.saveSSO(c, u)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, after.View())
}

// saveSSO stores a configuration with its audit record in one
// transaction. The record shows the settings before and after, and of
// the secret only whether it was replaced.
func (s *Server) saveSSO(c echo.Context, u sso.Update) (sso.Config, error) {
	ctx := c.Request().Context()
	var after sso.Config
	err := s.mutate(c, func(m *orgTx) error {
		before, a, err := s.ssoStore(c, m.tx).Save(ctx, u, func(ctx context.Context, id int64) (bool, error) {
			_, err := m.Dir.GetDepartment(ctx, id)
			if errors.Is(err, apperr.ErrNotFound) {
				return false, nil
			}
			return err == nil, err
		})
		if err != nil {
			return err
		}
		after = a
		replaced := u.ClientSecret != nil && strings.TrimSpace(*u.ClientSecret) != ""
		return m.audit("sso.update", audit.Target{Type: "sso", ID: "oidc", Name: a.IssuerURL},
			map[string]any{"before": before.View(), "after": a.View(), "client_secret_replaced": replaced})
	})
	if err != nil {
		return after, err
	}
	s.sso.Forget(tenantOf(c).Org.Slug)
	return after, nil
}

func (s *Server) apiTestSSO(c echo.Context) error {
	r, err := s.testSSO(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}

// testSSO fetches the stored provider's discovery document and keys.
func (s *Server) testSSO(c echo.Context) (sso.Report, error) {
	cfg, ok, err := s.ssoConfig(c)
	if err != nil {
		return sso.Report{}, err
	}
	if !ok {
		return sso.Report{}, apperr.New(apperr.ErrConflict, "sso_not_configured", "Save an issuer URL and client ID first, then test them.")
	}
	r := s.sso.Probe(c.Request().Context(), cfg)
	return r, s.audited(c, "sso.test", audit.Target{Type: "sso", ID: "oidc", Name: cfg.IssuerURL},
		map[string]any{"ok": r.OK, "keys": len(r.Keys), "problems": r.Problems})
}

func (s *Server) pageSSO(c echo.Context) error {
	cfg, _, err := s.ssoConfig(c)
	if err != nil {
		return err
	}
	f, err := s.ssoForm(c, cfg)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.SSOSettings(s.orgPage(c, "Single sign-on"), f))
}

func (s *Server) pageSaveSSO(c echo.Context) error {
	u, mapErr := s.parseSSOForm(c)
	var err error
	if mapErr == "" {
		_, err = s.saveSSO(c, u)
	} else {
		err = &apperr.ValidationError{Fields: map[string]string{"mappings": mapErr}}
	}
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		cur, _, lerr := s.ssoConfig(c)
		if lerr != nil {
			return lerr
		}
		f, ferr := s.ssoForm(c, cur)
		if ferr != nil {
			return ferr
		}
		// Show what was typed (never the secret) next to the errors.
		f.ProviderName, f.IssuerURL, f.ClientID = u.ProviderName, u.IssuerURL, u.ClientID
		f.Scopes, f.EmailClaim, f.GroupsClaim = strings.Join(u.Scopes, " "), u.EmailClaim, u.GroupsClaim
		f.AllowedDomains, f.Mappings = strings.Join(u.AllowedDomains, " "), c.FormValue("mappings")
		f.Enabled, f.PasswordOff, f.Errors = u.Enabled, u.PasswordLoginDisabled, ve.Fields
		return render(c, http.StatusBadRequest, views.SSOSettings(s.orgPage(c, "Single sign-on"), f))
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Single sign-on settings saved.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/sso")
}

func (s *Server) pageTestSSO(c echo.Context) error {
	r, err := s.testSSO(c)
	var ae *apperr.Error
	if errors.As(err, &ae) && ae.Code == "sso_not_configured" {
		r, err = sso.Report{Problems: []string{ae.Message}}, nil
	}
	if err != nil {
		return err
	}
	cfg, _, err := s.ssoConfig(c)
	if err != nil {
		return err
	}
	f, err := s.ssoForm(c, cfg)
	if err != nil {
		return err
	}
	rep := &views.SSOReport{OK: r.OK, Problems: r.Problems}
	for _, kv := range [][2]string{{"Issuer", r.Issuer}, {"Authorization endpoint", r.AuthorizationEndpoint}, {"Token endpoint", r.TokenEndpoint},
		{"Key set", r.JWKSURI}, {"Signing algorithms", strings.Join(r.SigningAlgorithms, ", ")}, {"PKCE methods", strings.Join(r.PKCEMethods, ", ")}} {
		if kv[1] != "" {
			rep.Facts = append(rep.Facts, kv)
		}
	}
	for _, k := range r.Keys {
		rep.Facts = append(rep.Facts, [2]string{"Key " + k.ID, strings.TrimSpace(k.Type + " " + k.Algorithm + " " + k.Use)})
	}
	f.Report = rep
	return render(c, http.StatusOK, views.SSOSettings(s.orgPage(c, "Single sign-on"), f))
}

// ssoForm shows a configuration; mappings name departments by name.
func (s *Server) ssoForm(c echo.Context, cfg sso.Config) (views.SSOForm, error) {
	base := "/o/" + tenantOf(c).Org.Slug + "/sso"
	v := cfg.View()
	f := views.SSOForm{Action: base, TestAction: base + "/test", CallbackURL: s.ssoCallbackURL(c), ProviderName: v.ProviderName,
		IssuerURL: v.IssuerURL, ClientID: v.ClientID, SecretSet: v.ClientSecretSet, Scopes: strings.Join(v.Scopes, " "),
		EmailClaim: v.EmailClaim, GroupsClaim: v.GroupsClaim, AllowedDomains: strings.Join(v.AllowedDomains, " "),
		Enabled: v.Enabled, PasswordOff: v.PasswordLoginDisabled}
	if v.LastSuccessAt != nil {
		f.LastSuccess = views.When(*v.LastSuccessAt)
	}
	depts, err := tenantOf(c).Dir.ListDepartments(c.Request().Context(), nil)
	if err != nil {
		return f, err
	}
	names := map[int64]string{}
	for _, d := range depts {
		names[d.ID] = d.Name
	}
	var lines []string
	for _, m := range v.Mappings {
		line := m.Group + " = " + m.Role
		if m.DepartmentID != 0 {
			n := names[m.DepartmentID]
			if n == "" {
				n = fmt.Sprintf("#%d", m.DepartmentID)
			}
			line += " @ " + n
		}
		lines = append(lines, line)
	}
	f.Mappings = strings.Join(lines, "\n")
	return f, nil
}

// parseSSOForm reads the settings form; the second result explains a
// mapping line that cannot be read.
func (s *Server) parseSSOForm(c echo.Context) (sso.Update, string) {
	u := sso.Update{ProviderName: c.FormValue("provider_name"), IssuerURL: c.FormValue("issuer_url"), ClientID: c.FormValue("client_id"),
		Scopes: []string{c.FormValue("scopes")}, EmailClaim: c.FormValue("email_claim"), GroupsClaim: c.FormValue("groups_claim"),
		AllowedDomains: []string{c.FormValue("allowed_domains")}, Enabled: c.FormValue("enabled") == "on",
		PasswordLoginDisabled: c.FormValue("password_login_disabled") == "on"}
	if sec := c.FormValue("client_secret"); sec != "" {
		u.ClientSecret = &sec
	}
	depts, err := tenantOf(c).Dir.ListDepartments(c.Request().Context(), nil)
	if err != nil {
		return u, "The departments could not be read; try again."
	}
	for i, line := range strings.Split(c.FormValue("mappings"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		group, rest, ok := strings.Cut(line, "=")
		if !ok {
			return u, fmt.Sprintf("Line %d: write \"group = role\" or \"group = role @ Department\".", i+1)
		}
		role, dept, hasDept := strings.Cut(rest, "@")
		m := sso.Mapping{Group: strings.TrimSpace(group), Role: strings.TrimSpace(role)}
		if hasDept {
			name := strings.TrimSpace(dept)
			for _, d := range depts {
				if strings.EqualFold(d.Name, name) {
					m.DepartmentID = d.ID
				}
			}
			if m.DepartmentID == 0 {
				return u, fmt.Sprintf("Line %d: there is no department named %q.", i+1, name)
			}
		}
		u.Mappings = append(u.Mappings, m)
	}
	return u, ""
}

// Sign-in.

// withSSO adds the org's provider to its sign-in page. A configuration
// that cannot be read leaves the page as it was (logged): the password
// form must not disappear because of it.
func (s *Server) withSSO(c echo.Context, f views.LoginForm) views.LoginForm {
	cfg, ok, err := s.ssoConfig(c)
	if err != nil {
		s.Logger.Error("read sso config for the sign-in page", "org", tenantOf(c).Org.Slug, "request_id", requestID(c), "error", err)
		return f
	}
	if !ok || !cfg.Enabled {
		return f
	}
	f.SSOURL = "/o/" + tenantOf(c).Org.Slug + "/sso/login"
	if f.Next != "" {
		f.SSOURL += "?next=" + url.QueryEscape(f.Next)
	}
	f.SSOLabel, f.PasswordOff = cfg.Label(), cfg.PasswordLoginDisabled
	return f
}

// passwordSignInAllowed refuses (and audits) a password sign-in when the
// org turned password sign-in off. Platform admins enter through the
// platform console, which this does not touch.
func (s *Server) passwordSignInAllowed(c echo.Context, email string) error {
	cfg, ok, err := s.ssoConfig(c)
	if err != nil || !ok || !cfg.Enabled || !cfg.PasswordLoginDisabled {
		return err
	}
	t := tenantOf(c)
	if err := s.appendOrg(c, t, audit.Actor{Type: audit.ActorAnonymous, Name: email}, "user.login",
		audit.Target{Type: "organization", ID: t.Org.Slug}, audit.Deny, map[string]string{"reason": "password_login_disabled"}); err != nil {
		return err
	}
	return apperr.New(apperr.ErrForbidden, "password_login_disabled", "Password sign-in is turned off for this organization; sign in with %s.", cfg.Label())
}

func (s *Server) ssoLoginPage(c echo.Context, status int, msg string) error {
	f := s.orgLoginForm(c, "")
	f.Error = msg
	return render(c, status, views.Login(s.orgPage(c, "Sign in"), f))
}

// ssoRefused audits a refused sign-in and shows why on the sign-in page.
func (s *Server) ssoRefused(c echo.Context, cfg sso.Config, f *sso.Failure) error {
	t := tenantOf(c)
	details := map[string]string{"method": "sso", "reason": f.Reason, "issuer": cfg.IssuerURL}
	if f.Detail != "" {
		details["detail"] = sso.Redact(f.Detail, cfg.ClientSecret)
	}
	if err := s.appendOrg(c, t, audit.Actor{Type: audit.ActorAnonymous, Name: f.Email}, "sso.login",
		audit.Target{Type: "organization", ID: t.Org.Slug}, audit.Deny, details); err != nil {
		return err
	}
	status := http.StatusUnauthorized
	if f.Reason == "issuer_unreachable" {
		status = http.StatusBadGateway
	}
	return s.ssoLoginPage(c, status, f.Message)
}

// enabledSSO is the org's provider when sign-in through it is on; the
// sign-in routes do not exist otherwise.
func (s *Server) enabledSSO(c echo.Context) (sso.Config, error) {
	cfg, ok, err := s.ssoConfig(c)
	if err != nil {
		return cfg, err
	}
	if !ok || !cfg.Enabled {
		return cfg, notFoundErr()
	}
	return cfg, nil
}

func (s *Server) pageSSOStart(c echo.Context) error {
	t := tenantOf(c)
	cfg, err := s.enabledSSO(c)
	if err != nil {
		return err
	}
	authURL, state, err := s.sso.Begin(c.Request().Context(), t.DB, t.Org.Slug, cfg, s.ssoCallbackURL(c), safeNext(c.QueryParam("next"), ""))
	var f *sso.Failure
	if errors.As(err, &f) {
		return s.ssoRefused(c, cfg, f)
	}
	if err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{Name: ssoStateCookie(t.Org.Slug), Value: state, Path: "/o/" + t.Org.Slug + "/sso/",
		MaxAge: int(sso.StateTTL.Seconds()), HttpOnly: true, Secure: s.SecureCookies, SameSite: http.SameSiteLaxMode})
	return c.Redirect(http.StatusSeeOther, authURL)
}

func (s *Server) pageSSOCallback(c echo.Context) error {
	t := tenantOf(c)
	ctx := c.Request().Context()
	cfg, err := s.enabledSSO(c)
	if err != nil {
		return err
	}
	cb := sso.Callback{State: c.QueryParam("state"), Code: c.QueryParam("code"), Error: c.QueryParam("error"),
		ErrorDescription: c.QueryParam("error_description")}
	if ck, err := c.Cookie(ssoStateCookie(t.Org.Slug)); err == nil {
		cb.CookieState = ck.Value
	}
	c.SetCookie(&http.Cookie{Name: ssoStateCookie(t.Org.Slug), Value: "", Path: "/o/" + t.Org.Slug + "/sso/", MaxAge: -1,
		HttpOnly: true, Secure: s.SecureCookies, SameSite: http.SameSiteLaxMode})
	id, err := s.sso.Finish(ctx, t.DB, t.Org.Slug, cfg, s.ssoCallbackURL(c), cb)
	var f *sso.Failure
	if errors.As(err, &f) {
		return s.ssoRefused(c, cfg, f)
	}
	if err != nil {
		return err
	}
	u, err := s.ssoUser(c, cfg, id)
	if errors.As(err, &f) {
		return s.ssoRefused(c, cfg, f)
	}
	if err != nil {
		return err
	}
	if err := s.syncSSORoles(c, cfg, u, id.Groups); err != nil {
		return err
	}
	// The sign-in, its token, its audit record and the provider's proof
	// of life are written in one transaction.
	user := audit.Actor{Type: audit.ActorUser, ID: itoa(u.ID), Name: u.Email}
	tok, exp, err := s.openLogin(c, directory.UserSubject(u.ID), u.Email, "", user, "user.login",
		audit.Target{Type: "user", ID: itoa(u.ID), Name: u.Email}, map[string]string{"method": "sso", "issuer": cfg.IssuerURL},
		func(m *orgTx) error { return s.ssoStore(c, m.tx).MarkSuccess(ctx, m.tx) })
	if err != nil {
		return err
	}
	s.setLoginCookie(c, orgCookieName(t.Org.Slug), tok, exp)
	return c.Redirect(http.StatusSeeOther, safeNext(id.Next, "/o/"+t.Org.Slug+"/"))
}

// ssoActor is who changes roles at sign-in: the org's provider.
func ssoActor(cfg sso.Config) audit.Actor {
	return audit.Actor{Type: audit.ActorSystem, ID: "sso", Name: "sso " + cfg.IssuerURL}
}

// ssoUser finds, links or creates the user in one transaction with the
// audit record of what it did; a refusal writes nothing.
func (s *Server) ssoUser(c echo.Context, cfg sso.Config, id sso.Identity) (directory.User, error) {
	var u directory.User
	err := s.mutate(c, func(m *orgTx) error {
		var outcome string
		var err error
		if u, outcome, err = sso.Resolve(c.Request().Context(), m.tx, cfg, id, s.Now().UTC()); err != nil {
			return err
		}
		target := audit.Target{Type: "user", ID: itoa(u.ID), Name: u.Email}
		details := map[string]string{"issuer": id.Issuer, "subject": id.Subject}
		switch outcome {
		case sso.OutcomeCreated:
			return m.auditAs(ssoActor(cfg), "user.create", target, details)
		case sso.OutcomeLinked:
			return m.auditAs(ssoActor(cfg), "sso.link", target, details)
		}
		return nil
	})
	return u, err
}

// syncSSORoles applies the group mapping: roles the groups give are
// added, roles the mapping gave before and the groups no longer give are
// removed; roles assigned by hand stay. Each change is audited; one whose
// record cannot be written is undone.
func (s *Server) syncSSORoles(c echo.Context, cfg sso.Config, u directory.User, groups []string) error {
	t := tenantOf(c)
	ctx := c.Request().Context()
	sub := directory.UserSubject(u.ID)
	var desired []rbac.Assignment
	for _, a := range cfg.Desired(sub, groups) {
		if id, ok := strings.CutPrefix(a.Domain, "dept:"); ok {
			// A mapping to a department deleted since is skipped.
			if n, err := parseID(id); err != nil {
				continue
			} else if _, err := t.Dir.GetDepartment(ctx, n); err != nil {
				continue
			}
		}
		desired = append(desired, a)
	}
	held, err := t.Enforcer.Assignments(sub, "")
	if err != nil {
		return err
	}
	granted, err := sso.Grants(ctx, t.DB, u.ID)
	if err != nil {
		return err
	}
	plan := sso.PlanRoles(desired, held, granted)
	change := func(a rbac.Assignment, add bool) error {
		action, key := "role.unassign", "before"
		if add {
			action, key = "role.assign", "after"
		}
		return s.auditedRolesBy(c, a.Subject, a.Domain, func() error {
			var err error
			if add {
				_, err = t.Enforcer.Assign(ctx, a)
			} else {
				_, err = t.Enforcer.Unassign(ctx, a)
			}
			return err
		}, func() error {
			if err := sso.SetGrant(ctx, t.DB, u.ID, a, add); err != nil {
				return err
			}
			err := s.appendOrg(c, t, ssoActor(cfg), action, audit.Target{Type: "subject", ID: a.Subject, Name: u.Email}, audit.Allow,
				map[string]any{key: a, "source": "sso", "groups": groups})
			if err != nil {
				_ = sso.SetGrant(context.WithoutCancel(ctx), t.DB, u.ID, a, !add)
			}
			return err
		})
	}
	for _, a := range plan.Add {
		if err := change(a, true); err != nil {
			return err
		}
	}
	for _, a := range plan.Remove {
		if err := change(a, false); err != nil {
			return err
		}
	}
	return nil
}
