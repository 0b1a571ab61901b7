package handlers_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
)

// TestHardening covers the holes a security review found, one case each.
func TestHardening(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	admin := f.tokens["admin"]

	t.Run("one-time password reaches nothing but the password change", func(t *testing.T) {
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/users", admin, map[string]string{"email": "fresh@acme.test"})
		wantStatus(t, "create", r, http.StatusCreated)
		var cu struct {
			OneTimePassword string `json:"one_time_password"`
		}
		r.decode(t, &cu)
		tok := e.orgLogin("acme", "fresh@acme.test", cu.OneTimePassword)
		for _, c := range []struct{ method, path string }{
			{http.MethodPost, "/api/v1/orgs/acme/api-keys"},
			{http.MethodPost, "/api/v1/orgs/acme/environments"},
			{http.MethodGet, "/api/v1/orgs/acme/agents"},
		} {
			r := e.json(c.method, c.path, tok, map[string]string{"name": "persist"})
			wantStatus(t, c.method+" "+c.path, r, http.StatusForbidden)
			if code := r.envelope(t).Error.Code; code != "password_change_required" {
				t.Fatalf("%s %s: code %q", c.method, c.path, code)
			}
		}
		wantStatus(t, "me", e.json(http.MethodGet, "/api/v1/orgs/acme/me", tok, nil), http.StatusOK)
	})

	t.Run("an entered admin's org sign-in ends with the platform sign-in", func(t *testing.T) {
		plat := e.adminToken()
		orgTok := e.enterOrg(plat, "acme")
		wantStatus(t, "entered", e.json(http.MethodGet, "/api/v1/orgs/acme/users", orgTok, nil), http.StatusOK)
		wantStatus(t, "platform logout", e.json(http.MethodPost, "/api/v1/auth/logout", plat, nil), http.StatusNoContent)
		wantStatus(t, "entered after logout", e.json(http.MethodGet, "/api/v1/orgs/acme/users", orgTok, nil), http.StatusUnauthorized)
	})

	t.Run("sign-in never redirects off the site", func(t *testing.T) {
		for _, next := range []string{"/\t/evil.example", "/\\evil.example", "//evil.example", "https://evil.example/"} {
			csrf := "hardening-csrf-token-0123456789"
			form := url.Values{"email": {"plain@acme.test"}, "password": {userPassword}, "next": {next}, "_csrf": {csrf}}
			r := e.do(request{method: http.MethodPost, path: "/o/acme/login", contentType: "application/x-www-form-urlencoded",
				body: strings.NewReader(form.Encode()), cookies: []*http.Cookie{{Name: "gh_csrf", Value: csrf}}})
			wantStatus(t, "login next="+next, r, http.StatusSeeOther)
			if loc := r.header.Get("Location"); loc != "/o/acme/" {
				t.Fatalf("next=%q redirected to %q", next, loc)
			}
		}
	})

	t.Run("built-in rules cannot be removed", func(t *testing.T) {
		r := e.json(http.MethodDelete, "/api/v1/orgs/acme/roles?subject=platform-admin&role=org-admin&domain=org", admin, nil)
		wantStatus(t, "remove platform access", r, http.StatusConflict)
		r = e.json(http.MethodDelete, "/api/v1/orgs/acme/policies?subject=org-admin&domain=*&object=*&action=*&effect=allow", admin, nil)
		wantStatus(t, "remove org-admin definition", r, http.StatusConflict)
		wantStatus(t, "entered admin still in", e.json(http.MethodGet, "/api/v1/orgs/acme/users", f.tokens["entered-admin"], nil), http.StatusOK)
	})

	t.Run("someone else's key looks like a missing one", func(t *testing.T) {
		var list struct{ Items []struct{ ID int64 } }
		e.json(http.MethodGet, "/api/v1/orgs/acme/api-keys", f.tokens["member"], nil).decode(t, &list)
		if len(list.Items) == 0 {
			t.Fatal("member has no key")
		}
		other := e.json(http.MethodDelete, fmt.Sprintf("/api/v1/orgs/acme/api-keys/%d", list.Items[0].ID), f.tokens["plain"], nil)
		missing := e.json(http.MethodDelete, "/api/v1/orgs/acme/api-keys/999999", f.tokens["plain"], nil)
		if other.status != http.StatusNotFound || string(other.body) != string(missing.body) {
			t.Fatalf("hidden key %d %s vs missing key %d %s", other.status, other.body, missing.status, missing.body)
		}
	})

	t.Run("a password reset revokes personal keys", func(t *testing.T) {
		wantStatus(t, "key works", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.keys["member-key"], nil), http.StatusOK)
		wantStatus(t, "reset", e.json(http.MethodPost, fmt.Sprintf("/api/v1/orgs/acme/users/%d/reset-password", f.ids["member"]), admin, nil), http.StatusOK)
		wantStatus(t, "key after reset", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.keys["member-key"], nil), http.StatusUnauthorized)
	})
}

