package sessions

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// How the session cache stays honest. A cached Target carries what a
// session's agent and environment said when it was read: the command
// policy every exec is checked against, the agentd address and token.
//
//   - Entries are keyed by the org's open database (Service.Pool), never by
//     its slug alone: an org deleted and created again under the same slug
//     has a new database, and never finds the old org's targets, which
//     point at the old org's machines.
//   - Every write to agents, agent_environments or environments through an
//     org's database bumps config_version in the writer's transaction (a
//     gorm callback WatchConfig puts on the pool handle, so no write path
//     can forget it). An entry remembers the version read before its rows;
//     the Runtime reads the current version at most once per
//     ConfigCheckEvery per org, and an entry of another version is a miss.
//     Another replica's change therefore applies here within a second.
//   - A write through this process's own handle makes the Runtime read the
//     version on every use of that org until it reads the version that
//     write's bump produced (or for localWriteWindow, if it never commits),
//     so the change applies here as soon as it commits, not a second
//     later, and once it is seen uses are back to one read a second.

// DefaultConfigCheckEvery bounds how long another replica's change to an
// agent or environment takes to reach this process's session cache.
const DefaultConfigCheckEvery = time.Second

// localWriteWindow bounds how long after a write through this process's
// handle the version is read on every use while the version its bump
// produced has not been read: the write's transaction commits or rolls
// back within it (the bump is made before the commit, whose moment no
// callback sees), and past it the version is read once per
// ConfigCheckEvery anyway.
const localWriteWindow = 5 * time.Second

// configWatchName names the watch among the handle's plugins and its
// callbacks.
const configWatchName = "gatehouse:sessions:config_version"

// bumpConfigVersion is the write every change of a session's configuration
// makes with it; it returns the version it wrote.
const bumpConfigVersion = "UPDATE config_version SET version = version + 1 WHERE id = 1 RETURNING version"

// configTables are the tables a session's Target is built from.
var configTables = map[string]bool{"agents": true, "agent_environments": true, "environments": true}

// healthColumns are what an environment's health check writes: bookkeeping
// that changes no Target, and is written every check interval.
var healthColumns = map[string]bool{"health_status": true, "health_error": true, "health_checked_at": true,
	"health_changed_at": true, "health_latency_ms": true, "agentd_version": true, "active_sessions": true,
	"exec_reporting": true, "exec_reporting_reason": true}

// rawConfigWrite matches hand-written SQL that changes a config table.
var rawConfigWrite = regexp.MustCompile("(?is)^\\s*(insert\\s+into|update|delete\\s+from)\\s+[\"`]?(agents|agent_environments|environments)\\b")

// configWatch bumps config_version with every write to a config table made
// through the handle it is installed on, and remembers when this process
// last did.
type configWatch struct {
	lastWrite atomic.Int64 // unix nanoseconds; 0: never
	// produced is the highest version a bump through this handle wrote.
	// A version read at or above it was read after that bump committed
	// (a writer holds the version row until it commits, so no other bump
	// can reach it first), so it vouches for every local write so far; a
	// bump that rolled back vouches for nothing and needs nothing (its
	// number may be written again by a later bump, which it then stands
	// for).
	produced atomic.Int64
	// bumping counts bumps under way: until one has stored what it
	// produced, produced cannot vouch (outside a transaction the write
	// and its bump have committed by then, and a use meanwhile must not
	// take the cache).
	bumping atomic.Int32
}

// WatchConfig installs the config_version bump on an org's pool handle
// (its callbacks are shared by every session and transaction made from
// it). Call it once when the pool is set up, before requests use it;
// calling it again on the same handle does nothing.
func WatchConfig(db *gorm.DB) error {
	if watchOf(db) != nil {
		return nil
	}
	if err := db.Use(&configWatch{}); err != nil && !errors.Is(err, gorm.ErrRegistered) {
		return fmt.Errorf("watch agent and environment writes: %w", err)
	}
	return nil
}

func watchOf(db *gorm.DB) *configWatch {
	if db == nil || db.Config == nil {
		return nil
	}
	w, _ := db.Config.Plugins[configWatchName].(*configWatch)
	return w
}

