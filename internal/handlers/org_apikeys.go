package handlers

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/views"
)

type keyJSON struct {
	ID          int64               `json:"id"`
	Name        string              `json:"name"`
	Masked      string              `json:"masked"`
	Kind        string              `json:"kind"`
	OwnerUserID *int64              `json:"owner_user_id"`
	Roles       []directory.KeyRole `json:"roles"`
	CreatedBy   string              `json:"created_by"`
	CreatedAt   time.Time           `json:"created_at"`
	ExpiresAt   *time.Time          `json:"expires_at"`
	LastUsedAt  *time.Time          `json:"last_used_at"`
	RevokedAt   *time.Time          `json:"revoked_at"`
}

func toKeyJSON(k directory.APIKey) keyJSON {
	kind := "personal"
	if k.IsService() {
		kind = "service"
	}
	if k.IsE2B() {
		kind = "e2b"
	}
	roles := k.RoleList()
	if roles == nil {
		roles = []directory.KeyRole{}
	}
	return keyJSON{ID: k.ID, Name: k.Name, Masked: k.Masked(), Kind: kind, OwnerUserID: k.OwnerUserID, Roles: roles,
		CreatedBy: k.CreatedBy, CreatedAt: k.CreatedAt.UTC(), ExpiresAt: k.ExpiresAt, LastUsedAt: k.LastUsedAt, RevokedAt: k.RevokedAt}
}

func keyTarget(k directory.APIKey) audit.Target {
	return audit.Target{Type: "api_key", ID: itoa(k.ID), Name: k.Name + " (" + k.Label() + ")"}
}

// keysDenial is the refusal to manage another principal's keys.
func keysDenial(target audit.Target, action string) authz.Denial {
	return authz.Denial{Target: target, Domain: rbac.DomainOrg, Object: "api-keys", Action: action}
}

// canManageKeys reports whether the principal manages every key of the org.
func (s *Server) canManageKeys(c echo.Context) (bool, error) {
	return actorOf(c).Allowed(c.Request().Context(), rbac.DomainOrg, "api-keys", "manage")
}

// visibleKeys is every key for key managers, else the caller's own.
func (s *Server) visibleKeys(c echo.Context) ([]directory.APIKey, error) {
	p := principalOf(c)
	all, err := s.canManageKeys(c)
	if err != nil {
		return nil, err
	}
	if all {
		return tenantOf(c).Dir.ListKeys(c.Request().Context(), nil)
	}
	if p.UserID == 0 {
		return []directory.APIKey{}, nil
	}
	return tenantOf(c).Dir.ListKeys(c.Request().Context(), &p.UserID)
}

func (s *Server) apiListKeys(c echo.Context) error {
	ks, err := s.visibleKeys(c)
	if err != nil {
		return err
	}
	out := make([]keyJSON, len(ks))
	for i, k := range ks {
		out[i] = toKeyJSON(k)
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out})
}

type createKeyRequest struct {
	Name      string              `json:"name"`
	Service   bool                `json:"service"`
	Roles     []directory.KeyRole `json:"roles"`
	ExpiresAt *time.Time          `json:"expires_at"`
}

type createKeyResponse struct {
	Key    keyJSON `json:"key"`
	Secret string  `json:"secret"`
}

