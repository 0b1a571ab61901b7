package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func TestDisableAndRevokeTakeEffectAtOnce(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		admin := f.tokens["admin"]
		// The member's session and personal key both work...
		wantStatus(t, "member me", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.tokens["member"], nil), http.StatusOK)
		wantStatus(t, "member key me", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.keys["member-key"], nil), http.StatusOK)
		// ...until the member is disabled: the very next requests fail.
		wantStatus(t, "disable", e.json(http.MethodPatch, fmt.Sprintf("/api/v1/orgs/acme/users/%d", f.ids["member"]), admin, map[string]string{"status": "disabled"}), http.StatusOK)
		wantStatus(t, "disabled session", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.tokens["member"], nil), http.StatusUnauthorized)
		wantStatus(t, "disabled user's key", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.keys["member-key"], nil), http.StatusUnauthorized)
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": "member@acme.test", "password": userPassword})
		wantStatus(t, "disabled login", r, http.StatusUnauthorized)
		if env := r.envelope(t); env.Error.Code != "bad_credentials" {
			t.Fatalf("disabled login code %q: it must look like any other bad sign-in", env.Error.Code)
		}
		// Re-enabling lets them sign in again (old sessions stay revoked).
		wantStatus(t, "enable", e.json(http.MethodPatch, fmt.Sprintf("/api/v1/orgs/acme/users/%d", f.ids["member"]), admin, map[string]string{"status": "active"}), http.StatusOK)
		wantStatus(t, "old session after enable", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.tokens["member"], nil), http.StatusUnauthorized)
		e.orgLogin("acme", "member@acme.test", userPassword)

		// Revoking the service key stops it on the next request.
		wantStatus(t, "key audit", e.json(http.MethodGet, "/api/v1/orgs/acme/audit", f.keys["auditor-key"], nil), http.StatusOK)
		var list struct {
			Items []struct {
				ID   int64
				Name string
			}
		}
		e.json(http.MethodGet, "/api/v1/orgs/acme/api-keys", admin, nil).decode(t, &list)
		var keyID int64
		for _, k := range list.Items {
			if k.Name == "audit bot" {
				keyID = k.ID
			}
		}
		wantStatus(t, "revoke", e.json(http.MethodDelete, fmt.Sprintf("/api/v1/orgs/acme/api-keys/%d", keyID), admin, nil), http.StatusNoContent)
		wantStatus(t, "revoked key", e.json(http.MethodGet, "/api/v1/orgs/acme/audit", f.keys["auditor-key"], nil), http.StatusUnauthorized)

		// The audit log names the key and the admin's actions.
		evs := e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:api_key.revoke", admin, nil)
		mustContain(t, "revoke event", string(evs.body), "audit bot", "admin@acme.test")
		views := e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:audit.view", admin, nil)
		mustContain(t, "audit view by key", string(views.body), "api_key", "audit bot (gh_")
	})
}

func TestOrgLoginThrottleAndEnumeration(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	var delays []time.Duration
	e.c.Server.Sleep = func(_ context.Context, d time.Duration) { delays = append(delays, d) }
	login := func(email, pw string) response {
		return e.json(http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": email, "password": pw})
	}
	unknown := login("nobody@acme.test", "wrong-password-123")
	known := login("plain@acme.test", "wrong-password-123")
	if unknown.status != known.status || string(unknown.body) != string(known.body) {
		t.Fatalf("unknown and known emails answer differently:\n%d %s\n%d %s", unknown.status, unknown.body, known.status, known.body)
	}
	// Failures on one account are slowed, then refused, even with the
	// right password.
	for i := 0; i < 12; i++ {
		login("owner@acme.test", "wrong")
	}
	if len(delays) == 0 || delays[len(delays)-1] <= 0 {
		t.Fatalf("repeated failures were not slowed: %v", delays)
	}
	r := login("owner@acme.test", userPassword)
	wantStatus(t, "locked account", r, http.StatusTooManyRequests)
	mustContain(t, "lock message", r.envelope(t).Error.Message, "too many")
	// The lock is per account: another account from the same address is
	// still refused because the address also crossed the limit.
	r = login("auditor@acme.test", userPassword)
	wantStatus(t, "locked address", r, http.StatusTooManyRequests)
	// Failures were audited without revealing passwords.
	admin := f.tokens["entered-admin"]
	body := string(e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:user.login+decision:deny&limit=100", admin, nil).body)
	mustContain(t, "denied logins", body, "owner@acme.test", "bad_credentials", "login_locked")
	if strings.Contains(body, "wrong-password-123") || strings.Contains(body, userPassword) {
		t.Fatal("a password reached the audit log")
	}
}

func TestPlatformAdminEnteringIsAuditedTwice(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	plat := string(e.json(http.MethodGet, "/api/v1/audit?limit=100", f.platform, nil).body)
	mustContain(t, "platform log", plat, `"action":"org.enter"`, `"id":"acme"`, `"id":"globex"`)
	org := string(e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:org.enter", f.tokens["admin"], nil).body)
	mustContain(t, "org log", org, `"action":"org.enter"`, adminEmail)
	// The entered admin acts as an org admin and shows as a platform admin.
	r := e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.tokens["entered-admin"], nil)
	mustContain(t, "me", string(r.body), `"kind":"platform_admin"`)
	// Its token is no good in the other org.
	wantStatus(t, "entered token elsewhere", e.json(http.MethodGet, "/api/v1/orgs/globex/me", f.tokens["entered-admin"], nil), http.StatusUnauthorized)
}

func TestDepartmentOwnerManagesOnlyOwnDepartment(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	owner := f.tokens["owner"]
	path := func(dept int64, uid int64) string {
		return fmt.Sprintf("/api/v1/orgs/acme/departments/%d/members/%d", dept, uid)
	}
	wantStatus(t, "owner adds member to own dept", e.json(http.MethodPut, path(f.dept1, f.ids["plain"]), owner, map[string]string{"role": "member"}), http.StatusNoContent)
	wantStatus(t, "owner adds member elsewhere", e.json(http.MethodPut, path(f.dept2, f.ids["plain"]), owner, map[string]string{"role": "member"}), http.StatusNotFound)
	// plain now sees Research but not Scratch.
	var ds struct{ Items []struct{ Name string } }
	e.json(http.MethodGet, "/api/v1/orgs/acme/departments", f.tokens["plain"], nil).decode(t, &ds)
	if len(ds.Items) != 1 || ds.Items[0].Name != "Research" {
		t.Fatalf("plain sees departments %+v, want only Research", ds.Items)
	}
	wantStatus(t, "owner cannot grant org-admin", e.json(http.MethodPost, "/api/v1/orgs/acme/roles", owner,
		map[string]string{"subject": fmt.Sprintf("user:%d", f.ids["plain"]), "role": "org-admin", "domain": "org"}), http.StatusForbidden)
	// A deny rule overrides the owner's role at once.
	wantStatus(t, "deny rule", e.json(http.MethodPost, "/api/v1/orgs/acme/policies", f.tokens["admin"], map[string]string{
		"subject": fmt.Sprintf("user:%d", f.ids["owner"]), "domain": fmt.Sprintf("dept:%d", f.dept1), "object": "members", "action": "update", "effect": "deny"}), http.StatusNoContent)
	wantStatus(t, "owner after deny", e.json(http.MethodDelete, path(f.dept1, f.ids["plain"]), owner, nil), http.StatusNotFound)
}
