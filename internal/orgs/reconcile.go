package orgs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Orphan kinds.
const (
	OrphanPostgres = "postgres"
	OrphanSQLite   = "sqlite"
)

// Orphan is a database (or SQLite file) named like an org's that no catalog
// row refers to: left by a crash before this version recorded provisioning,
// or made by hand. It is reported for an admin's decision and never
// dropped on its own: an admin may mean to attach it.
type Orphan struct {
	// Name is the database name, or the file name under orgs/.
	Name string
	Kind string
	// Slug is the org slug the name belongs to.
	Slug string
}

// reconcilerActor is who the reconciler's audit records name.
var reconcilerActor = audit.Actor{Type: audit.ActorSystem, Name: "org-reconciler"}

// ReconcileReport says what a reconciler round did.
type ReconcileReport struct {
	// Skipped is set when another replica (or round) held the lock.
	Skipped bool
	// Finished lists the slugs whose creation or deletion was completed or
	// rolled back.
	Finished []string
	// Orphans are the databases left for an admin's decision.
	Orphans []Orphan
}

// reconcileLockKey makes one replica reconcile at a time.
var reconcileLockKey = store.LockKey("gatehouse-org-reconciler")

// reconcileWait bounds how long the reconciler waits for a lock held
// elsewhere: a crashed console's locks last until the server notices its
// connections are gone, and a live console's creation until it is done.
const reconcileWait = 30 * time.Second

// Reconcile finishes every org left half-way by a crash or a failed undo:
// a provisioning org is rolled back (an attached database found empty is
// migrated and activated instead, since its tables are already ours), a
// deleting org is deleted. Orgs another request or replica is working on
// are left alone. Every action is in the platform audit log; orphans are
// reported, never dropped.
func (s *Service) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	if !s.reconciling.TryLock() {
		rep.Skipped = true
		return rep, nil
	}
	defer s.reconciling.Unlock()
	unlock, ok, err := store.AdvisoryLock(ctx, s.cfg.Catalog, reconcileLockKey, reconcileWait)
	if err != nil {
		return rep, catalogErr(fmt.Errorf("reconciler lock: %w", err))
	}
	if !ok {
		rep.Skipped = true
		return rep, nil
	}
	defer unlock()
	var slugs []string
	if err := s.cfg.Catalog.WithContext(ctx).Model(&orgRow{}).
		Where("status IN ?", []string{StatusProvisioning, StatusDeleting}).Order("slug").Pluck("slug", &slugs).Error; err != nil {
		return rep, catalogErr(fmt.Errorf("list unfinished orgs: %w", err))
	}
	var errs []error
	for _, slug := range slugs {
		done, err := s.reconcileOrg(ctx, slug)
		if err != nil {
			errs = append(errs, fmt.Errorf("reconcile org %s: %w", slug, err))
			continue
		}
		if done {
			rep.Finished = append(rep.Finished, slug)
		}
	}
	rep.Orphans, err = s.Orphans(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, o := range rep.Orphans {
		s.cfg.Logger.Warn("org database without an organization; left for a platform admin to remove or keep",
			"database", o.Name, "kind", o.Kind)
	}
	return rep, errors.Join(errs...)
}

// reconcileOrg finishes one org, unless someone is working on it.
func (s *Service) reconcileOrg(ctx context.Context, slug string) (bool, error) {
	l, err := s.lockOrg(ctx, slug, reconcileWait)
	if errors.Is(err, apperr.ErrConflict) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer l.release()
	r, err := s.getRow(ctx, slug)
	if errors.Is(err, apperr.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	t, err := s.locate(r)
	if err != nil {
		return false, err
	}
	event := func(action string, details map[string]any) *audit.Event {
		details["org"] = map[string]any{"slug": r.Slug, "name": r.Name, "dialect": r.DBDialect, "attached": r.DBAttached}
		return &audit.Event{Actor: reconcilerActor, Action: action,
			Target: audit.Target{Type: "organization", ID: r.Slug, Name: r.Name}, Details: audit.Details(details)}
	}
	switch {
	case r.Status == StatusDeleting:
		return true, s.finishDelete(ctx, l, r, event("org.reconcile_delete", map[string]any{"reason": "a deletion was interrupted; finished it"}))
	case r.Status == StatusProvisioning && r.Progress == progressVerified:
		db, err := s.openRow(ctx, r)
		if err != nil {
			return false, err
		}
		defer store.Close(db)
		if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
			return false, orgDBErr(slug, fmt.Errorf("migrate org %s: %w", slug, err))
		}
		_, err = s.activate(ctx, &r, event("org.reconcile_complete",
			map[string]any{"reason": "the creation of an org on an attached database was interrupted after the database was verified empty; migrated and activated it"}))
		return err == nil, err
	case r.Status == StatusProvisioning:
		dropped := r.Progress == progressOwned && !t.attached
		return true, s.rollback(ctx, l, r, t, event("org.reconcile_rollback",
			map[string]any{"reason": "a creation was interrupted; rolled it back", "progress": r.Progress, "database_dropped": dropped}))
	}
	return false, nil
}

