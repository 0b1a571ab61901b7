package orgs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

type fixture struct {
	svc     *orgs.Service
	d       store.Dialect
	dataDir string
	prefix  string
}

func newFixture(t *testing.T, d store.Dialect) *fixture {
	t.Helper()
	box, err := sealed.New([]byte(strings.Repeat("m", 32)))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{d: d, dataDir: t.TempDir(), prefix: storetest.NewName("gh_test_org_") + "_"}
	cfg := orgs.Config{Catalog: storetest.Open(t, d, store.CatalogSet), Box: box, DataDir: f.dataDir, DBPrefix: f.prefix}
	if d == store.Postgres {
		cfg.ServerDSN = storetest.AdminDSN(t)
		storetest.DropPrefixedAtCleanup(t, f.prefix)
	}
	f.svc = orgs.New(cfg)
	t.Cleanup(f.svc.Close)
	return f
}

// exists reports whether org slug's database (file or Postgres db) exists.
func (f *fixture) exists(t *testing.T, slug string) bool {
	t.Helper()
	if f.d == store.Postgres {
		return storetest.PostgresDatabaseExists(t, f.prefix+strings.ReplaceAll(slug, "-", "_"))
	}
	_, err := os.Stat(filepath.Join(f.dataDir, "orgs", slug+".db"))
	return err == nil
}

func TestIsolationAndDelete(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		ctx := context.Background()
		for _, slug := range []string{"acme", "globex"} {
			if _, err := f.svc.Create(ctx, orgs.CreateInput{Slug: slug, Name: strings.ToUpper(slug)}); err != nil {
				t.Fatalf("create %s: %v", slug, err)
			}
		}
		a, err := f.svc.Open(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if err := a.DB.Exec("INSERT INTO org_settings (key, value) VALUES ('secret-plan', 'acme only')").Error; err != nil {
			t.Fatal(err)
		}
		a.Release()
		b, err := f.svc.Open(ctx, "globex")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := b.DB.Raw("SELECT count(*) FROM org_settings WHERE key = 'secret-plan'").Scan(&n).Error; err != nil || n != 0 {
			t.Fatalf("globex sees %d of acme's rows (err %v)", n, err)
		}
		b.Release()

		if !f.exists(t, "acme") {
			t.Fatal("acme database missing before delete")
		}
		if _, err := f.svc.Delete(ctx, "acme", "wrong"); !errors.Is(err, apperr.ErrInvalid) {
			t.Fatalf("delete with wrong confirmation: %v", err)
		}
		if _, err := f.svc.Delete(ctx, "acme", "acme"); err != nil {
			t.Fatal(err)
		}
		if f.exists(t, "acme") {
			t.Fatal("acme database still exists after delete")
		}
		if _, err := f.svc.Get(ctx, "acme"); !errors.Is(err, apperr.ErrNotFound) {
			t.Fatalf("get deleted org: %v", err)
		}
		if !f.exists(t, "globex") {
			t.Fatal("deleting acme removed globex")
		}
	})
}

func TestCreateFailsCleanly(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		ctx := context.Background()
		if _, err := f.svc.Create(ctx, orgs.CreateInput{Slug: "taken"}); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			slug  string
			field string
		}{
			{"taken", "slug"},
			{"ab", "slug"},
			{"Upper", "slug"},
			{"-dash", "slug"},
			{"has space", "slug"},
			{strings.Repeat("a", 41), "slug"},
			{"new", "slug"},
		}
		for _, tc := range cases {
			_, err := f.svc.Create(ctx, orgs.CreateInput{Slug: tc.slug})
			var ve *apperr.ValidationError
			if !errors.As(err, &ve) || ve.Fields[tc.field] == "" {
				t.Errorf("create %q: err = %v, want a validation error on %s", tc.slug, err, tc.field)
			}
		}
		list, err := f.svc.List(ctx, "", 0)
		if err != nil || len(list) != 1 {
			t.Fatalf("catalog has %d orgs after failed creates (err %v), want 1", len(list), err)
		}
		for _, slug := range []string{"ab", "new"} {
			if f.exists(t, slug) {
				t.Errorf("a database for rejected slug %q exists", slug)
			}
		}
		if !f.exists(t, "taken") {
			t.Error("the original org's database vanished after a duplicate create")
		}
	})
}

