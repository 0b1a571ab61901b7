package orgs

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/store"
)

// pool is one org's open database with the requests holding it. Revoking a
// pool (suspend, delete, shutdown) cancels its context at once and closes
// the database when the last holder releases it, so nothing in flight has
// its connections pulled from under it.
type pool struct {
	slug     string
	db       *gorm.DB
	refs     int
	lastUsed time.Time
	ctx      context.Context
	cancel   context.CancelCauseFunc
	revoked  bool
	// closed is closed once db is.
	closed chan struct{}
	// org is the catalog row as read at checked; a request within
	// rowTTL of it takes the pool without asking the catalog again.
	org     Org
	checked time.Time
}

// rowTTL bounds how long an org's catalog row is trusted without reading
// it again: the hot path (every terminal operation opens its org) costs no
// catalog round trip, while a change made on another replica (a suspend)
// applies here within it. This replica's own suspensions and deletions
// revoke the pool at once.
const rowTTL = time.Second

func newPool(db *gorm.DB, now time.Time) *pool {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &pool{db: db, refs: 1, lastUsed: now, ctx: ctx, cancel: cancel, closed: make(chan struct{})}
}

// shut closes the pool's database; call it once, without s.mu.
func (p *pool) shut() {
	_ = store.Close(p.db)
	close(p.closed)
}

// Handle is an open org deployment. Release it when the request is done.
type Handle struct {
	Org  Org
	DB   *gorm.DB
	s    *Service
	p    *pool
	once sync.Once
}

// Context ends when the org's handle is revoked: the org was suspended or
// deleted, or the console is shutting down. context.Cause says which, as an
// error the HTTP layer can answer with. Long-polls and streams select on it.
func (h *Handle) Context() context.Context { return h.p.ctx }

// Release returns the handle; the pool may then be closed when idle, or at
// once if it was revoked. Releasing twice is harmless.
func (h *Handle) Release() { h.once.Do(func() { h.s.release(h.p) }) }

func (s *Service) release(p *pool) {
	s.mu.Lock()
	p.lastUsed = s.cfg.Now()
	closeNow := s.unrefLocked(p)
	s.mu.Unlock()
	if closeNow {
		p.shut()
	}
}

// unrefLocked drops one reference and tells whether the pool, revoked and
// now unheld, must be shut. Call with s.mu held.
func (s *Service) unrefLocked(p *pool) bool {
	p.refs--
	if !p.revoked || p.refs > 0 {
		return false
	}
	delete(s.draining, p)
	return true
}

// revoke ends slug's pool: its context is cancelled with cause, and its
// database closes once nobody holds it.
func (s *Service) revoke(slug string, cause error) {
	s.mu.Lock()
	s.gen[slug]++
	p := s.pools[slug]
	delete(s.pools, slug)
	closeNow := false
	if p != nil {
		p.revoked = true
		p.cancel(cause)
		closeNow = p.refs <= 0
		if !closeNow {
			s.draining[p] = true
		}
	}
	s.mu.Unlock()
	if closeNow {
		p.shut()
	}
}

