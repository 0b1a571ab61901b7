package tenant_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

func newRegistry(t *testing.T, d store.Dialect) *tenant.Registry {
	t.Helper()
	box, err := sealed.New([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := orgs.Config{Catalog: storetest.Open(t, d, store.CatalogSet), Box: box, DataDir: t.TempDir(),
		DBPrefix: storetest.NewName("gh_test_tenant_") + "_"}
	if d == store.Postgres {
		cfg.ServerDSN = storetest.AdminDSN(t)
		storetest.DropPrefixedAtCleanup(t, cfg.DBPrefix)
	}
	svc := orgs.New(cfg)
	t.Cleanup(svc.Close)
	return &tenant.Registry{Orgs: svc, Box: box, TokenTTL: time.Hour}
}

// A revoked pool stays usable for requests that still hold it: suspending
// cancels their context but never closes the database under them.
func TestRevokedPoolStaysOpenWhileHeld(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t, store.SQLite)
	ctx := context.Background()
	if _, err := reg.Orgs.Create(ctx, orgs.CreateInput{Slug: "acme"}); err != nil {
		t.Fatal(err)
	}
	ten, err := reg.Open(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Orgs.SetStatus(ctx, "acme", orgs.StatusSuspended); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ten.Context().Done():
	default:
		t.Fatal("suspending did not end the tenant's context")
	}
	var n int64
	if err := ten.DB.Raw("SELECT count(*) FROM audit_events").Scan(&n).Error; err != nil {
		t.Fatalf("a held pool was closed by the suspension: %v", err)
	}
	ten.Release()
	ten.Release() // twice is harmless
	if _, err := reg.Open(ctx, "acme"); !errors.Is(err, apperr.ErrSuspended) {
		t.Fatalf("open after suspend: %v", err)
	}
}

// Requests arriving together at an org whose pool is not open yet share
// one runtime; building it twice at once raced inside casbin's adapter.
func TestConcurrentOpensShareOneRuntime(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t, store.SQLite)
	ctx := context.Background()
	if _, err := reg.Orgs.Create(ctx, orgs.CreateInput{Slug: "acme"}); err != nil {
		t.Fatal(err)
	}
	const n = 8
	tenants := make(chan *tenant.Tenant, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			ten, err := reg.Open(ctx, "acme")
			if err != nil {
				errs <- err
				return
			}
			tenants <- ten
		}()
	}
	var first *tenant.Tenant
	for range n {
		select {
		case err := <-errs:
			t.Fatal(err)
		case ten := <-tenants:
			if first == nil {
				first = ten
			} else if ten.Enforcer != first.Enforcer {
				t.Error("two runtimes were built for one pool")
			}
			defer ten.Release()
		}
	}
}