func TestSuspendBlocksOpen(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		ctx := context.Background()
		if _, err := f.svc.Create(ctx, orgs.CreateInput{Slug: "sleepy"}); err != nil {
			t.Fatal(err)
		}
		h, err := f.svc.Open(ctx, "sleepy")
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
		if _, err := f.svc.SetStatus(ctx, "sleepy", orgs.StatusSuspended); err != nil {
			t.Fatal(err)
		}
		if f.svc.OpenPools() != 0 {
			t.Fatal("suspend left the pool open")
		}
		if _, err := f.svc.Open(ctx, "sleepy"); !errors.Is(err, apperr.ErrSuspended) {
			t.Fatalf("open suspended: %v", err)
		}
		if _, err := f.svc.SetStatus(ctx, "sleepy", orgs.StatusSuspended); !errors.Is(err, apperr.ErrConflict) {
			t.Fatalf("suspend twice: %v", err)
		}
		if _, err := f.svc.SetStatus(ctx, "sleepy", orgs.StatusActive); err != nil {
			t.Fatal(err)
		}
		h, err = f.svc.Open(ctx, "sleepy")
		if err != nil {
			t.Fatalf("open after resume: %v", err)
		}
		h.Release()
	})
}

func TestIdlePoolsClose(t *testing.T) {
	t.Parallel()
	box, _ := sealed.New([]byte(strings.Repeat("m", 32)))
	now := time.Now()
	clock := func() time.Time { return now }
	svc := orgs.New(orgs.Config{Catalog: storetest.Open(t, store.SQLite, store.CatalogSet), Box: box,
		DataDir: t.TempDir(), IdleClose: time.Minute, Now: clock})
	t.Cleanup(svc.Close)
	ctx := context.Background()
	if _, err := svc.Create(ctx, orgs.CreateInput{Slug: "idle"}); err != nil {
		t.Fatal(err)
	}
	h, err := svc.Open(ctx, "idle")
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if n := svc.CloseIdle(); n != 0 {
		t.Fatal("closed a pool that is in use")
	}
	h.Release()
	now = now.Add(2 * time.Minute)
	if n := svc.CloseIdle(); n != 1 || svc.OpenPools() != 0 {
		t.Fatalf("CloseIdle closed %d, %d still open", n, svc.OpenPools())
	}
}

