package console_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestBootstrapAdminAndItsRecordTogether: when the platform audit log
// refuses the first admin's record, the admin is not created either, so the
// next start creates both; no admin exists without its record.
func TestBootstrapAdminAndItsRecordTogether(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		cfg := config.Config{DataDir: t.TempDir(), MasterKey: testMasterKey, AdminEmail: "admin@example.com",
			AdminPassword: "a long enough password", TokenTTL: time.Hour, HealthInterval: time.Hour,
			OrgDBPrefix: storetest.NewName("gh_test_boot_") + "_"}
		refuse := []string{`CREATE TRIGGER refuse_admin_create BEFORE INSERT ON ` + audit.PlatformTable +
			` FOR EACH ROW WHEN (NEW.action = '` + platform.ActionAdminCreate + `') BEGIN SELECT RAISE(ABORT, 'refused'); END`}
		allow := []string{`DROP TRIGGER refuse_admin_create`}
		if d == store.Postgres {
			cfg.DatabaseURL = storetest.DSN(t, store.Postgres)
			storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
			refuse = []string{`CREATE FUNCTION refuse_admin_create() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$`,
				`CREATE TRIGGER refuse_admin_create BEFORE INSERT ON ` + audit.PlatformTable +
					` FOR EACH ROW WHEN (NEW.action = '` + platform.ActionAdminCreate + `') EXECUTE FUNCTION refuse_admin_create()`}
			allow = []string{`DROP TRIGGER refuse_admin_create ON ` + audit.PlatformTable, `DROP FUNCTION refuse_admin_create()`}
		}
		exec := func(stmts []string) {
			t.Helper()
			cat, err := console.OpenCatalog(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = store.Close(cat) }()
			for _, s := range stmts {
				if err := cat.Exec(s).Error; err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}
		}
		logger := slog.New(slog.NewTextHandler(io.Discard, nil))

		exec(refuse)
		if c, err := console.New(ctx, cfg, logger); err == nil {
			c.Close()
			t.Fatal("the console started although the first admin's record was refused")
		}
		exec(allow)
		c, err := console.New(ctx, cfg, logger)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !c.AdminCreated {
			t.Fatal("the admin was left from the start whose record failed")
		}
		f, err := audit.ParseQuery("action:" + platform.ActionAdminCreate)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := c.Audit.Query(ctx, f, 0, 10)
		if err != nil || len(evs) != 1 || evs[0].Target.Name != "admin@example.com" || evs[0].Actor.Name != "bootstrap" {
			t.Fatalf("admin records: %+v, %v", evs, err)
		}
		if v, err := c.Audit.Verify(ctx); err != nil || !v.OK {
			t.Fatalf("platform chain: %+v, %v", v, err)
		}
	})
}
