package handlers_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

var echoParam = regexp.MustCompile(`:([A-Za-z_]+)`)

// openAPIPath turns an echo route pattern into the document's form.
func openAPIPath(p string) string { return echoParam.ReplaceAllString(p, "{$1}") }

// The document and the route table agree: every registered /api/ route is
// documented, and every documented operation is registered. The document is
// served at /api/v1/openapi.json without signing in, and parses.
func TestOpenAPICoversRoutes(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		e := newEnv(t, d)
		c, err := loadContract()
		if err != nil {
			t.Fatal(err)
		}
		registered := map[string]bool{}
		for _, r := range e.c.Server.Routes() {
			key := r.Method + " " + openAPIPath(r.Path)
			registered[key] = true
			if !strings.HasPrefix(r.Path, "/api/") {
				continue
			}
			item := c.doc.Paths.Value(openAPIPath(r.Path))
			if item == nil || item.GetOperation(r.Method) == nil {
				t.Errorf("registered route %s is missing from internal/apidoc/openapi.yaml", key)
			}
		}
		var documented []string
		for path, item := range c.doc.Paths.Map() {
			for method := range item.Operations() {
				documented = append(documented, method+" "+path)
			}
		}
		sort.Strings(documented)
		for _, k := range documented {
			if !registered[k] {
				t.Errorf("documented operation %s is not registered", k)
			}
		}

		res := e.do(request{method: http.MethodGet, path: "/api/v1/openapi.json"})
		if res.status != http.StatusOK {
			t.Fatalf("GET /api/v1/openapi.json: %d %s", res.status, res.body)
		}
		served, err := openapi3.NewLoader().LoadFromData(res.body)
		if err != nil {
			t.Fatalf("served document does not parse: %v", err)
		}
		if err := served.Validate(t.Context()); err != nil {
			t.Fatalf("served document is not valid: %v", err)
		}
		var raw map[string]any
		if err := json.Unmarshal(res.body, &raw); err != nil || raw["openapi"] != "3.1.0" {
			t.Fatalf("served document: openapi %v (%v)", raw["openapi"], err)
		}
	})
}

// A request the document rejects (a field it does not describe) is refused
// by the server too, and the validator sees the refusal as agreement; a
// documented answer that breaks its schema is a mismatch.
func TestOpenAPIValidatorCatchesMismatch(t *testing.T) {
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	// A login response without its token is not what the document says.
	op := c.doc.Paths.Value("/api/v1/auth/login").Post
	schema := op.Responses.Status(200).Value.Content.Get("application/json").Schema.Value
	if err := schema.VisitJSON(map[string]any{"expires_at": "2026-01-01T00:00:00Z", "must_change_password": false}); err == nil {
		t.Fatal("a login response without token validated")
	}

	// The validator around a fake handler: its recorded mismatches, not
	// the test's failure (no report at cleanup), are what is checked.
	exchange := func(reqBody string, status int, respBody string) []string {
		t.Helper()
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(respBody))
		})
		v := &apiValidator{t: t, c: c, next: next}
		req := httptest.NewRequest(http.MethodPost, "/api/v1/auth/login", strings.NewReader(reqBody))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		v.ServeHTTP(rec, req)
		if rec.Code != status || rec.Body.String() != respBody {
			t.Fatalf("the validator changed the answer: %d %s, want %d %s", rec.Code, rec.Body, status, respBody)
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		return append([]string(nil), v.mismatches...)
	}
	const login = `{"email":"admin@example.com","password":"secret"}`
	const unknown = `{"email":"admin@example.com","password":"secret","admin":true}`
	const token = `{"token":"t","expires_at":"2026-01-01T00:00:00Z","must_change_password":false}`
	const refusal = `{"error":{"code":"unknown_field","message":"unknown field admin"}}`

	// A documented 200 that lacks the token: one mismatch, about the response.
	if m := exchange(login, http.StatusOK, `{"expires_at":"2026-01-01T00:00:00Z","must_change_password":false}`); len(m) != 1 || !strings.Contains(m[0], "response 200 does not match") {
		t.Errorf("a 200 without its token: mismatches %q, want one about the response", m)
	}
	// The same request answered as documented: none.
	if m := exchange(login, http.StatusOK, token); len(m) != 0 {
		t.Errorf("a documented login answer: mismatches %q, want none", m)
	}
	// An unknown field refused with a 400: agreement, none.
	if m := exchange(unknown, http.StatusBadRequest, refusal); len(m) != 0 {
		t.Errorf("a 400 to an unknown field: mismatches %q, want none", m)
	}
	// A code the operation does not list for its status (issue 35, item
	// 7), and a status it lists no code for: one mismatch each.
	if m := exchange(unknown, http.StatusBadRequest, `{"error":{"code":"invalid","message":"unknown field admin"}}`); len(m) != 1 || !strings.Contains(m[0], "response 400 does not match") {
		t.Errorf("a 400 with a code login does not list: mismatches %q, want one about the response", m)
	}
	if m := exchange(login, http.StatusConflict, `{"error":{"code":"conflict","message":"Conflict"}}`); len(m) != 1 || !strings.Contains(m[0], "response 409 does not match") {
		t.Errorf("a 409 login does not answer: mismatches %q, want one about the response", m)
	}
	// The same request accepted: the document rejects it, so one mismatch
	// (which shows the 400 above answered a request the document refuses).
	if m := exchange(unknown, http.StatusOK, token); len(m) != 1 || !strings.Contains(m[0], "accepted (200) a request the document rejects") {
		t.Errorf("an unknown field accepted: mismatches %q, want one about the request", m)
	}
}
