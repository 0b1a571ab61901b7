package handlers_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// failAudit makes the org database refuse audit records of one action, the
// way a full disk or a broken replica would.
func failAudit(t *testing.T, f *orgFixture, d store.Dialect, action string) {
	t.Helper()
	ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer ten.Release()
	stmts := []string{"CREATE TRIGGER gh_fail_audit BEFORE INSERT ON audit_events WHEN NEW.action = '" + action + "' BEGIN SELECT RAISE(ABORT, 'audit store down'); END"}
	if d == store.Postgres {
		stmts = []string{
			"CREATE FUNCTION gh_fail_audit() RETURNS trigger AS $$ BEGIN IF NEW.action = '" + action + "' THEN RAISE EXCEPTION 'audit store down'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
			"CREATE TRIGGER gh_fail_audit BEFORE INSERT ON audit_events FOR EACH ROW EXECUTE FUNCTION gh_fail_audit()",
		}
	}
	for _, s := range stmts {
		if err := ten.DB.Exec(s).Error; err != nil {
			t.Fatal(err)
		}
	}
}

// TestNothingHalfWritten: a change whose audit record cannot be written
// does not happen.
func TestNothingHalfWritten(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		admin := f.tokens["admin"]
		failAudit(t, f, d, "user.password_reset")
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/users/"+itoa(f.ids["plain"])+"/reset-password", admin, nil)
		wantStatus(t, "reset with the audit store down", r, http.StatusInternalServerError)
		// The old password, session and key all still work: nothing changed.
		e.orgLogin("acme", "plain@acme.test", userPassword)
		wantStatus(t, "member key", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.keys["member-key"], nil), http.StatusOK)

		// Other mutations are unaffected, and their records are there.
		r = e.json(http.MethodPost, "/api/v1/orgs/acme/departments", admin, map[string]string{"name": "Ops"})
		wantStatus(t, "department with the store up", r, http.StatusCreated)
		mustContain(t, "its record", string(e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:department.create", admin, nil).body), `"Ops"`)
		r = e.json(http.MethodPost, "/api/v1/orgs/acme/audit/verify", admin, nil)
		mustContain(t, "chain", string(r.body), `"ok":true`)
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
