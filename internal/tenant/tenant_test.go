package tenant_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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

// A request waiting on its tenant (as a long-poll will) ends as soon as
// the org is suspended or deleted, and the pool it held closes once it is
// released rather than under it.
func TestRevocationEndsWaitingRequests(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		revoke func(ctx context.Context, svc *orgs.Service, slug string) error
		want   error
	}{
		{"suspend", func(ctx context.Context, svc *orgs.Service, slug string) error {
			_, err := svc.SetStatus(ctx, slug, orgs.StatusSuspended)
			return err
		}, apperr.ErrSuspended},
		{"delete", func(ctx context.Context, svc *orgs.Service, slug string) error {
			_, err := svc.Delete(ctx, slug, slug)
			return err
		}, apperr.ErrNotFound},
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				reg := newRegistry(t, d)
				ctx := context.Background()
				if _, err := reg.Orgs.Create(ctx, orgs.CreateInput{Slug: "acme"}); err != nil {
					t.Fatal(err)
				}
				waiting := make(chan *tenant.Tenant, 1)
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ten, err := reg.Open(r.Context(), "acme")
					if err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					defer ten.Release()
					bound, cancel := ten.Bind(r.Context())
					defer cancel()
					waiting <- ten
					<-bound.Done()
					_, _ = io.WriteString(w, context.Cause(bound).Error())
				}))
				t.Cleanup(srv.Close)
				type answer struct {
					body string
					err  error
				}
				answered := make(chan answer, 1)
				// Ending the client's request frees the handler should the
				// test fail before the revocation.
				reqCtx, cancelReq := context.WithCancel(ctx)
				t.Cleanup(cancelReq)
				go func() {
					req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, srv.URL, nil)
					res, err := http.DefaultClient.Do(req)
					if err != nil {
						answered <- answer{err: err}
						return
					}
					defer res.Body.Close()
					b, err := io.ReadAll(res.Body)
					answered <- answer{string(b), err}
				}()
				ten := <-waiting
				if err := tc.revoke(ctx, reg.Orgs, "acme"); err != nil {
					t.Fatal(err)
				}
				select {
				case a := <-answered:
					if a.err != nil {
						t.Fatal(a.err)
					}
					if cause := context.Cause(ten.Context()); !errors.Is(cause, tc.want) || a.body != cause.Error() {
						t.Fatalf("request ended with %q, cause %v; want %v", a.body, cause, tc.want)
					}
				case <-time.After(time.Second):
					t.Fatal("the waiting request was not released within a second of the revocation")
				}
				// Released: the pool is closed now, not before.
				sqlDB, err := ten.DB.DB()
				if err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(5 * time.Second)
				for sqlDB.Ping() == nil && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if err := sqlDB.Ping(); err == nil {
					t.Fatal("the revoked pool is still open after its last user released it")
				}
				if n := reg.Orgs.OpenPools(); n != 0 {
					t.Fatalf("%d pools open after revocation", n)
				}
			})
		}
	})
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
	case <-ten.Done():
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
