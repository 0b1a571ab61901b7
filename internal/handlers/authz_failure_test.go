package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestFailedPolicyCheckIsAnError: when casbin cannot decide (its policy
// version cannot be read), object routes answer 500, never 403 or 404, and
// no denial is written; once the database is whole again, checks work.
func TestFailedPolicyCheckIsAnError(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/environments", f.tokens["entered-admin"], map[string]any{"name": "build", "kind": "host",
			"department_id": f.dept1, "url": "http://127.0.0.1:1", "os": "linux", "deployment": "bare-metal", "agentd_token": "0123456789abcdef0123"})
		wantStatus(t, "create environment", r, http.StatusCreated)
		var env struct{ ID int64 }
		r.decode(t, &env)
		// A department agent, so that listing agents must ask casbin.
		r = e.json(http.MethodPost, "/api/v1/orgs/acme/agents", f.tokens["entered-admin"], map[string]any{"name": "coder",
			"department_id": f.dept1, "config": map[string]string{"model": "m"}, "environment_ids": []int64{env.ID}})
		wantStatus(t, "create agent", r, http.StatusCreated)

		ten, err := e.c.Tenants.Open(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		defer ten.Release()
		denials := func() int {
			evs, err := ten.Audit.Query(context.Background(), mustParse(t, "action:authz.deny"), 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			return len(evs)
		}
		before := denials()
		ten.Enforcer.SetCheckEvery(0)
		if err := ten.DB.Exec("ALTER TABLE policy_version RENAME TO policy_version_away").Error; err != nil {
			t.Fatal(err)
		}
		for _, who := range []string{"member", "plain", "admin"} {
			for _, path := range []string{fmt.Sprintf("/api/v1/orgs/acme/environments/%d", env.ID), "/api/v1/orgs/acme/agents", "/api/v1/orgs/acme/users"} {
				r := e.json(http.MethodGet, path, f.tokens[who], nil)
				if r.status != http.StatusInternalServerError {
					t.Errorf("GET %s as %s with casbin failing: %d %s, want 500", path, who, r.status, r.body)
				}
			}
		}
		if err := ten.DB.Exec("ALTER TABLE policy_version_away RENAME TO policy_version").Error; err != nil {
			t.Fatal(err)
		}
		if got := denials(); got != before {
			t.Errorf("%d denials written while the check was failing", got-before)
		}
		wantStatus(t, "member after recovery", e.json(http.MethodGet, fmt.Sprintf("/api/v1/orgs/acme/environments/%d", env.ID), f.tokens["member"], nil), http.StatusOK)
		wantStatus(t, "plain after recovery", e.json(http.MethodGet, fmt.Sprintf("/api/v1/orgs/acme/environments/%d", env.ID), f.tokens["plain"], nil), http.StatusNotFound)
		if got := denials(); got != before+1 {
			t.Errorf("the refusal after recovery wrote %d denials, want 1", got-before)
		}
	})
}
