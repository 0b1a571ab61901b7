package handlers_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
)

func TestPlatformAPIRejectsBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	tok := e.adminToken()
	e.createOrg(tok, "taken", "Taken Inc")

	big := `{"slug":"big","name":"` + strings.Repeat("x", 1<<20) + `"}`
	cases := []struct {
		name     string
		req      request
		status   int
		code     string
		mentions []string
		field    string
	}{
		{name: "unknown field", status: 400, code: "unknown_field", mentions: []string{"unknown field", "colour"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(`{"slug":"ok-slug","colour":"red"}`)}},
		{name: "oversize body", status: 400, code: "body_too_large", mentions: []string{"1 MiB"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(big)}},
		{name: "oversize body without length", status: 400, code: "body_too_large", mentions: []string{"1 MiB"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: io1MiBChunked(big)}},
		{name: "malformed json", status: 400, code: "malformed_json", mentions: []string{"JSON"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(`{"slug":`)}},
		{name: "trailing data", status: 400, code: "malformed_json", mentions: []string{"single JSON object"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(`{"slug":"a-b-c"} {}`)}},
		{name: "empty body", status: 400, code: "malformed_json", mentions: []string{"empty"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(``)}},
		{name: "wrong content type", status: 400, code: "unsupported_content_type", mentions: []string{"application/json"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "text/plain", body: strings.NewReader(`{"slug":"plain-text"}`)}},
		{name: "invalid slug", status: 400, code: "validation_failed", field: "slug", mentions: []string{"slug"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(`{"slug":"Not A Slug!"}`)}},
		{name: "reserved slug", status: 400, code: "validation_failed", field: "slug", mentions: []string{"slug"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(`{"slug":"admin"}`)}},
		{name: "duplicate slug", status: 400, code: "validation_failed", field: "slug", mentions: []string{"slug"},
			req: request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: strings.NewReader(`{"slug":"taken","name":"Again"}`)}},
		{name: "delete without confirm", status: 400, code: "validation_failed", field: "confirm", mentions: []string{"confirm"},
			req: request{method: "DELETE", path: "/api/v1/orgs/taken"}},
		{name: "delete with wrong confirm", status: 400, code: "validation_failed", field: "confirm", mentions: []string{"confirm"},
			req: request{method: "DELETE", path: "/api/v1/orgs/taken?confirm=other"}},
		{name: "unknown org", status: 404, code: "org_not_found", mentions: []string{"nope"},
			req: request{method: "GET", path: "/api/v1/orgs/nope"}},
		{name: "unknown org suspend", status: 404, code: "org_not_found",
			req: request{method: "POST", path: "/api/v1/orgs/nope/suspend"}},
		{name: "unknown path", status: 404, code: "not_found",
			req: request{method: "GET", path: "/api/v1/nothing-here"}},
		{name: "bad limit", status: 400, code: "bad_limit", mentions: []string{"limit"},
			req: request{method: "GET", path: "/api/v1/orgs?limit=1000"}},
		{name: "bad audit cursor", status: 400, code: "bad_cursor",
			req: request{method: "GET", path: "/api/v1/audit?before=-4"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.token = tok
			r := e.do(tc.req)
			wantStatus(t, tc.name, r, tc.status)
			env := r.envelope(t)
			if env.Error.Code != tc.code {
				t.Errorf("code %q, want %q (message %q)", env.Error.Code, tc.code, env.Error.Message)
			}
			mustContain(t, "message", env.Error.Message, tc.mentions...)
			if tc.field != "" && env.Error.Fields[tc.field] == "" {
				t.Errorf("fields.%s missing: %s", tc.field, r.body)
			}
		})
	}

	// Nothing was half-created: only the first org exists, with its name.
	r := e.json(http.MethodGet, "/api/v1/orgs", tok, nil)
	wantStatus(t, "list", r, 200)
	var list struct {
		Items []struct{ Slug, Name string } `json:"items"`
	}
	r.decode(t, &list)
	if len(list.Items) != 1 || list.Items[0].Slug != "taken" || list.Items[0].Name != "Taken Inc" {
		t.Fatalf("after rejected requests the orgs are %+v, want only taken/Taken Inc", list.Items)
	}
}

// io1MiBChunked hides the length so the limit must be enforced while reading.
func io1MiBChunked(s string) *onlyReader { return &onlyReader{r: strings.NewReader(s)} }

type onlyReader struct{ r *strings.Reader }

