package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/views"
)

// e2bKeyJSON is an e2b key as listed: masked, with its agent.
type e2bKeyJSON struct {
	ID         int64      `json:"id"`
	Name       string     `json:"name"`
	Masked     string     `json:"masked"`
	AgentID    int64      `json:"agent_id"`
	CreatedBy  string     `json:"created_by"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

func toE2BKeyJSON(k directory.APIKey) e2bKeyJSON {
	return e2bKeyJSON{ID: k.ID, Name: k.Name, Masked: k.Masked(), AgentID: *k.AgentID, CreatedBy: k.CreatedBy, CreatedAt: k.CreatedAt.UTC(),
		LastUsedAt: utcPtr(k.LastUsedAt), RevokedAt: utcPtr(k.RevokedAt)}
}

// visibleE2BKeys is the e2b keys among the keys the caller may see (every
// key for key managers, else their own).
func (s *Server) visibleE2BKeys(c echo.Context) ([]directory.APIKey, error) {
	ks, err := s.visibleKeys(c)
	if err != nil {
		return nil, err
	}
	out := []directory.APIKey{}
	for _, k := range ks {
		if k.IsE2B() {
			out = append(out, k)
		}
	}
	return out, nil
}

type createE2BKeyRequest struct {
	AgentID int64  `json:"agent_id"`
	Name    string `json:"name"`
}

// createE2BKey mints an e2b key for the signed-in user, bound to an agent
// whose sessions they may start: the key can do no more than its owner
// can with that agent.
func (s *Server) createE2BKey(c echo.Context, req createE2BKeyRequest) (directory.APIKey, string, error) {
	ctx, p := c.Request().Context(), principalOf(c)
	if p.KeyID != 0 {
		return directory.APIKey{}, "", apperr.New(apperr.ErrForbidden, "keys_cannot_mint_keys", "An API key cannot create API keys; sign in as a user.")
	}
	if p.UserID == 0 {
		return directory.APIKey{}, "", apperr.New(apperr.ErrForbidden, "not_a_user", "An e2b key acts as the person who mints it; sign in as a user of this organization.")
	}
	if req.AgentID < 1 {
		return directory.APIKey{}, "", &apperr.ValidationError{Fields: map[string]string{"agent_id": "Choose the agent the key may start sandboxes of."}}
	}
	ag, err := s.mayStartSessions(c, req.AgentID)
	if err != nil {
		return directory.APIKey{}, "", err
	}
	in := directory.NewKey{Name: req.Name, Owner: &p.UserID, CreatedBy: p.Name, Agent: &ag.ID}
	var k directory.APIKey
	var secret string
	err = s.mutate(c, func(m *orgTx) error {
		var err error
		if k, secret, err = m.Dir.CreateKey(ctx, in); err != nil {
			return err
		}
		return m.audit("e2b_key.create", keyTarget(k), map[string]any{"after": map[string]any{
			"name": k.Name, "agent_id": ag.ID, "agent": ag.Name, "secret": "[redacted]"}})
	})
	return k, secret, err
}

// mayStartSessions reads agent id as the caller sees it and checks they
// may start its sessions (what an e2b key of it will do).
func (s *Server) mayStartSessions(c echo.Context, id int64) (agents.Agent, error) {
	svc := s.sessionService(c)
	ag, err := svc.Agents.Get(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return ag, err
	}
	ok, err := svc.CanCreate(c.Request().Context(), actorOf(c), ag)
	if err != nil {
		return ag, err
	}
	if !ok {
		return ag, apperr.New(apperr.ErrForbidden, "agent_not_usable", "You may see agent %q but not start its sessions, so you cannot mint an e2b key for it.", ag.Name)
	}
	return ag, nil
}

func (s *Server) apiListE2BKeys(c echo.Context) error {
	ks, err := s.visibleE2BKeys(c)
	if err != nil {
		return err
	}
	out := make([]e2bKeyJSON, len(ks))
	for i, k := range ks {
		out[i] = toE2BKeyJSON(k)
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out})
}

func (s *Server) apiCreateE2BKey(c echo.Context) error {
	return jsonCall(c, http.StatusCreated, func(req createE2BKeyRequest) (map[string]any, error) {
		k, secret, err := s.createE2BKey(c, req)
		if err != nil {
			return nil, err
		}
		return map[string]any{"key": secret, "id": k.ID, "item": toE2BKeyJSON(k)}, nil
	})
}

// apiRevokeE2BKey revokes an e2b key like any other key (its owner, or a
// key manager); an ordinary key's id answers 404 here.
func (s *Server) apiRevokeE2BKey(c echo.Context) error {
	if _, err := s.revokeE2BKey(c); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// revokeE2BKey revokes the e2b key :id through revokeKey; an ordinary
// key's id is not found on the e2b routes.
func (s *Server) revokeE2BKey(c echo.Context) (directory.APIKey, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return directory.APIKey{}, err
	}
	k, err := tenantOf(c).Dir.GetKey(c.Request().Context(), id)
	if err == nil && !k.IsE2B() {
		return directory.APIKey{}, notFoundErr()
	}
	return s.revokeKey(c, id)
}

// e2bEndpoint is the request's org's E2B endpoint.
func (s *Server) e2bEndpoint(c echo.Context) e2b.Endpoint {
	return e2b.EndpointFor(s.absURL(c, ""), s.E2B.PublicURL, s.E2B.Domain, tenantOf(c).Org.Slug)
}

func (s *Server) apiE2BEndpoint(c echo.Context) error {
	return c.JSON(http.StatusOK, s.e2bEndpoint(c))
}

// Pages.

func e2bPath(c echo.Context) string { return "/o/" + tenantOf(c).Org.Slug + "/e2b" }

func e2bPathParam(c echo.Context) (string, error) { return e2bPath(c), nil }

// renderE2B is the E2B-compatible endpoint page: the addresses to set, the
// caller's e2b keys (all of them for key managers) and the mint form with
// the agents whose sessions the caller may start.
func (s *Server) renderE2B(c echo.Context, status int, secret string, form views.E2BData) error {
	ctx, actor := c.Request().Context(), actorOf(c)
	ks, err := s.visibleE2BKeys(c)
	if err != nil {
		return err
	}
	ags, err := s.agentService(c).List(ctx, actor)
	if err != nil {
		return err
	}
	names := map[int64]string{}
	p := principalOf(c)
	d := form
	d.CanMint = p.UserID != 0 && p.KeyID == 0
	svc := s.sessionService(c)
	for _, a := range ags {
		names[a.ID] = a.Name
		if !d.CanMint {
			continue
		}
		if ok, err := svc.CanCreate(ctx, actor, a); err != nil {
			return err
		} else if ok {
			d.Agents = append(d.Agents, views.Option{Value: itoa(a.ID), Label: a.Name})
		}
	}
	for _, k := range ks {
		agent := names[*k.AgentID]
		if agent == "" {
			agent = "agent #" + itoa(*k.AgentID)
		}
		d.Rows = append(d.Rows, views.E2BKeyRow{ID: k.ID, Name: k.Name, Masked: k.Masked(), Agent: agent, CreatedBy: k.CreatedBy,
			CreatedAt: k.CreatedAt, LastUsedAt: k.LastUsedAt, Revoked: k.RevokedAt != nil})
	}
	if p.Kind == audit.ActorPlatformAdmin && p.KeyID == 0 {
		d.EnteredAdmin = true
		if d.AddSelfURL, err = s.addSelfURL(c, p); err != nil {
			return err
		}
		d.SignInURL = s.orgSignInURL(c, tenantOf(c).Org.Slug)
	}
	ep := s.e2bEndpoint(c)
	d.Slug, d.APIURL, d.SandboxURL, d.Domain = tenantOf(c).Org.Slug, ep.APIURL, ep.SandboxURL, ep.Domain
	d.Secret, d.DismissURL = secret, e2bPath(c)+"/dismiss-secret"
	return render(c, status, views.E2BEndpoint(s.orgPage(c, "E2B-compatible endpoint"), d))
}

// addSelfURL is, for a platform admin acting in the org, the users page
// with the add form filled in with their email, or "" when they may not
// add users.
func (s *Server) addSelfURL(c echo.Context, p *authz.Principal) (string, error) {
	ok, err := actorOf(c).Allowed(c.Request().Context(), rbac.DomainOrg, "users", "create")
	if err != nil || !ok {
		return "", err
	}
	return "/o/" + tenantOf(c).Org.Slug + "/users?email=" + url.QueryEscape(p.Name) + "#add-user", nil
}

func (s *Server) pageE2B(c echo.Context) error {
	return s.renderE2B(c, http.StatusOK, s.keptReveal(c, e2bPath(c)), views.E2BData{})
}

func (s *Server) pageMintE2BKey(c echo.Context) error {
	req := createE2BKeyRequest{Name: c.FormValue("name")}
	form := views.E2BData{FormName: req.Name, FormAgent: c.FormValue("agent_id")}
	id, err := parseID(form.FormAgent)
	if err != nil {
		form.Errors = map[string]string{"agent_id": "Choose the agent the key may start sandboxes of."}
		return s.renderE2B(c, http.StatusBadRequest, "", form)
	}
	req.AgentID = id
	_, secret, err := s.createE2BKey(c, req)
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		form.Errors = ve.Fields
		return s.renderE2B(c, http.StatusBadRequest, "", form)
	}
	if err != nil {
		return err
	}
	return s.redirectRevealing(c, e2bPath(c), secret)
}

func (s *Server) pageRevokeE2BKey(c echo.Context) error {
	k, err := s.revokeE2BKey(c)
	if err != nil {
		return err
	}
	s.setFlash(c, "The e2b key "+k.Name+" was revoked.")
	return c.Redirect(http.StatusSeeOther, e2bPath(c))
}