func TestPlatformAuditExportAndVerify(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	tok := e.adminToken()
	e.createOrg(tok, "acme", "Acme")
	r := e.json(http.MethodGet, "/api/v1/audit/export?format=jsonl&q=action:org.", tok, nil)
	wantStatus(t, "export", r, http.StatusOK)
	lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], `{"#export":{"filtered":true`) || !strings.Contains(lines[1], `"action":"org.create"`) {
		t.Fatalf("export of action:org. = %q", r.body)
	}
	r = e.json(http.MethodGet, "/api/v1/audit/export?format=csv", tok, nil)
	wantStatus(t, "csv export", r, http.StatusOK)
	mustContain(t, "csv", string(r.body), "seq,time,actor_type", "platform.login")
	wantStatus(t, "bad format", e.json(http.MethodGet, "/api/v1/audit/export?format=xml", tok, nil), http.StatusBadRequest)
	r = e.json(http.MethodPost, "/api/v1/audit/verify", tok, nil)
	wantStatus(t, "verify", r, http.StatusOK)
	mustContain(t, "verify", string(r.body), `"ok":true`)
	r = e.json(http.MethodGet, "/api/v1/audit?q=action:audit.", tok, nil)
	mustContain(t, "export and verify are audited", string(r.body), "audit.export", "audit.verify")
}

func TestOrgNotFoundKeepsNavigation(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	r := f.e.do(request{method: http.MethodGet, path: "/o/acme/no-such-page", cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["admin"]}}})
	wantStatus(t, "unknown org page", r, http.StatusNotFound)
	mustContain(t, "404 page", string(r.body), "admin@acme.test", `href="/o/acme/users"`, "nothing at this address")
	r = f.e.do(request{method: http.MethodGet, path: "/o/nowhere/x"})
	wantStatus(t, "unknown org", r, http.StatusNotFound)
}

func TestUsersPagePages(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	for i := 0; i < 50; i++ {
		wantStatus(t, "create", e.json(http.MethodPost, "/api/v1/orgs/acme/users", f.tokens["admin"],
			map[string]string{"email": fmt.Sprintf("bulk%02d@acme.test", i)}), http.StatusCreated)
	}
	ck := []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["admin"]}}
	first := e.do(request{method: http.MethodGet, path: "/o/acme/users", cookies: ck})
	wantStatus(t, "first page", first, http.StatusOK)
	if strings.Count(string(first.body), `data-testid="user-row-`) != 50 {
		t.Fatalf("first page has %d rows, want 50", strings.Count(string(first.body), `data-testid="user-row-`))
	}
	i := strings.Index(string(first.body), `href="/o/acme/users?after=`)
	if i < 0 {
		t.Fatal("no next-page link")
	}
	next := string(first.body)[i+6:]
	next = next[:strings.Index(next, `"`)]
	second := e.do(request{method: http.MethodGet, path: next, cookies: ck})
	wantStatus(t, "second page", second, http.StatusOK)
	if n := strings.Count(string(second.body), `data-testid="user-row-`); n != 6 {
		t.Fatalf("second page has %d rows, want the remaining 6", n)
	}
	if strings.Contains(string(second.body), "users?after=") {
		t.Fatal("the last page offers a next page")
	}
}