func TestAttachExistingPostgresDatabase(t *testing.T) {
	t.Parallel()
	f := newFixture(t, store.Postgres)
	ctx := context.Background()
	// The admin prepared an empty database elsewhere (here: same server).
	name := f.prefix + "attached"
	storetest.CreatePostgresDB(t, name)
	dsn, err := store.WithDatabase(storetest.AdminDSN(t), name)
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.svc.Create(ctx, orgs.CreateInput{Slug: "attached", AttachDSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	if !o.Attached || o.Dialect != store.Postgres {
		t.Fatalf("org = %+v", o)
	}
	h, err := f.svc.Open(ctx, "attached")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := h.DB.Raw("SELECT count(*) FROM schema_migrations").Scan(&n).Error; err != nil || n == 0 {
		t.Fatalf("attached database not migrated: %d, %v", n, err)
	}
	h.Release()

	// A database that already has tables is refused, and left untouched.
	if _, err := f.svc.Create(ctx, orgs.CreateInput{Slug: "second", AttachDSN: dsn}); !errors.Is(err, apperr.ErrInvalid) {
		t.Fatalf("attaching a non-empty database: %v", err)
	}
	if !storetest.PostgresDatabaseExists(t, name) {
		t.Fatal("a refused attach dropped the database")
	}
	if _, err := f.svc.Get(ctx, "second"); !errors.Is(err, apperr.ErrNotFound) {
		t.Fatal("a refused attach left a catalog row")
	}
	// A DSN without a database name is a validation error.
	if _, err := f.svc.Create(ctx, orgs.CreateInput{Slug: "third", AttachDSN: "postgres://postgres@127.0.0.1:5432"}); !errors.Is(err, apperr.ErrInvalid) {
		t.Fatalf("attach without a database name: %v", err)
	}
	// Deleting the org removes the attached database too.
	if _, err := f.svc.Delete(ctx, "attached", "attached"); err != nil {
		t.Fatal(err)
	}
	if storetest.PostgresDatabaseExists(t, name) {
		t.Fatal("deleting the org left the attached database")
	}
}

// TestConcurrentOpensOfOnePool: opens served from the cached org row and
// opens that re-read it (its cache lapsed) run at once on one pool; under
// -race this caught the cached path reading the row after unlocking while
// a re-read replaced it.
func TestConcurrentOpensOfOnePool(t *testing.T) {
	t.Parallel()
	box, _ := sealed.New([]byte(strings.Repeat("m", 32)))
	var tick atomic.Int64
	start := time.Now()
	// Every call moves the clock 20 ms: the row cache (1 s) lapses every
	// dozen opens, so both paths run.
	clock := func() time.Time { return start.Add(time.Duration(tick.Add(1)) * 20 * time.Millisecond) }
	svc := orgs.New(orgs.Config{Catalog: storetest.Open(t, store.SQLite, store.CatalogSet), Box: box,
		DataDir: t.TempDir(), IdleClose: time.Hour, Now: clock})
	t.Cleanup(svc.Close)
	ctx := context.Background()
	if _, err := svc.Create(ctx, orgs.CreateInput{Slug: "busy", Name: "Busy"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 400 {
				h, err := svc.Open(ctx, "busy")
				if err != nil {
					errs <- err
					return
				}
				if h.Org.Slug != "busy" {
					errs <- fmt.Errorf("handle for %q", h.Org.Slug)
				}
				h.Release()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestEachOpenKeepsIdlePoolsClosing: a metrics scrape reads the open org
// pools only, and does not count as a use that keeps them open.
func TestEachOpenKeepsIdlePoolsClosing(t *testing.T) {
	t.Parallel()
	box, _ := sealed.New([]byte(strings.Repeat("m", 32)))
	now := time.Now()
	clock := func() time.Time { return now }
	svc := orgs.New(orgs.Config{Catalog: storetest.Open(t, store.SQLite, store.CatalogSet), Box: box,
		DataDir: t.TempDir(), IdleClose: time.Minute, Now: clock})
	t.Cleanup(svc.Close)
	ctx := context.Background()
	for _, slug := range []string{"used", "idle"} {
		if _, err := svc.Create(ctx, orgs.CreateInput{Slug: slug}); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(2 * time.Minute)
	svc.CloseIdle()
	h, err := svc.Open(ctx, "used")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	var seen []string
	scrape := func() {
		seen = nil
		if err := svc.EachOpen(func(slug string, db *gorm.DB) error {
			seen = append(seen, slug)
			return db.Exec("SELECT 1").Error
		}); err != nil {
			t.Fatal(err)
		}
	}
	scrape()
	if len(seen) != 1 || seen[0] != "used" {
		t.Fatalf("EachOpen saw %v, want only the open pool [used]", seen)
	}
	now = now.Add(50 * time.Second)
	scrape()
	now = now.Add(20 * time.Second)
	if n := svc.CloseIdle(); n != 1 || svc.OpenPools() != 0 {
		t.Fatalf("a pool only scraped since its last use: CloseIdle closed %d, %d open", n, svc.OpenPools())
	}
}