// drained waits until every revoked pool of slug has closed, at most max.
// Removing an org's data under a pool still in use would let its next
// query open (and so re-create) a SQLite file.
func (s *Service) drained(ctx context.Context, slug string, max time.Duration) error {
	s.mu.Lock()
	var waits []chan struct{}
	for p := range s.draining {
		if p.slug == slug {
			waits = append(waits, p.closed)
		}
	}
	s.mu.Unlock()
	timer := time.NewTimer(max)
	defer timer.Stop()
	for _, w := range waits {
		select {
		case <-w:
		case <-timer.C:
			return apperr.New(apperr.ErrConflict, "org_in_use", "Organization %q is still in use; its deletion finishes once its last request ends.", slug)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Open returns a handle on an active org's database, opening and migrating
// the pool on first use. A suspended org answers ErrSuspended; one being
// created or deleted does not exist for its users.
func (s *Service) Open(ctx context.Context, slug string) (*Handle, error) {
	for {
		s.mu.Lock()
		gen := s.gen[slug]
		if p := s.pools[slug]; p != nil && !p.revoked && s.cfg.Now().Sub(p.checked) < rowTTL {
			p.refs++
			p.lastUsed = s.cfg.Now()
			// Read p.org under the lock: hold refreshes it.
			h := &Handle{Org: p.org, DB: p.db, s: s, p: p}
			s.mu.Unlock()
			return h, nil
		}
		s.mu.Unlock()
		r, err := s.getRow(ctx, slug)
		if err != nil {
			return nil, err
		}
		switch r.Status {
		case StatusSuspended:
			return nil, suspendedErr(slug)
		case StatusProvisioning, StatusDeleting:
			return nil, apperr.New(apperr.ErrNotFound, "org_not_found", "No organization has the slug %q.", slug)
		}
		o := r.org()
		if h := s.hold(slug, o, gen); h != nil {
			return h, nil
		}
		db, err := s.openRow(ctx, r)
		if err != nil {
			return nil, err
		}
		// Upgrades bring new org migrations; apply them on first open.
		if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
			_ = store.Close(db)
			return nil, orgDBErr(slug, fmt.Errorf("migrate org %s: %w", slug, err))
		}
		s.mu.Lock()
		if s.gen[slug] != gen { // revoked while we opened: read the status again
			s.mu.Unlock()
			_ = store.Close(db)
			continue
		}
		if p := s.pools[slug]; p != nil { // lost a race: use the winner's pool
			p.refs++
			s.mu.Unlock()
			_ = store.Close(db)
			return &Handle{Org: o, DB: p.db, s: s, p: p}, nil
		}
		p := newPool(db, s.cfg.Now())
		p.slug, p.org, p.checked = slug, o, p.lastUsed
		s.pools[slug] = p
		s.mu.Unlock()
		return &Handle{Org: o, DB: db, s: s, p: p}, nil
	}
}

// hold takes a reference on slug's open pool, if there is one and no
// revocation happened since gen was read.
func (s *Service) hold(slug string, o Org, gen uint64) *Handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pools[slug]
	if p == nil || s.gen[slug] != gen {
		return nil
	}
	p.refs++
	p.lastUsed = s.cfg.Now()
	p.org, p.checked = o, p.lastUsed
	return &Handle{Org: o, DB: p.db, s: s, p: p}
}

// OpenPools reports how many org pools are open (for readiness and tests).
func (s *Service) OpenPools() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pools)
}

func (s *Service) janitor() {
	defer close(s.done)
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.CloseIdle()
		}
	}
}

// CloseIdle closes pools nobody holds that were unused for IdleClose.
func (s *Service) CloseIdle() int {
	s.mu.Lock()
	var idle []*pool
	now := s.cfg.Now()
	for slug, p := range s.pools {
		if p.refs <= 0 && now.Sub(p.lastUsed) >= s.cfg.IdleClose {
			idle = append(idle, p)
			delete(s.pools, slug)
		}
	}
	s.mu.Unlock()
	for _, p := range idle {
		p.cancel(errClosed)
		p.shut()
	}
	return len(idle)
}

// MigrateOrg applies pending org migrations to one org's database, whether
// or not it is suspended (used by `console migrate`). An org whose creation
// or deletion is unfinished is left to the reconciler.
func (s *Service) MigrateOrg(ctx context.Context, slug string) error {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return err
	}
	if r.Status == StatusProvisioning || r.Status == StatusDeleting {
		return nil
	}
	db, err := s.openRow(ctx, r)
	if err != nil {
		return err
	}
	defer store.Close(db)
	_, err = store.Migrate(ctx, db, store.OrgSet)
	return orgDBErr(slug, err)
}

// openRow opens a fresh (unpooled) handle on an org's database.
func (s *Service) openRow(ctx context.Context, r orgRow) (*gorm.DB, error) {
	t, err := s.locate(r)
	if err != nil {
		return nil, err
	}
	dsn := t.dsn
	if t.dialect == store.SQLite {
		// Opening an org never creates its file: an open that read the row
		// just before a deletion must fail, not leave an empty database
		// behind that blocks creating the slug again. Provisioning creates
		// the file itself.
		dsn = "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(t.dsn)) + "?mode=rw"
	}
	db, err := store.Open(ctx, dsn, store.Options{})
	if err != nil {
		return nil, orgDBErr(r.Slug, fmt.Errorf("open org %s database: %w", r.Slug, err))
	}
	return db, nil
}