func (o *onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestPlatformAPIRequiresAuthentication(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	routes := []struct{ method, path string }{
		{"GET", "/api/v1/orgs"},
		{"POST", "/api/v1/orgs"},
		{"GET", "/api/v1/orgs/acme"},
		{"PATCH", "/api/v1/orgs/acme"},
		{"DELETE", "/api/v1/orgs/acme?confirm=acme"},
		{"POST", "/api/v1/orgs/acme/suspend"},
		{"POST", "/api/v1/orgs/acme/resume"},
		{"GET", "/api/v1/audit"},
		{"POST", "/api/v1/auth/logout"},
		{"POST", "/api/v1/auth/password"},
	}
	for _, rt := range routes {
		for _, tok := range []string{"", "not-a-jwt"} {
			r := e.do(request{method: rt.method, path: rt.path, token: tok, contentType: "application/json", body: strings.NewReader(`{}`)})
			wantStatus(t, rt.method+" "+rt.path+" token="+tok, r, http.StatusUnauthorized)
			if env := r.envelope(t); env.Error.Code != "unauthenticated" {
				t.Errorf("%s %s: code %q", rt.method, rt.path, env.Error.Code)
			}
		}
	}
	// A browser GET of a page without a session goes to the login page.
	r := e.do(request{method: "GET", path: "/admin/orgs"})
	wantStatus(t, "GET /admin/orgs", r, http.StatusSeeOther)
	if loc := r.header.Get("Location"); !strings.HasPrefix(loc, "/login?next=") {
		t.Errorf("redirect to %q, want the login page", loc)
	}
}

func TestPlatformCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	tok := e.adminToken()
	session := &http.Cookie{Name: "gh_login", Value: tok}
	csrfToken := strings.Repeat("c", 32)
	csrf := &http.Cookie{Name: "gh_csrf", Value: csrfToken}
	form := func(v string) *strings.Reader { return strings.NewReader(v) }
	const formCT = "application/x-www-form-urlencoded"

	cases := []struct {
		name   string
		req    request
		status int
	}{
		{"form POST without _csrf", request{method: "POST", path: "/admin/orgs", contentType: formCT, body: form("slug=forged"),
			cookies: []*http.Cookie{session, csrf}}, http.StatusForbidden},
		{"form POST with wrong _csrf", request{method: "POST", path: "/admin/orgs", contentType: formCT, body: form("slug=forged&_csrf=" + strings.Repeat("x", 32)),
			cookies: []*http.Cookie{session, csrf}}, http.StatusForbidden},
		{"form POST without csrf cookie", request{method: "POST", path: "/admin/orgs", contentType: formCT, body: form("slug=forged&_csrf=" + csrfToken),
			cookies: []*http.Cookie{session}}, http.StatusForbidden},
		{"cookie API POST without header", request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: form(`{"slug":"forged"}`),
			cookies: []*http.Cookie{session, csrf}}, http.StatusForbidden},
		{"logout without _csrf", request{method: "POST", path: "/logout", contentType: formCT, body: form(""),
			cookies: []*http.Cookie{session, csrf}}, http.StatusForbidden},
		{"form POST with a Basic header instead of _csrf", request{method: "POST", path: "/admin/orgs", contentType: formCT, body: form("slug=forged"),
			cookies: []*http.Cookie{session, csrf}, header: http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}}}, http.StatusForbidden},
		{"form POST with _csrf", request{method: "POST", path: "/admin/orgs", contentType: formCT, body: form("slug=real-one&_csrf=" + csrfToken),
			cookies: []*http.Cookie{session, csrf}}, http.StatusSeeOther},
		{"cookie API POST with header", request{method: "POST", path: "/api/v1/orgs", contentType: "application/json", body: form(`{"slug":"real-two"}`),
			cookies: []*http.Cookie{session, csrf}, header: http.Header{"X-Csrf-Token": {csrfToken}}}, http.StatusCreated},
	}
	for _, tc := range cases {
		r := e.do(tc.req)
		wantStatus(t, tc.name, r, tc.status)
		if tc.status == http.StatusForbidden && !bytes.Contains(r.body, []byte("did not come from Gatehouse")) {
			t.Errorf("%s: the 403 does not explain the CSRF failure: %s", tc.name, r.body)
		}
	}
	r := e.json(http.MethodGet, "/api/v1/orgs/forged", tok, nil)
	wantStatus(t, "forged org must not exist", r, http.StatusNotFound)
	for _, slug := range []string{"real-one", "real-two"} {
		wantStatus(t, slug+" exists", e.json(http.MethodGet, "/api/v1/orgs/"+slug, tok, nil), http.StatusOK)
	}
}

