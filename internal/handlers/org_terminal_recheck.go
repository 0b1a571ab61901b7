package handlers

import (
	"context"
	"errors"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
)

// terminalRecheck authenticates the request's credential again, for a
// terminal or a long-poll that outlives the moment it was checked: logout,
// a disabled account, a revoked key or a role change reach it on the next
// keystroke or within proxy.RecheckEvery. The credential is read through
// the org's auth cache, which every write to users, keys and sign-ins
// clears at once on this replica and which other replicas re-read within a
// second; roles come from the enforcer, which re-reads the policy version
// as often.
func (s *Server) terminalRecheck(c echo.Context) func(ctx context.Context) (*authz.Actor, error) {
	t := tenantOf(c)
	first := principalOf(c)
	return func(ctx context.Context) (*authz.Actor, error) {
		p, err := s.orgPrincipal(c, t)
		if errors.Is(err, apperr.ErrUnauthorized) {
			return nil, s.revocationCause(ctx, c, first)
		}
		if err != nil {
			return nil, err
		}
		if p.Kind != first.Kind || p.ID != first.ID {
			return nil, revoked("Your access was removed: the credential this terminal was opened with no longer names you.")
		}
		return authz.New(*p, t.Enforcer, s.denialRecorder(c, t)), nil
	}
}

// outputRecheck is terminalRecheck for a waiting output poll of session
// sid: the reader must also still be allowed to read its output (an owner
// removed from the agent's department is not).
func (s *Server) outputRecheck(c echo.Context, sid int64) func(ctx context.Context) (*authz.Actor, error) {
	recheck := s.terminalRecheck(c)
	return func(ctx context.Context) (*authz.Actor, error) {
		a, err := recheck(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Gateway.AuthorizeRead(ctx, s.terminalOrg(c), a, sid); err != nil {
			return nil, err
		}
		return a, nil
	}
}

// revocationCause says, for the person whose credential no longer stands,
// why: it reads the sign-in only on this failure path.
func (s *Server) revocationCause(ctx context.Context, c echo.Context, p *authz.Principal) error {
	switch {
	case p.Kind == audit.ActorAPIKey:
		return revoked("Your access was removed: the API key this terminal uses was revoked or has expired.")
	case p.UserID != 0:
		if u, err := tenantOf(c).Dir.GetUser(ctx, p.UserID); err != nil || u.Status != directory.StatusActive {
			return revoked("Your access was removed: your account was disabled or removed.")
		}
	}
	return revoked("You were signed out: sign in again to use the terminal.")
}

// revoked is the answer of an operation whose credential no longer stands
// (401 credential_revoked); a terminal closes with msg.
func revoked(msg string) error {
	return apperr.New(apperr.ErrUnauthorized, "credential_revoked", "%s", msg)
}