// Orphans lists databases and SQLite files named like an org's that no
// catalog row refers to.
func (s *Service) Orphans(ctx context.Context) ([]Orphan, error) {
	// List first, read rows second: a row is written before its database
	// and deleted after it, so a database listed here whose row is absent
	// below has none.
	var found []Orphan
	if s.cfg.ServerDSN != "" {
		names, err := s.serverDatabases(ctx)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			found = append(found, Orphan{Name: n, Kind: OrphanPostgres,
				Slug: strings.ReplaceAll(strings.TrimPrefix(n, s.cfg.DBPrefix), "_", "-")})
		}
	}
	if s.cfg.DataDir != "" {
		files, err := s.sqliteDatabases()
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			found = append(found, Orphan{Name: f, Kind: OrphanSQLite, Slug: strings.TrimSuffix(f, ".db")})
		}
	}
	if len(found) == 0 {
		return nil, nil
	}
	var rows []orgRow
	if err := s.cfg.Catalog.WithContext(ctx).Find(&rows).Error; err != nil {
		return nil, catalogErr(fmt.Errorf("list orgs: %w", err))
	}
	used := map[Orphan]bool{}
	if s.cfg.ServerDSN != "" { // the catalog itself is never an orphan
		if n, err := store.DatabaseName(s.cfg.ServerDSN); err == nil {
			used[Orphan{Name: n, Kind: OrphanPostgres}] = true
		}
	}
	for _, r := range rows {
		t, err := s.locate(r)
		if err != nil {
			return nil, err
		}
		if t.dialect == store.Postgres {
			// Compared by name only: a same-named attached database on
			// another server keeps this one from being offered for removal,
			// which errs on the safe side.
			if n, err := store.DatabaseName(t.dsn); err == nil {
				used[Orphan{Name: n, Kind: OrphanPostgres}] = true
			}
			continue
		}
		used[Orphan{Name: filepath.Base(t.loc), Kind: OrphanSQLite}] = true
	}
	var out []Orphan
	for _, o := range found {
		if !used[Orphan{Name: o.Name, Kind: o.Kind}] {
			out = append(out, o)
		}
	}
	return out, nil
}

// DropOrphan removes one orphan after an admin chose to: it is looked up
// again under the slug's lock, so a database that gained an org meanwhile
// is not touched. event (when set) is recorded before the drop: an action
// that cannot be audited is not taken.
func (s *Service) DropOrphan(ctx context.Context, kind, name string, event func(Orphan) audit.Event) (Orphan, error) {
	notFound := apperr.New(apperr.ErrNotFound, "orphan_not_found", "No unclaimed database is named %q.", name)
	list, err := s.Orphans(ctx)
	if err != nil {
		return Orphan{}, err
	}
	o, ok := findOrphan(list, kind, name)
	if !ok {
		return Orphan{}, notFound
	}
	l, err := s.lockOrg(ctx, o.Slug, 0)
	if err != nil {
		return Orphan{}, err
	}
	defer l.release()
	if list, err = s.Orphans(ctx); err != nil {
		return Orphan{}, err
	}
	if o, ok = findOrphan(list, kind, name); !ok {
		return Orphan{}, notFound
	}
	if event != nil {
		if _, err := s.cfg.Audit.Append(ctx, event(o)); err != nil {
			return Orphan{}, catalogErr(fmt.Errorf("audit orphan removal: %w", err))
		}
	}
	ctx = context.WithoutCancel(ctx)
	if o.Kind == OrphanPostgres {
		return o, l.exec(ctx, "DROP DATABASE IF EXISTS "+store.QuoteIdent(o.Name)+" WITH (FORCE)")
	}
	if err := removeSQLite(filepath.Join(s.cfg.DataDir, "orgs", o.Name)); err != nil {
		return Orphan{}, fmt.Errorf("remove orphan file: %w", err)
	}
	return o, nil
}

func findOrphan(list []Orphan, kind, name string) (Orphan, bool) {
	for _, o := range list {
		if o.Kind == kind && o.Name == name {
			return o, true
		}
	}
	return Orphan{}, false
}

// serverDatabases lists the server's databases carrying the org prefix.
func (s *Service) serverDatabases(ctx context.Context) ([]string, error) {
	var names []string
	err := s.withServer(ctx, func(admin *gorm.DB) error {
		// left() rather than LIKE: the prefix's underscores would be
		// wildcards.
		return admin.Raw("SELECT datname FROM pg_database WHERE left(datname, ?) = ? ORDER BY datname",
			len([]rune(s.cfg.DBPrefix)), s.cfg.DBPrefix).Scan(&names).Error
	})
	if err != nil {
		return nil, markUnavailable("server", fmt.Errorf("list org databases: %w", err))
	}
	return names, nil
}

// sqliteDatabases lists the org database files under DataDir/orgs by their
// .db name; a companion file left without its database counts too.
func (s *Service) sqliteDatabases() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.cfg.DataDir, "orgs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list org database files: %w", err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		for _, suffix := range []string{"-wal", "-shm", "-journal"} {
			name = strings.TrimSuffix(name, suffix)
		}
		if e.IsDir() || !strings.HasSuffix(name, ".db") {
			continue
		}
		seen[name] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}