// Name names the watch as a gorm plugin.
func (*configWatch) Name() string { return configWatchName }

// Initialize registers the callbacks. Inside a transaction the version is
// bumped before the write, so every writer takes the version row first
// and two writers never wait on each other in opposite orders; the bump
// commits with the write. Outside one the write commits on its own, and
// the bump follows it: a replica that saw the new version must find the
// new rows.
func (w *configWatch) Initialize(db *gorm.DB) error {
	cb := db.Callback()
	before, after := configWatchName+":before", configWatchName+":after"
	for _, err := range []error{
		cb.Create().Before("gorm:create").Register(before, w.beforeWrite),
		cb.Create().After("gorm:create").Register(after, w.afterWrite),
		cb.Update().Before("gorm:update").Register(before, w.beforeWrite),
		cb.Update().After("gorm:update").Register(after, w.afterWrite),
		cb.Delete().Before("gorm:delete").Register(before, w.beforeWrite),
		cb.Delete().After("gorm:delete").Register(after, w.afterWrite),
		cb.Raw().Before("gorm:raw").Register(before, w.beforeWrite),
		cb.Raw().After("gorm:raw").Register(after, w.afterWrite),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *configWatch) beforeWrite(db *gorm.DB) {
	if db.Error == nil && inTransaction(db) && changesConfig(db.Statement) {
		w.bump(db)
	}
}

func (w *configWatch) afterWrite(db *gorm.DB) {
	if db.Error == nil && !inTransaction(db) && changesConfig(db.Statement) {
		w.bump(db)
	}
}

// bump writes the new version on the statement's own connection (its
// transaction, if any); a failed bump fails the write, so no change goes
// unannounced.
func (w *configWatch) bump(db *gorm.DB) {
	w.bumping.Add(1)
	defer w.bumping.Add(-1)
	w.lastWrite.Store(time.Now().UnixNano())
	var v int64
	if err := db.Session(&gorm.Session{NewDB: true}).Raw(bumpConfigVersion).Scan(&v).Error; err != nil {
		_ = db.AddError(fmt.Errorf("record a change of agents or environments for the session caches: %w", err))
		return
	}
	for {
		p := w.produced.Load()
		if v <= p || w.produced.CompareAndSwap(p, v) {
			return
		}
	}
}

// unseenWrite reports whether this process wrote through the handle
// within localWriteWindow before now and seen, the version last read, may
// not include that write yet.
func (w *configWatch) unseenWrite(now time.Time, seen int64) bool {
	at := w.lastWrite.Load()
	return at != 0 && now.Sub(time.Unix(0, at)) < localWriteWindow && (w.bumping.Load() > 0 || seen < w.produced.Load())
}

func inTransaction(db *gorm.DB) bool {
	_, ok := db.Statement.ConnPool.(gorm.TxCommitter)
	return ok
}

// changesConfig reports whether a statement writes a config table, health
// bookkeeping aside.
func changesConfig(st *gorm.Statement) bool {
	if st == nil {
		return false
	}
	if st.Table == "" {
		return rawConfigWrite.MatchString(st.SQL.String())
	}
	if !configTables[st.Table] {
		return false
	}
	if m, ok := st.Dest.(map[string]any); ok && st.Table == "environments" && len(m) > 0 {
		for k := range m {
			if !healthColumns[k] {
				return true
			}
		}
		return false
	}
	return true
}

// configVersions is the Runtime's view of each org's config_version.
type configVersions struct {
	mu   sync.Mutex
	orgs map[*gorm.DB]*orgVersion
}

// orgVersion is one org database's config_version as last read.
type orgVersion struct {
	mu      sync.Mutex
	slug    string
	version int64
	readAt  time.Time // when the read that gave version began; zero: never
	// reading is closed when the read under way ends (nil: none), so
	// callers arriving meanwhile share it instead of each asking.
	reading chan struct{}
}

// of returns the entry of pool, making one. An org has one open pool at a
// time: a new one replaces the entries of the same slug, so the map holds
// one entry per org however often its pool is closed and reopened.
func (v *configVersions) of(pool *gorm.DB, slug string) *orgVersion {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ov := v.orgs[pool]; ov != nil {
		return ov
	}
	if v.orgs == nil {
		v.orgs = map[*gorm.DB]*orgVersion{}
	}
	for db, ov := range v.orgs {
		if ov.slug == slug {
			delete(v.orgs, db)
		}
	}
	ov := &orgVersion{slug: slug}
	v.orgs[pool] = ov
	return ov
}

func (v *configVersions) forget(slug string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for db, ov := range v.orgs {
		if ov.slug == slug {
			delete(v.orgs, db)
		}
	}
}

func (r *Runtime) configCheckEvery() time.Duration {
	if r.ConfigCheckEvery > 0 {
		return r.ConfigCheckEvery
	}
	return DefaultConfigCheckEvery
}

// configVersion is org slug's config_version as this process knows it:
// read at most once per ConfigCheckEvery, and on every call after a write
// through pool in this process until a read shows that write (see
// configWatch.produced). Freshness is judged on the process's own clock,
// not Now (which tests move).
func (r *Runtime) configVersion(ctx context.Context, pool *gorm.DB, slug string) (int64, error) {
	ov := r.config.of(pool, slug)
	w := watchOf(pool)
	for {
		ov.mu.Lock()
		now := time.Now()
		if !ov.readAt.IsZero() && now.Sub(ov.readAt) < r.configCheckEvery() && (w == nil || !w.unseenWrite(now, ov.version)) {
			v := ov.version
			ov.mu.Unlock()
			return v, nil
		}
		if wait := ov.reading; wait != nil {
			// Wait for it, then judge again: a shared read vouches for
			// a local write only if it shows the version that write's
			// bump produced (one begun before the write committed
			// does not), and otherwise this caller reads for itself.
			ov.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		done := make(chan struct{})
		ov.reading = done
		ov.mu.Unlock()
		var n int64
		err := pool.WithContext(ctx).Raw("SELECT version FROM config_version WHERE id = 1").Scan(&n).Error
		ov.mu.Lock()
		if err == nil {
			ov.version, ov.readAt = n, now
		}
		ov.reading = nil
		ov.mu.Unlock()
		close(done)
		if err != nil {
			return 0, fmt.Errorf("read the configuration version: %w", err)
		}
		return n, nil
	}
}

// ForgetOrg drops everything the runtime holds for org slug: its cached
// sessions, their gates and its configuration version. The console calls
// it when the org is suspended or deleted. Entries are keyed by the org's
// database, so a re-created org could never use them; this frees them.
func (r *Runtime) ForgetOrg(slug string) {
	r.mu.Lock()
	for k := range r.cache {
		if k.org == slug {
			delete(r.cache, k)
		}
	}
	for k := range r.gates {
		if k.org == slug {
			delete(r.gates, k)
		}
	}
	r.mu.Unlock()
	r.config.forget(slug)
}

// pool is the handle the process caches are keyed by.
func (s *Service) pool() *gorm.DB {
	if s.Pool != nil {
		return s.Pool
	}
	return s.DB
}

// stamp is the config_version read before the rows of an entry about to be
// cached; ok is false when it could not be read (then nothing is cached)
// or when the service caches nothing.
type stamp struct {
	version int64
	ok      bool
}

// stampNow reads the version an entry filled from here on is valid for.
// It is read before the rows: a change committed in between makes the
// entry a miss at the next check rather than keeping it forever.
func (s *Service) stampNow(ctx context.Context) stamp {
	if s.RT == nil {
		return stamp{}
	}
	v, err := s.RT.configVersion(ctx, s.pool(), s.Org)
	return stamp{version: v, ok: err == nil}
}

// current reports whether an entry cached at version v is still valid. A
// version that cannot be read is a miss: the slow path reads the database
// and reports its error.
func (s *Service) current(ctx context.Context, v int64) bool {
	now, err := s.rt().configVersion(ctx, s.pool(), s.Org)
	return err == nil && now == v
}
