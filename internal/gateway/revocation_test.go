package gateway

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
		DBPrefix: storetest.NewName("gh_test_revoke_") + "_"}
	if d == store.Postgres {
		cfg.ServerDSN = storetest.AdminDSN(t)
		storetest.DropPrefixedAtCleanup(t, cfg.DBPrefix)
	}
	svc := orgs.New(cfg)
	t.Cleanup(svc.Close)
	return &tenant.Registry{Orgs: svc, Box: box, TokenTTL: time.Hour}
}

// A request waiting on its org (as a long-poll, a terminal or a follower
// does, bound by bindRevoked to the tenant's context) ends as soon as the
// org is suspended or deleted, with the revocation's own cause, which is
// also what it answers (a deleted org says deleted, not suspended); and
// the pool it held closes once it is released rather than under it.
func TestRevocationEndsWaitingRequests(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		revoke   func(ctx context.Context, svc *orgs.Service, slug string) error
		want     error
		wantCode string
	}{
		{"suspend", func(ctx context.Context, svc *orgs.Service, slug string) error {
			_, err := svc.SetStatus(ctx, slug, orgs.StatusSuspended)
			return err
		}, apperr.ErrSuspended, "org_suspended"},
		{"delete", func(ctx context.Context, svc *orgs.Service, slug string) error {
			_, err := svc.Delete(ctx, slug, slug)
			return err
		}, apperr.ErrNotFound, "org_deleted"},
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
					org := Org{Slug: "acme", DB: ten.DB, Revoked: ten.Context()}
					bound, cancel := tenant.BindRevoked(r.Context(), org.Revoked)
					defer cancel()
					waiting <- ten
					<-bound.Done()
					var ae *apperr.Error
					if errors.As(revokedErr(org), &ae) {
						w.Header().Set("X-Answer-Code", ae.Code)
					}
					_, _ = io.WriteString(w, context.Cause(bound).Error())
				}))
				t.Cleanup(srv.Close)
				type answer struct {
					body, code string
					err        error
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
					answered <- answer{string(b), res.Header.Get("X-Answer-Code"), err}
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
					if a.code != tc.wantCode {
						t.Fatalf("the ended request answers %q, want %q", a.code, tc.wantCode)
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

// bindRevoked ends with its parent too, saying so, and a nil revoked
// context never ends it; nothing revoked answers no revocation.
func TestBindRevokedFollowsItsParent(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.Background())
	bound, cancel := tenant.BindRevoked(parent, nil)
	defer cancel()
	if bound.Err() != nil {
		t.Fatal("bound to nothing revoked, the context ended at once")
	}
	cancelParent()
	<-bound.Done()
	if !errors.Is(context.Cause(bound), context.Canceled) {
		t.Fatalf("ended with %v, want the parent's cancellation", context.Cause(bound))
	}
	if err := revokedErr(Org{}); err != nil {
		t.Fatalf("an org never revoked answers %v", err)
	}
	revoked, revoke := context.WithCancelCause(context.Background())
	bound, cancel = tenant.BindRevoked(context.Background(), revoked)
	cancel()
	revoke(errors.New("late"))
	if c := context.Cause(bound); !errors.Is(c, context.Canceled) {
		t.Fatalf("a revocation after cancel replaced its cause: %v", c)
	}
}