// createKey makes a personal key for the signed-in user, or a service key
// with chosen roles for key managers. Keys cannot mint keys.
func (s *Server) createKey(c echo.Context, req createKeyRequest) (directory.APIKey, string, error) {
	t, p := tenantOf(c), principalOf(c)
	ctx := c.Request().Context()
	if p.KeyID != 0 {
		return directory.APIKey{}, "", apperr.New(apperr.ErrForbidden, "keys_cannot_mint_keys", "An API key cannot create API keys; sign in as a user.")
	}
	in := directory.NewKey{Name: req.Name, CreatedBy: p.Name, ExpiresAt: req.ExpiresAt}
	if p.UserID != 0 {
		uid := p.UserID
		in.CreatedByUserID = &uid
	}
	if req.Service {
		if err := actorOf(c).Require(ctx, keysDenial(audit.Target{Type: "api_key", Name: req.Name}, "manage"),
			"Only organization admins create service keys."); err != nil {
			return directory.APIKey{}, "", err
		}
		for _, r := range req.Roles {
			if msg := rbac.ValidAssignment(rbac.Assignment{Role: r.Role, Domain: r.Domain}); msg != "" {
				return directory.APIKey{}, "", &apperr.ValidationError{Fields: map[string]string{"roles": msg}}
			}
		}
		in.Roles = req.Roles
	} else {
		if p.UserID == 0 {
			return directory.APIKey{}, "", apperr.New(apperr.ErrForbidden, "not_a_user", "Personal keys belong to users; create a service key instead.")
		}
		in.Owner = &p.UserID
		in.Roles = req.Roles
	}
	var k directory.APIKey
	var secret string
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if k, secret, err = m.Dir.CreateKey(ctx, in); err != nil {
			return err
		}
		return m.audit("api_key.create", keyTarget(k), map[string]any{"after": map[string]any{
			"name": k.Name, "kind": toKeyJSON(k).Kind, "roles": k.RoleList(), "expires_at": k.ExpiresAt, "secret": "[redacted]"}})
	})
	if err != nil {
		return k, "", err
	}
	// Until its roles are in place a service key can do nothing; if they
	// cannot be granted, the key is revoked rather than left half-made.
	for _, r := range k.RoleList() {
		if _, err := t.Enforcer.Assign(ctx, rbac.Assignment{Subject: k.Subject(), Role: r.Role, Domain: r.Domain}); err != nil {
			if _, rerr := s.revokeKeyRow(c, k.ID, "its roles could not be granted"); rerr != nil {
				s.Logger.Error("revoke half-made api key", "org", t.Org.Slug, "key", k.ID, "error", rerr)
			}
			return k, "", err
		}
	}
	return k, secret, nil
}

// revokeKeyRow revokes a key and records it in one transaction.
func (s *Server) revokeKeyRow(c echo.Context, id int64, reason string) (directory.APIKey, error) {
	var k directory.APIKey
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if k, err = m.Dir.RevokeKey(c.Request().Context(), id); err != nil {
			return err
		}
		var details any
		if reason != "" {
			details = map[string]string{"reason": reason}
		}
		action := "api_key.revoke"
		if k.IsE2B() {
			action = "e2b_key.revoke"
		}
		return m.audit(action, keyTarget(k), details)
	})
	return k, err
}

func (s *Server) apiCreateKey(c echo.Context) error {
	var req createKeyRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	k, secret, err := s.createKey(c, req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, createKeyResponse{Key: toKeyJSON(k), Secret: secret})
}

// revokeKey revokes the caller's own key, or any key for key managers; a
// key the caller may not see is 404.
func (s *Server) revokeKey(c echo.Context, id int64) (directory.APIKey, error) {
	t := tenantOf(c)
	ctx := c.Request().Context()
	k, err := t.Dir.GetKey(ctx, id)
	if errors.Is(err, apperr.ErrNotFound) {
		return k, notFoundErr() // the same answer as for someone else's key
	}
	if err != nil {
		return k, err
	}
	if !actorOf(c).Owns(k.OwnerUserID) {
		d := keysDenial(keyTarget(k), "manage")
		d.Hidden = true
		if err := actorOf(c).Require(ctx, d, ""); err != nil {
			return k, err
		}
	}
	if k, err = s.revokeKeyRow(c, id, ""); err != nil {
		return k, err
	}
	if k.IsService() {
		// A revoked key no longer authenticates, so its grants are inert;
		// removing them after the commit only tidies the policy.
		if err := t.Enforcer.RemoveSubject(ctx, k.Subject()); err != nil {
			return k, err
		}
	}
	return k, nil
}

