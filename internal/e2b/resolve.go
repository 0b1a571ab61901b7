package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"strings"
	"sync"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// Service resolves data-plane requests. Build one per process.
type Service struct {
	Tenants *tenant.Registry
	Box     *sealed.Box
	// Sessions is the sessions service of an org bound to its pool (the
	// same runtime as the console's handlers use).
	Sessions func(t *tenant.Tenant) *sessions.Service

	mu    sync.Mutex
	links map[string]link
}

// link is what never changes about a sandbox once made: kept so that a
// data-plane call reads no row but the session's.
type link struct {
	db        *gorm.DB // the org pool it was read from: a new pool reads again
	sessionID int64
	keyID     int64
	agentID   int64
	token     string
}

// maxLinks bounds the remembered links; beyond it the map starts over.
const maxLinks = 10000

// errUnresolved is every refusal of ResolveSandbox: unknown id, another
// org's id, a wrong or missing token, a revoked key all read the same.
func errUnresolved() error {
	return apperr.New(apperr.ErrUnauthorized, "invalid_access_token", "No sandbox with this id accepts this access token.")
}

// ResolveSandbox checks the minted envd access token (constant time) for
// the sandbox id and answers its binding. An unknown id, another org's
// id, a wrong or missing token, a revoked key and a killed sandbox all
// answer the same apperr.ErrUnauthorized (401 invalid_access_token), so
// none tells which. The key that created the sandbox is checked through
// the org's auth cache (revoking it, or disabling its owner, fails the
// next call) and the owner must still be allowed to use the session. Call
// Binding.Release when done.
func (s *Service) ResolveSandbox(ctx context.Context, sandboxID, accessToken string) (Binding, error) {
	slug, ok := OrgOf(sandboxID)
	if !ok {
		return Binding{}, errUnresolved()
	}
	t, err := s.Tenants.Open(ctx, slug)
	if err != nil {
		if errors.Is(err, apperr.ErrNotFound) || errors.Is(err, apperr.ErrSuspended) {
			return Binding{}, errUnresolved()
		}
		return Binding{}, err
	}
	b, err := s.resolve(ctx, t, sandboxID, accessToken)
	if err != nil {
		t.Release()
		return Binding{}, err
	}
	return b, nil
}

func (s *Service) resolve(ctx context.Context, t *tenant.Tenant, sandboxID, accessToken string) (Binding, error) {
	l, err := s.link(ctx, t, sandboxID)
	if err != nil {
		return Binding{}, err
	}
	// An unknown sandbox is compared against a token nobody holds, so
	// the time taken does not tell it from a wrong token.
	want := l.token
	if want == "" {
		want = strings.Repeat("x", 64)
	}
	if subtle.ConstantTimeCompare([]byte(accessToken), []byte(want)) != 1 || l.token == "" || accessToken == "" {
		return Binding{}, errUnresolved()
	}
	k, owner, err := t.Auth.LiveKey(ctx, t.Dir, l.keyID)
	if errors.Is(err, apperr.ErrUnauthorized) || err == nil && (k.AgentID == nil || *k.AgentID != l.agentID) {
		return Binding{}, errUnresolved()
	}
	if err != nil {
		return Binding{}, err
	}
	p := KeyPrincipal(k, owner)
	actor := authz.New(p, t.Enforcer, Recorder(t, p.AuditActor()))
	svc := s.Sessions(t)
	sess, err := svc.Get(ctx, actor, l.sessionID)
	if err == nil && sess.Final() {
		// A killed sandbox is gone for the data plane too.
		err = errUnresolved()
	}
	if err == nil {
		var may bool
		if may, err = svc.CanUse(ctx, actor, sess); err == nil && !may {
			err = errUnresolved()
		}
	}
	if ferr := actor.Flush(ctx); ferr != nil {
		return Binding{}, ferr
	}
	if errors.Is(err, apperr.ErrNotFound) || errors.Is(err, apperr.ErrForbidden) {
		return Binding{}, errUnresolved()
	}
	if err != nil {
		return Binding{}, err
	}
	return Binding{Org: gateway.Org{Slug: t.Org.Slug, DB: t.DB, Audit: t.Audit, Sessions: svc, Revoked: t.Context()},
		Actor: actor, SessionID: l.sessionID, Release: t.Release,
		Recheck: func(ctx context.Context) error {
			_, err := s.resolve(ctx, t, sandboxID, accessToken)
			return err
		}}, nil
}

// link reads (once per org pool) what never changes about a sandbox; an
// unknown id answers an empty link, not an error.
func (s *Service) link(ctx context.Context, t *tenant.Tenant, sandboxID string) (link, error) {
	s.mu.Lock()
	l, ok := s.links[sandboxID]
	s.mu.Unlock()
	if ok && l.db == t.DB {
		return l, nil
	}
	x, err := Find(ctx, t.DB, sandboxID)
	if errors.Is(err, apperr.ErrNotFound) {
		return link{}, nil
	}
	if err != nil {
		return link{}, err
	}
	tok, err := OpenToken(s.Box, t.Org.Slug, x)
	if err != nil {
		return link{}, err
	}
	l = link{db: t.DB, sessionID: x.SessionID, keyID: x.KeyID, agentID: x.AgentID, token: tok}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.links == nil || len(s.links) >= maxLinks {
		s.links = map[string]link{}
	}
	s.links[sandboxID] = l
	return l, nil
}

// Recorder writes an actor's refusals to the org's audit log (for actors
// made outside an HTTP request's middleware, like the data plane's).
func Recorder(t *tenant.Tenant, actor audit.Actor) authz.Recorder {
	return func(ctx context.Context, ds []authz.Denial) error {
		for _, d := range ds {
			answer := "forbidden"
			if d.Hidden {
				answer = "not_found"
			}
			if d.Answer != "" {
				answer = d.Answer
			}
			_, err := t.Audit.Append(ctx, audit.Event{Actor: actor, Action: "authz.deny", Target: d.Target, Decision: audit.Deny,
				Details: audit.Details(map[string]string{"domain": d.Domain, "object": d.Object, "action": d.Action, "rule": d.Rule, "answered": answer})})
			if err != nil {
				return err
			}
		}
		return nil
	}
}
