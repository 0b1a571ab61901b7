// Package tenant gives a request everything it needs inside one org: the
// org's database handle, directory, casbin enforcer, audit log and JWT
// signer, all bound to that org's database and keys. Built once per open
// pool and cached; a new pool (after idle close) gets fresh ones.
package tenant

import (
	"context"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Tenant is one org's runtime.
type Tenant struct {
	Org      orgs.Org
	DB       *gorm.DB
	Dir      *directory.Directory
	Auth     *directory.AuthCache // credentials verified a moment ago; writes through DB clear it
	Enforcer *rbac.Enforcer
	Audit    *audit.Log
	Signer   *auth.Signer
	handle   *orgs.Handle
}

// Release returns the underlying pool handle. The org's database closes
// only once every tenant holding it has released it.
func (t *Tenant) Release() { t.handle.Release() }

// Context ends when the org's handle is revoked: the org was suspended or
// deleted, or the console is shutting down. context.Cause(t.Context()) is
// an error the HTTP layer answers with (403 suspended, 404 deleted, 503).
func (t *Tenant) Context() context.Context { return t.handle.Context() }

// Registry builds and caches tenants.
type Registry struct {
	Orgs     *orgs.Service
	Box      *sealed.Box
	TokenTTL time.Duration
	// AuditObserver, when set, hears of every org audit append (metrics).
	AuditObserver audit.Observer
	// Passwords is the cost of the org password hashes made (zero: the
	// default).
	Passwords auth.PasswordCost

	mu    sync.Mutex
	cache map[string]*runtime
	// building serializes runtime builds per org.
	building map[string]*sync.Mutex
}

type runtime struct {
	db       *gorm.DB
	dir      *directory.Directory
	auth     *directory.AuthCache
	enforcer *rbac.Enforcer
	log      *audit.Log
	signer   *auth.Signer
}

// Audience is the JWT audience of an org: tokens of one org never verify
// in another (and the keys differ too).
func Audience(slug string) string { return "org:" + slug }

// Open returns the tenant for slug; Release it when done. Suspended and
// unknown orgs fail with the orgs package's errors.
func (r *Registry) Open(ctx context.Context, slug string) (*Tenant, error) {
	h, err := r.Orgs.Open(ctx, slug)
	if err != nil {
		return nil, err
	}
	rt, err := r.runtime(ctx, h)
	if err != nil {
		h.Release()
		return nil, err
	}
	return &Tenant{Org: h.Org, DB: h.DB, Dir: rt.dir, Auth: rt.auth, Enforcer: rt.enforcer, Audit: rt.log, Signer: rt.signer, handle: h}, nil
}

func (r *Registry) runtime(ctx context.Context, h *orgs.Handle) (*runtime, error) {
	r.mu.Lock()
	if r.cache == nil {
		r.cache = map[string]*runtime{}
	}
	if rt := r.cache[h.Org.Slug]; rt != nil && rt.db == h.DB {
		r.mu.Unlock()
		return rt, nil
	}
	// One build per org at a time: casbin's gorm adapter is not safe to
	// set up twice at once on one handle, and the second would be wasted.
	if r.building == nil {
		r.building = map[string]*sync.Mutex{}
	}
	b := r.building[h.Org.Slug]
	if b == nil {
		b = &sync.Mutex{}
		r.building[h.Org.Slug] = b
	}
	r.mu.Unlock()
	b.Lock()
	defer b.Unlock()
	r.mu.Lock()
	if rt := r.cache[h.Org.Slug]; rt != nil && rt.db == h.DB {
		r.mu.Unlock()
		return rt, nil
	}
	r.mu.Unlock()
	kid, key, err := auth.LoadOrCreateSigningKey(ctx, h.DB, r.Box, h.Org.Slug)
	if err != nil {
		return nil, fmt.Errorf("org %s signing key: %w", h.Org.Slug, err)
	}
	en, err := rbac.NewEnforcer(ctx, h.DB)
	if err != nil {
		return nil, fmt.Errorf("org %s enforcer: %w", h.Org.Slug, err)
	}
	ac, err := directory.NewAuthCache(h.DB)
	if err != nil {
		return nil, fmt.Errorf("org %s: %w", h.Org.Slug, err)
	}
	// Every write to agents and environments through the pool tells the
	// session caches of every replica (config_version).
	if err := sessions.WatchConfig(h.DB); err != nil {
		return nil, fmt.Errorf("org %s: %w", h.Org.Slug, err)
	}
	rt := &runtime{
		db:       h.DB,
		dir:      &directory.Directory{DB: h.DB, Passwords: r.Passwords},
		auth:     ac,
		enforcer: en,
		log:      audit.NewLog(h.DB, audit.OrgTable, nil).Observe(r.AuditObserver),
		signer:   auth.NewSigner(kid, key, Audience(h.Org.Slug), r.TokenTTL, nil),
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.cache[h.Org.Slug]; cur != nil && cur.db == h.DB {
		return cur, nil
	}
	r.cache[h.Org.Slug] = rt
	return rt, nil
}

// Forget drops a cached runtime (org deleted or suspended).
func (r *Registry) Forget(slug string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.cache, slug)
}

// BindRevoked returns ctx limited to the org's life: it ends when ctx ends
// or when revoked does (the org was suspended or deleted, or the console
// is shutting down), and context.Cause of it says which: a revocation
// keeps its own cause. A nil revoked never ends. Call cancel when done.
func BindRevoked(ctx context.Context, revoked context.Context) (context.Context, context.CancelFunc) {
	bound, cancel := context.WithCancelCause(ctx)
	if revoked == nil {
		return bound, func() { cancel(context.Canceled) }
	}
	stop := context.AfterFunc(revoked, func() { cancel(context.Cause(revoked)) })
	return bound, func() {
		stop()
		cancel(context.Canceled)
	}
}