func (s *Server) apiRevokeKey(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	if _, err := s.revokeKey(c, id); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Pages.

func (s *Server) renderKeys(c echo.Context, status int, secret string, form views.KeyForm) error {
	ks, err := s.visibleKeys(c)
	if err != nil {
		return err
	}
	var doms []string
	for _, k := range ks {
		for _, r := range k.RoleList() {
			doms = append(doms, r.Domain)
		}
	}
	label := s.domainLabels(c.Request().Context(), tenantOf(c), doms)
	rows := make([]views.KeyRow, len(ks))
	for i, k := range ks {
		j := toKeyJSON(k)
		var roles []string
		for _, r := range j.Roles {
			roles = append(roles, views.RoleLabel(r.Role, label(r.Domain)))
		}
		rows[i] = views.KeyRow{ID: k.ID, Name: k.Name, Masked: j.Masked, Kind: j.Kind, Roles: strings.Join(roles, ", "),
			CreatedBy: k.CreatedBy, CreatedAt: k.CreatedAt, ExpiresAt: k.ExpiresAt, LastUsedAt: k.LastUsedAt, Revoked: k.RevokedAt != nil}
	}
	if form.CanService, err = s.canManageKeys(c); err != nil {
		return err
	}
	// Only a signed-in user can own a personal key; a platform admin who
	// entered the org is offered service keys alone.
	p := principalOf(c)
	form.CanPersonal = p.UserID != 0 && p.KeyID == 0
	form.CanService = form.CanService && p.KeyID == 0
	rows, ls := sortPage(c, rows, sortKeys[views.KeyRow]{
		"name": byText(func(k views.KeyRow) string { return k.Name }), "kind": byText(func(k views.KeyRow) string { return k.Kind }),
		"created":   func(a, b views.KeyRow) int { return a.CreatedAt.Compare(b.CreatedAt) },
		"expires":   func(a, b views.KeyRow) int { return cmpTime(a.ExpiresAt, b.ExpiresAt) },
		"last_used": func(a, b views.KeyRow) int { return cmpTime(a.LastUsedAt, b.LastUsedAt) },
	}, "name", nil)
	return render(c, status, views.APIKeys(s.orgPage(c, "API keys"), views.KeysData{Slug: tenantOf(c).Org.Slug, Rows: rows, Secret: secret,
		DismissURL: keysPath(c) + "/dismiss-secret", TryURL: s.absURL(c, "/api/v1/orgs/"+tenantOf(c).Org.Slug+"/me"), Form: form, List: ls}))
}

func (s *Server) pageKeys(c echo.Context) error {
	return s.renderKeys(c, http.StatusOK, s.keptReveal(c, keysPath(c)), views.KeyForm{})
}

func keysPath(c echo.Context) string { return "/o/" + tenantOf(c).Org.Slug + "/api-keys" }

func keysPathParam(c echo.Context) (string, error) { return keysPath(c), nil }

func (s *Server) pageCreateKey(c echo.Context) error {
	req := createKeyRequest{Name: c.FormValue("name"), Service: c.FormValue("kind") == "service"}
	if r := c.FormValue("role"); req.Service && r != "" {
		dom := rbac.DomainOrg
		if r == rbac.RoleDeptOwner || r == rbac.RoleMember {
			dom = c.FormValue("domain")
		}
		req.Roles = []directory.KeyRole{{Role: r, Domain: dom}}
	}
	if v := c.FormValue("expires_in_days"); v != "" {
		n, err := parseID(v)
		if err != nil || n > 3650 {
			return s.renderKeys(c, http.StatusBadRequest, "", views.KeyForm{Name: req.Name, Errors: map[string]string{"expires_in_days": "Enter a whole number of days from 1 to 3650, or leave it empty."}})
		}
		exp := s.Now().Add(time.Duration(n) * 24 * time.Hour)
		req.ExpiresAt = &exp
	}
	_, secret, err := s.createKey(c, req)
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return s.renderKeys(c, http.StatusBadRequest, "", views.KeyForm{Name: req.Name, Errors: ve.Fields})
	}
	if err != nil {
		return err
	}
	return s.redirectRevealing(c, keysPath(c), secret)
}

func (s *Server) pageRevokeKey(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	k, err := s.revokeKey(c, id)
	if err != nil {
		return err
	}
	s.setFlash(c, "The key "+k.Name+" was revoked.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/api-keys")
}
