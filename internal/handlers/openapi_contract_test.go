package handlers_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
)

// A rule is removed as the document says, named in a JSON body, and as
// clients that send no body with DELETE do, in the query; a rule that does
// not exist is 404 rule_not_found either way (issue 35, item 7). The
// validator every handler test runs behind checks both calls against the
// document.
func TestOpenAPIRemovePolicyTakesBodyOrQuery(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e, admin := f.e, f.tokens["admin"]
	rule := rbac.Rule{Subject: fmt.Sprintf("user:%d", f.ids["member"]), Domain: rbac.DeptDomain(f.dept1), Object: "agents", Action: "read", Effect: "deny"}
	rules := func() []rbac.Rule {
		t.Helper()
		var list struct{ Items []rbac.Rule }
		r := e.json(http.MethodGet, "/api/v1/orgs/acme/policies", admin, nil)
		wantStatus(t, "list rules", r, http.StatusOK)
		r.decode(t, &list)
		return list.Items
	}
	has := func() bool {
		for _, r := range rules() {
			if r == rule {
				return true
			}
		}
		return false
	}
	query := "/api/v1/orgs/acme/policies?" + url.Values{"subject": {rule.Subject}, "domain": {rule.Domain}, "object": {rule.Object},
		"action": {rule.Action}, "effect": {rule.Effect}}.Encode()
	for _, tc := range []struct {
		name   string
		remove func() response
	}{
		{"json body", func() response { return e.json(http.MethodDelete, "/api/v1/orgs/acme/policies", admin, rule) }},
		{"query", func() response { return e.json(http.MethodDelete, query, admin, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantStatus(t, "add", e.json(http.MethodPost, "/api/v1/orgs/acme/policies", admin, rule), http.StatusNoContent)
			if !has() {
				t.Fatal("the added rule is not listed")
			}
			wantStatus(t, "remove", tc.remove(), http.StatusNoContent)
			if has() {
				t.Fatal("the removed rule is still listed")
			}
			r := tc.remove()
			wantStatus(t, "remove again", r, http.StatusNotFound)
			if code := r.envelope(t).Error.Code; code != "rule_not_found" {
				t.Fatalf("remove again: code %q, want rule_not_found", code)
			}
		})
	}
	// A body that is not the rule's shape is refused, not read as no rule.
	r := e.do(request{method: http.MethodDelete, path: "/api/v1/orgs/acme/policies", token: admin, contentType: "application/json",
		body: bytes.NewReader(mustJSON(t, map[string]string{"subjekt": rule.Subject}))})
	wantStatus(t, "unknown field", r, http.StatusBadRequest)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Deleting an organization needs ?confirm=<slug>, as the document
// declares: without it or with another slug nothing is deleted and the
// answer names the field.
func TestOpenAPIDeleteOrgNeedsConfirm(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	tok := e.adminToken()
	e.createOrg(tok, "doomed", "Doomed")
	for _, q := range []string{"", "?confirm=other"} {
		r := e.json(http.MethodDelete, "/api/v1/orgs/doomed"+q, tok, nil)
		wantStatus(t, "delete with "+q, r, http.StatusBadRequest)
		if env := r.envelope(t); env.Error.Code != "validation_failed" || env.Error.Fields["confirm"] == "" {
			t.Fatalf("delete with %q: %s", q, r.body)
		}
	}
	wantStatus(t, "still there", e.json(http.MethodGet, "/api/v1/orgs/doomed", tok, nil), http.StatusOK)
	wantStatus(t, "delete confirmed", e.json(http.MethodDelete, "/api/v1/orgs/doomed?confirm=doomed", tok, nil), http.StatusNoContent)
}

// An org user's password change names its invalid fields as the request
// does (current_password, new_password), never the form's current/new.
func TestOpenAPIOrgPasswordChangeNamesRequestFields(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	for _, tc := range []struct {
		name  string
		body  map[string]string
		field string
	}{
		{"wrong current password", map[string]string{"current_password": "wrong", "new_password": "a-long-enough-new-password"}, "current_password"},
		{"short new password", map[string]string{"current_password": userPassword, "new_password": "x"}, "new_password"},
	} {
		r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/auth/password", f.tokens["plain"], tc.body)
		wantStatus(t, tc.name, r, http.StatusBadRequest)
		if env := r.envelope(t); env.Error.Fields[tc.field] == "" || len(env.Error.Fields) != 1 {
			t.Errorf("%s: fields are not just %s: %s", tc.name, tc.field, r.body)
		}
	}
}

// The file operations refuse what the document marks required: a read
// without a path, a fetch without a url or a path, each naming its field.
// A fetch downloads what its environment can reach, a loopback address
// included (the document says so; nothing checks the first URL's
// address), and a pinned SHA-256 that differs answers 400
// checksum_mismatch.
func TestOpenAPIFileOperationsAsDocumented(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	for _, tc := range []struct {
		name, method, path string
		body               any
		field              string
	}{
		{"read without a path", http.MethodGet, f.sessionPath("/files"), nil, "path"},
		{"fetch without a url", http.MethodPost, f.sessionPath("/files/fetch"), map[string]string{"path": "x"}, "url"},
		{"fetch without a path", http.MethodPost, f.sessionPath("/files/fetch"), map[string]string{"url": "http://127.0.0.1:1/x"}, "path"},
	} {
		r := f.call(tc.method, tc.path, "member", tc.body)
		wantStatus(t, tc.name, r, http.StatusBadRequest)
		if env := r.envelope(t); env.Error.Code != "validation_failed" || env.Error.Fields[tc.field] == "" {
			t.Errorf("%s: %s, want validation_failed naming %s", tc.name, r.body, tc.field)
		}
	}

	payload := []byte("served on loopback")
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(payload) }))
	defer src.Close()
	r := f.call(http.MethodPost, f.sessionPath("/files/fetch"), "member", map[string]string{"url": src.URL, "path": "loopback.txt"})
	wantStatus(t, "fetch from a loopback address", r, http.StatusOK)
	r = f.call(http.MethodGet, f.sessionPath("/files?path=loopback.txt"), "member", nil)
	wantStatus(t, "read the download", r, http.StatusOK)
	if !bytes.Equal(r.body, payload) {
		t.Fatalf("downloaded %q, want %q", r.body, payload)
	}
	r = f.call(http.MethodPost, f.sessionPath("/files/fetch"), "member", map[string]string{"url": src.URL, "path": "pinned.txt", "sha256": strings.Repeat("0", 64)})
	wantStatus(t, "a pin that differs", r, http.StatusBadRequest)
	if code := r.envelope(t).Error.Code; code != "checksum_mismatch" {
		t.Fatalf("a pin that differs: code %q, want checksum_mismatch", code)
	}
}
