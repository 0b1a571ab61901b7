package handlers

import (
	"context"
	"net/http"
	"net/http/httptest"

	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/e2b"
)

// EnvdBinding binds session sessionID of org to the principal holding
// bearer (a JWT or an API key), as the E2B control plane's resolver binds
// a sandbox: the data-plane tests resolve sandboxes with it.
func (s *Server) EnvdBinding(ctx context.Context, org, bearer string, sessionID int64) (e2b.Binding, error) {
	t, err := s.Tenants.Open(ctx, org)
	if err != nil {
		return e2b.Binding{}, err
	}
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+bearer)
	c := s.e.NewContext(r, httptest.NewRecorder())
	c.Set(ctxTenant, t)
	p, err := s.orgPrincipal(c, t)
	if err != nil {
		t.Release()
		return e2b.Binding{}, err
	}
	c.Set(ctxPrincipal, p)
	a := authz.New(*p, t.Enforcer, s.denialRecorder(c, t))
	c.Set(ctxActor, a)
	return e2b.Binding{Org: s.terminalOrg(c), Actor: a, SessionID: sessionID, Release: t.Release}, nil
}
