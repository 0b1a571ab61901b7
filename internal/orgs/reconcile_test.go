package orgs

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// newTestService is a Service on a fresh catalog of dialect d whose org
// databases carry a per-test prefix, dropped at cleanup.
func newTestService(t *testing.T, d store.Dialect) *Service {
	t.Helper()
	box, err := sealed.New([]byte(strings.Repeat("r", 32)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Catalog: storetest.Open(t, d, store.CatalogSet), Box: box, DataDir: t.TempDir(),
		DBPrefix: storetest.NewName("gh_test_rec_") + "_"}
	if d == store.Postgres {
		cfg.ServerDSN = storetest.AdminDSN(t)
		storetest.DropPrefixedAtCleanup(t, cfg.DBPrefix)
	}
	s := New(cfg)
	t.Cleanup(s.Close)
	return s
}

// dataExists reports whether slug's own (non-attached) database exists.
func dataExists(t *testing.T, s *Service, slug string) bool {
	t.Helper()
	if s.cfg.ServerDSN != "" {
		return storetest.PostgresDatabaseExists(t, s.pgName(slug))
	}
	_, err := os.Stat(filepath.Join(s.cfg.DataDir, s.sqliteRel(slug)))
	return err == nil
}

// halfWay leaves slug as a crash at each step would: its row and, from
// progressOwned on, its database.
func halfWay(t *testing.T, s *Service, slug, status, progress string, migrated bool) {
	t.Helper()
	ctx := context.Background()
	tg, err := s.newTarget(ctx, &orgLock{conn: serverConn(t, s), done: func() {}}, CreateInput{Slug: slug})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.claim(ctx, CreateInput{Slug: slug, Name: slug}, tg)
	if err != nil {
		t.Fatal(err)
	}
	if progress == progressClaimed {
		r.Progress = progressClaimed
	}
	if err := s.cfg.Catalog.Model(&orgRow{}).Where("id = ?", r.ID).
		Updates(map[string]any{"status": status, "provision_progress": r.Progress}).Error; err != nil {
		t.Fatal(err)
	}
	if progress == progressClaimed {
		return
	}
	if err := s.createDatabase(ctx, &orgLock{conn: serverConn(t, s), done: func() {}}, tg); err != nil {
		t.Fatal(err)
	}
	if migrated {
		db, err := store.Open(ctx, tg.dsn, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close(db)
		if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
			t.Fatal(err)
		}
	}
}

func serverConn(t *testing.T, s *Service) *sql.Conn {
	t.Helper()
	if s.cfg.ServerDSN == "" {
		return nil
	}
	db, err := store.Open(context.Background(), s.cfg.ServerDSN, store.Options{MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	conn, err := sqlConn(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func reconcilerActions(t *testing.T, db *gorm.DB) map[string]string {
	t.Helper()
	var rows []struct{ Action, TargetID string }
	if err := db.Table(audit.PlatformTable).Where("actor_name = ?", reconcilerActor.Name).Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range rows {
		out[r.TargetID] = r.Action
	}
	return out
}

// TestReconcileFinishesHalfWayOrgs leaves orgs as a crash would at each
// recorded step, runs one round, and checks each was finished or undone,
// with a platform audit record per action.
func TestReconcileFinishesHalfWayOrgs(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		s := newTestService(t, d)
		ctx := context.Background()
		cases := []struct {
			slug, status, progress string
			migrated               bool
			wantAction             string
		}{
			{"claimed-only", StatusProvisioning, progressClaimed, false, "org.reconcile_rollback"},
			{"created-db", StatusProvisioning, progressOwned, false, "org.reconcile_rollback"},
			{"migrated-db", StatusProvisioning, progressOwned, true, "org.reconcile_rollback"},
			{"half-deleted", StatusDeleting, progressOwned, true, "org.reconcile_delete"},
		}
		for _, tc := range cases {
			halfWay(t, s, tc.slug, tc.status, tc.progress, tc.migrated)
		}
		if _, err := s.Create(ctx, CreateInput{Slug: "settled"}); err != nil {
			t.Fatal(err)
		}
		rep, err := s.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		actions := reconcilerActions(t, s.cfg.Catalog)
		for _, tc := range cases {
			if _, err := s.Get(ctx, tc.slug); !errors.Is(err, apperr.ErrNotFound) {
				t.Errorf("%s: still in the catalog after the round (%v)", tc.slug, err)
			}
			if dataExists(t, s, tc.slug) {
				t.Errorf("%s: its database is left behind", tc.slug)
			}
			if actions[tc.slug] != tc.wantAction {
				t.Errorf("%s: audited %q, want %q", tc.slug, actions[tc.slug], tc.wantAction)
			}
			if !slices.Contains(rep.Finished, tc.slug) {
				t.Errorf("%s: not in the report %v", tc.slug, rep.Finished)
			}
			if _, err := s.Create(ctx, CreateInput{Slug: tc.slug}); err != nil {
				t.Errorf("%s: cannot be created again: %v", tc.slug, err)
			}
		}
		if o, err := s.Get(ctx, "settled"); err != nil || o.Status != StatusActive || actions["settled"] != "" {
			t.Errorf("a settled org was touched: %+v %v %q", o, err, actions["settled"])
		}
		if res, err := s.cfg.Audit.Verify(ctx); err != nil || !res.OK {
			t.Fatalf("platform audit chain: %+v %v", res, err)
		}
	})
}

// An org whose creation on an attached database stopped after the
// database was found empty is completed, not dropped: the database is the
// admin's, and its tables are already ours.
func TestReconcileCompletesVerifiedAttach(t *testing.T) {
	t.Parallel()
	s := newTestService(t, store.Postgres)
	ctx := context.Background()
	name := s.cfg.DBPrefix + "attached"
	storetest.CreatePostgresDB(t, name)
	dsn, err := store.WithDatabase(storetest.AdminDSN(t), name)
	if err != nil {
		t.Fatal(err)
	}
	in := CreateInput{Slug: "attached", Name: "Attached", AttachDSN: dsn}
	tg, err := s.newTarget(ctx, nil, in)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.claim(ctx, in, tg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.setProgress(ctx, &r, progressVerified); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	o, err := s.Get(ctx, "attached")
	if err != nil || o.Status != StatusActive {
		t.Fatalf("attached org after the round: %+v %v", o, err)
	}
	if a := reconcilerActions(t, s.cfg.Catalog)["attached"]; a != "org.reconcile_complete" {
		t.Fatalf("audited %q", a)
	}
	h, err := s.Open(ctx, "attached")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	var n int64
	if err := h.DB.Raw("SELECT count(*) FROM schema_migrations").Scan(&n).Error; err != nil || n == 0 {
		t.Fatalf("the completed org is not migrated: %d %v", n, err)
	}
}

// A database named like an org's that no org uses is reported, blocks the
// slug with a message pointing at the report, and goes only when an admin
// removes it (audited); then the slug can be created.
func TestOrphansReportedAndRemovedOnRequest(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		s := newTestService(t, d)
		ctx := context.Background()
		var orphan Orphan
		if d == store.Postgres {
			orphan = Orphan{Name: s.pgName("ghost-town"), Kind: OrphanPostgres, Slug: "ghost-town"}
			storetest.CreatePostgresDB(t, orphan.Name)
		} else {
			orphan = Orphan{Name: "ghost-town.db", Kind: OrphanSQLite, Slug: "ghost-town"}
			if err := os.MkdirAll(filepath.Join(s.cfg.DataDir, "orgs"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s.cfg.DataDir, "orgs", orphan.Name), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Create(ctx, CreateInput{Slug: "kept"}); err != nil {
			t.Fatal(err)
		}
		rep, err := s.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(rep.Orphans, []Orphan{orphan}) {
			t.Fatalf("orphans %+v, want only %+v", rep.Orphans, orphan)
		}
		if !dataExists(t, s, "ghost-town") {
			t.Fatal("the reconciler dropped an orphan on its own")
		}
		_, err = s.Create(ctx, CreateInput{Slug: "ghost-town"})
		var ae *apperr.Error
		if !errors.As(err, &ae) || ae.Code != "database_exists" || !strings.Contains(ae.Message, "Unclaimed databases") {
			t.Fatalf("creating over an orphan: %v", err)
		}
		kept := "kept.db"
		if d == store.Postgres {
			kept = s.pgName("kept")
		}
		if _, err := s.DropOrphan(ctx, orphan.Kind, kept, nil); !errors.Is(err, apperr.ErrNotFound) {
			t.Fatalf("removing a database an org uses: %v", err)
		}
		event := func(o Orphan) audit.Event {
			return audit.Event{Actor: audit.Actor{Type: audit.ActorPlatformAdmin, Name: "root@example.com"}, Action: "org.orphan_remove",
				Target: audit.Target{Type: "database", ID: o.Name}}
		}
		if _, err := s.DropOrphan(ctx, orphan.Kind, orphan.Name, event); err != nil {
			t.Fatal(err)
		}
		if dataExists(t, s, "ghost-town") || !dataExists(t, s, "kept") {
			t.Fatal("removal took the wrong database")
		}
		var n int64
		s.cfg.Catalog.Table(audit.PlatformTable).Where("action = ? AND target_id = ?", "org.orphan_remove", orphan.Name).Count(&n)
		if n != 1 {
			t.Fatalf("%d audit records of the removal", n)
		}
		if _, err := s.Create(ctx, CreateInput{Slug: "ghost-town"}); err != nil {
			t.Fatalf("slug after the orphan's removal: %v", err)
		}
	})
}

// Deleting an org whose pool a request still holds revokes the request at
// once, lets it finish its last query, and removes the data only after it
// released the pool, so nothing re-creates a SQLite file afterwards.
func TestDeleteWaitsForLastRequest(t *testing.T) {
	t.Parallel()
	s := newTestService(t, store.SQLite)
	ctx := context.Background()
	if _, err := s.Create(ctx, CreateInput{Slug: "busy"}); err != nil {
		t.Fatal(err)
	}
	h, err := s.Open(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	lastQuery := make(chan error, 1)
	go func() {
		<-h.Context().Done()
		var n int64
		lastQuery <- h.DB.Raw("SELECT count(*) FROM audit_events").Scan(&n).Error
		h.Release()
	}()
	if _, err := s.Delete(ctx, "busy", "busy"); err != nil {
		t.Fatal(err)
	}
	if err := <-lastQuery; err != nil {
		t.Fatalf("the revoked request's last query: %v", err)
	}
	for _, p := range sqliteFiles(filepath.Join(s.cfg.DataDir, s.sqliteRel("busy"))) {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after the deletion: %v", p, err)
		}
	}
	if _, err := s.Create(ctx, CreateInput{Slug: "busy"}); err != nil {
		t.Fatalf("create again: %v", err)
	}
}