func TestPlatformLoginThrottle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	var last response
	for i := 0; i < 10; i++ {
		last = e.json(http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": "wrong password " + string(rune('a'+i))})
		if last.status == http.StatusTooManyRequests {
			break
		}
		wantStatus(t, "failed login", last, http.StatusUnauthorized)
		if env := last.envelope(t); env.Error.Code != "bad_credentials" {
			t.Fatalf("failed login code %q", env.Error.Code)
		}
	}
	// The address is now locked: even the right password is refused.
	r := e.json(http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword})
	wantStatus(t, "login after repeated failures", r, http.StatusTooManyRequests)
	env := r.envelope(t)
	if env.Error.Code != "login_locked" {
		t.Errorf("code %q, want login_locked", env.Error.Code)
	}
	mustContain(t, "429 message", env.Error.Message, "too many", "try again")

	// Throttled attempts are audited as denied logins.
	// (The audit read uses a token minted before lockout would be
	// impossible here, so read the log directly.)
	evs, err := e.c.Audit.Query(t.Context(), audit.Filter{}, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	denied := 0
	for _, ev := range evs {
		if ev.Action == "platform.login" && ev.Decision == "deny" {
			denied++
			if ev.SourceIP == "" {
				t.Errorf("denied login event without source_ip: %+v", ev)
			}
		}
	}
	if denied < 11 {
		t.Errorf("%d denied platform.login events, want at least 11", denied)
	}
}

func TestPlatformForcedPasswordChangeAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite, func(c *config.Config) { c.AdminPassword = "" })
	if !e.c.AdminCreated || e.c.OneTimePassword == "" {
		t.Fatalf("no one-time password generated (created %v)", e.c.AdminCreated)
	}
	res := e.login(adminEmail, e.c.OneTimePassword)
	if !res.MustChangePassword {
		t.Fatal("login with a one-time password does not say the password must change")
	}
	r := e.json(http.MethodGet, "/api/v1/orgs", res.Token, nil)
	wantStatus(t, "list orgs before changing the password", r, http.StatusForbidden)
	if env := r.envelope(t); env.Error.Code != "password_change_required" {
		t.Errorf("code %q", env.Error.Code)
	}
	r = e.json(http.MethodPost, "/api/v1/auth/password", res.Token, map[string]string{"current_password": e.c.OneTimePassword, "new_password": "short"})
	wantStatus(t, "weak new password", r, http.StatusBadRequest)
	if env := r.envelope(t); env.Error.Fields["new_password"] == "" || len(env.Error.Fields) != 1 {
		t.Errorf("weak password: fields are not just the request's new_password: %s", r.body)
	}
	r = e.json(http.MethodPost, "/api/v1/auth/password", res.Token, map[string]string{"current_password": "wrong", "new_password": adminPassword})
	wantStatus(t, "wrong current password", r, http.StatusBadRequest)
	if env := r.envelope(t); env.Error.Fields["current_password"] == "" || len(env.Error.Fields) != 1 {
		t.Errorf("wrong current password: fields are not just the request's current_password: %s", r.body)
	}
	r = e.json(http.MethodPost, "/api/v1/auth/password", res.Token, map[string]string{"current_password": e.c.OneTimePassword, "new_password": adminPassword})
	wantStatus(t, "change password", r, http.StatusNoContent)
	wantStatus(t, "list orgs after the change", e.json(http.MethodGet, "/api/v1/orgs", res.Token, nil), http.StatusOK)
	r = e.json(http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": e.c.OneTimePassword})
	wantStatus(t, "one-time password after the change", r, http.StatusUnauthorized)
	if e.login(adminEmail, adminPassword).MustChangePassword {
		t.Error("must_change_password still set after the change")
	}
}

func TestPlatformHealth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	for _, tc := range []struct{ path, want string }{
		{"/healthz", `"status":"ok"`},
		{"/readyz", `"catalog":"reachable"`},
	} {
		r := e.do(request{method: "GET", path: tc.path})
		wantStatus(t, tc.path, r, http.StatusOK)
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s: content type %q", tc.path, ct)
		}
		if !bytes.Contains(r.body, []byte(tc.want)) {
			t.Errorf("%s: body %s lacks %s", tc.path, r.body, tc.want)
		}
	}
}

// TestAuthorizationHeaderRefusals: a Bearer header with no token (a shell's
// "Bearer $KEY" with KEY unset) is told the token is empty; another scheme
// is told only Bearer is accepted; on the platform and in an org.
func TestAuthorizationHeaderRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	platform := e.adminToken()
	e.createOrg(platform, "acme", "Acme")
	for _, path := range []string{"/api/v1/orgs", "/api/v1/orgs/acme/me"} {
		for _, tc := range []struct{ header, code, says string }{
			{"Bearer", "unauthenticated", "holds no token"},
			{"Bearer ", "unauthenticated", "holds no token"},
			{"bearer   ", "unauthenticated", "holds no token"},
			{"Basic dXNlcjpwYXNz", "unsupported_authorization", "Only \"Authorization: Bearer"},
		} {
			r := e.do(request{method: http.MethodGet, path: path, header: http.Header{"Authorization": {tc.header}}})
			wantStatus(t, path+" "+tc.header, r, http.StatusUnauthorized)
			if env := r.envelope(t); env.Error.Code != tc.code || !strings.Contains(env.Error.Message, tc.says) {
				t.Errorf("%s with %q: %s %q", path, tc.header, env.Error.Code, env.Error.Message)
			}
		}
	}
}
