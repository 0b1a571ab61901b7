package handlers_test

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestPlatformOrgLifecycle drives create, suspend, resume and delete
// through the API on both engines and checks the platform audit log
// recorded each with who did it and from where.
func TestPlatformOrgLifecycle(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		e := newEnv(t, d)
		ctx := t.Context()
		tok := e.adminToken()
		e.createOrg(tok, "acme", "Acme Corp")

		type orgBody struct {
			Slug     string `json:"slug"`
			Status   string `json:"status"`
			Database struct {
				Dialect string `json:"dialect"`
			} `json:"database"`
			SuspendedAt *string `json:"suspended_at"`
		}
		get := func() orgBody {
			t.Helper()
			r := e.json(http.MethodGet, "/api/v1/orgs/acme", tok, nil)
			wantStatus(t, "get acme", r, http.StatusOK)
			var o orgBody
			r.decode(t, &o)
			return o
		}
		if o := get(); o.Status != "active" || o.Database.Dialect != string(d) {
			t.Fatalf("new org: %+v", o)
		}
		h, err := e.c.Orgs.Open(ctx, "acme")
		if err != nil {
			t.Fatalf("open active org: %v", err)
		}
		h.Release()
		// The org's own routes answer while it is active: a wrong sign-in
		// is a plain 401, the login page renders.
		orgLogin := func() response {
			return e.json(http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": "nobody@acme.test", "password": "wrong password here"})
		}
		wantStatus(t, "org login while active", orgLogin(), http.StatusUnauthorized)
		wantStatus(t, "org login page while active", e.do(request{method: "GET", path: "/o/acme/login"}), http.StatusOK)

		wantStatus(t, "suspend", e.json(http.MethodPost, "/api/v1/orgs/acme/suspend", tok, nil), http.StatusOK)
		if o := get(); o.Status != "suspended" || o.SuspendedAt == nil {
			t.Fatalf("after suspend: %+v", o)
		}
		if _, err := e.c.Orgs.Open(ctx, "acme"); !errors.Is(err, apperr.ErrSuspended) {
			t.Fatalf("open suspended org: %v, want ErrSuspended", err)
		}
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/suspend", tok, nil)
		wantStatus(t, "suspend twice", r, http.StatusConflict)
		r.envelope(t)
		// Suspension blocks every org route, sign-in included.
		r = orgLogin()
		wantStatus(t, "org login while suspended", r, http.StatusForbidden)
		if env := r.envelope(t); env.Error.Code != "org_suspended" {
			t.Errorf("org login while suspended: code %q", env.Error.Code)
		}
		r = e.do(request{method: "GET", path: "/o/acme/login"})
		wantStatus(t, "org login page while suspended", r, http.StatusForbidden)
		mustContain(t, "suspended org page", string(r.body), "suspended")

		wantStatus(t, "resume", e.json(http.MethodPost, "/api/v1/orgs/acme/resume", tok, nil), http.StatusOK)
		if o := get(); o.Status != "active" || o.SuspendedAt != nil {
			t.Fatalf("after resume: %+v", o)
		}
		h, err = e.c.Orgs.Open(ctx, "acme")
		if err != nil {
			t.Fatalf("open resumed org: %v", err)
		}
		h.Release()
		wantStatus(t, "org login after resume", orgLogin(), http.StatusUnauthorized)

		wantStatus(t, "delete", e.json(http.MethodDelete, "/api/v1/orgs/acme?confirm=acme", tok, nil), http.StatusNoContent)
		wantStatus(t, "get deleted", e.json(http.MethodGet, "/api/v1/orgs/acme", tok, nil), http.StatusNotFound)
		if d == store.Postgres && storetest.PostgresDatabaseExists(t, e.cfg.OrgDBPrefix+"acme") {
			t.Error("the org's Postgres database survived its deletion")
		}
		if d == store.SQLite {
			if _, err := os.Stat(filepath.Join(e.cfg.DataDir, "orgs", "acme.db")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the org's SQLite file survived its deletion: %v", err)
			}
		}

		r = e.json(http.MethodGet, "/api/v1/audit?limit=100", tok, nil)
		wantStatus(t, "audit", r, http.StatusOK)
		var page struct {
			Items []audit.Event `json:"items"`
		}
		r.decode(t, &page)
		want := []string{"platform.login", "org.create", "org.suspend", "org.resume", "org.delete"}
		seen := map[string]audit.Event{}
		for _, ev := range page.Items {
			if ev.Decision == audit.Allow {
				seen[ev.Action] = ev
			}
		}
		for _, action := range want {
			ev, ok := seen[action]
			if !ok {
				t.Errorf("platform audit log lacks an allowed %s event", action)
				continue
			}
			if ev.Actor.Type != audit.ActorPlatformAdmin || ev.Actor.Name != adminEmail || ev.Actor.ID == "" {
				t.Errorf("%s: actor %+v, want the platform admin %s", action, ev.Actor, adminEmail)
			}
			if ev.SourceIP != "127.0.0.1" {
				t.Errorf("%s: source_ip %q, want 127.0.0.1", action, ev.SourceIP)
			}
			if action != "platform.login" && (ev.Target.Type != "organization" || ev.Target.ID != "acme") {
				t.Errorf("%s: target %+v", action, ev.Target)
			}
			if ev.Hash == "" || ev.PrevHash == "" && ev.Seq > 1 {
				t.Errorf("%s: not chained (seq %d prev %q hash %q)", action, ev.Seq, ev.PrevHash, ev.Hash)
			}
		}
		if v, err := e.c.Audit.Verify(ctx); err != nil || !v.OK || v.Checked < int64(len(want)) {
			t.Errorf("platform audit chain: %+v, %v", v, err)
		}
		// Newest first, with strictly decreasing sequence numbers.
		for i := 1; i < len(page.Items); i++ {
			if page.Items[i].Seq >= page.Items[i-1].Seq {
				t.Fatalf("audit page not newest-first at %d: %d then %d", i, page.Items[i-1].Seq, page.Items[i].Seq)
			}
		}
	})
}
