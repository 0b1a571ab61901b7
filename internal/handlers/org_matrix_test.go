package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
)

// orgFixture is an org with one principal per role, plus a second org whose
// principals must never get in.
type orgFixture struct {
	e          *testEnv
	platform   string
	ids        map[string]int64 // user ids by name
	tokens     map[string]string
	keys       map[string]string
	targetUser int64
	dept1      int64
	dept2      int64
}

const userPassword = "a-long-user-password"

// orgToken enters slug as the platform admin and returns an org-admin token.
func (e *testEnv) enterOrg(platformToken, slug string) string {
	e.t.Helper()
	r := e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/enter", platformToken, nil)
	wantStatus(e.t, "enter "+slug, r, http.StatusOK)
	var out struct{ Token string }
	r.decode(e.t, &out)
	return out.Token
}

// newOrgUser creates a user, signs in with the one-time password and
// changes it, returning the user id and a token.
func (e *testEnv) newOrgUser(adminTok, slug, email string) (int64, string) {
	e.t.Helper()
	r := e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/users", adminTok, map[string]string{"email": email, "name": email})
	wantStatus(e.t, "create user "+email, r, http.StatusCreated)
	var cu struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	r.decode(e.t, &cu)
	tok := e.orgLogin(slug, email, cu.OneTimePassword)
	r = e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/auth/password", tok, map[string]string{"current_password": cu.OneTimePassword, "new_password": userPassword})
	wantStatus(e.t, "change password "+email, r, http.StatusNoContent)
	return cu.User.ID, tok
}

func (e *testEnv) orgLogin(slug, email, password string) string {
	e.t.Helper()
	r := e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/auth/login", "", map[string]string{"email": email, "password": password})
	wantStatus(e.t, "org login "+email, r, http.StatusOK)
	var lr loginResult
	r.decode(e.t, &lr)
	return lr.Token
}

func newOrgFixture(t *testing.T, d store.Dialect, opts ...func(*config.Config)) *orgFixture {
	t.Helper()
	e := newEnv(t, d, opts...)
	e.c.Server.Sleep = func(context.Context, time.Duration) {}
	f := &orgFixture{e: e, ids: map[string]int64{}, tokens: map[string]string{}, keys: map[string]string{}}
	f.platform = e.adminToken()
	e.createOrg(f.platform, "acme", "Acme")
	e.createOrg(f.platform, "globex", "Globex")
	root := e.enterOrg(f.platform, "acme")
	f.tokens["entered-admin"] = root

	mk := func(path string, v any) response {
		r := e.json(http.MethodPost, "/api/v1/orgs/acme"+path, root, v)
		if r.status >= 300 {
			t.Fatalf("POST %s: %d %s", path, r.status, r.body)
		}
		return r
	}
	var dep struct{ ID int64 }
	mk("/departments", map[string]string{"name": "Research"}).decode(t, &dep)
	f.dept1 = dep.ID
	mk("/departments", map[string]string{"name": "Scratch"}).decode(t, &dep)
	f.dept2 = dep.ID

	for _, name := range []string{"admin", "owner", "member", "auditor", "plain"} {
		f.ids[name], f.tokens[name] = e.newOrgUser(root, "acme", name+"@acme.test")
	}
	f.targetUser, _ = e.newOrgUser(root, "acme", "target@acme.test")
	assign := func(user, role, dom string) {
		mk("/roles", rbac.Assignment{Subject: fmt.Sprintf("user:%d", f.ids[user]), Role: role, Domain: dom})
	}
	assign("admin", rbac.RoleOrgAdmin, rbac.DomainOrg)
	assign("owner", rbac.RoleDeptOwner, rbac.DeptDomain(f.dept1))
	assign("member", rbac.RoleMember, rbac.DeptDomain(f.dept1))
	assign("auditor", rbac.RoleAuditor, rbac.DomainOrg)

	var k struct{ Secret string }
	mk("/api-keys", map[string]any{"name": "audit bot", "service": true, "roles": []map[string]string{{"role": "auditor", "domain": "org"}}}).decode(t, &k)
	f.keys["auditor-key"] = k.Secret
	r := e.json(http.MethodPost, "/api/v1/orgs/acme/api-keys", f.tokens["member"], map[string]string{"name": "member laptop"})
	wantStatus(t, "member personal key", r, http.StatusCreated)
	r.decode(t, &k)
	f.keys["member-key"] = k.Secret

	// The other org's principals: an org admin (token and personal key).
	groot := e.enterOrg(f.platform, "globex")
	gid, gtok := e.newOrgUser(groot, "globex", "admin@globex.test")
	wantStatus(t, "globex admin role", e.json(http.MethodPost, "/api/v1/orgs/globex/roles", groot,
		rbac.Assignment{Subject: fmt.Sprintf("user:%d", gid), Role: rbac.RoleOrgAdmin, Domain: rbac.DomainOrg}), http.StatusNoContent)
	f.tokens["globex-admin"] = gtok
	r = e.json(http.MethodPost, "/api/v1/orgs/globex/api-keys", gtok, map[string]string{"name": "globex key"})
	wantStatus(t, "globex key", r, http.StatusCreated)
	r.decode(t, &k)
	f.keys["globex-key"] = k.Secret
	return f
}

// allowedRoles is the declared expectation for each org permission: which
// principals of acme may pass the route's authorization.
var allowedRoles = map[string][]string{
	"org:users:read":               {"admin", "entered-admin"},
	"org:users:create":             {"admin", "entered-admin"},
	"org:users/:id:read":           {"admin", "entered-admin"},
	"org:users/:id:update":         {"admin", "entered-admin"},
	"org:roles:read":               {"admin", "entered-admin"},
	"org:roles:update":             {"admin", "entered-admin"},
	"org:policies:read":            {"admin", "entered-admin"},
	"org:policies:update":          {"admin", "entered-admin"},
	"org:departments:read":         {"admin", "entered-admin", "owner", "member", "member-key"},
	"org:departments:create":       {"admin", "entered-admin"},
	"org:departments/:dept:read":   {"admin", "entered-admin", "owner", "member", "member-key"},
	"org:departments/:dept:update": {"admin", "entered-admin", "owner"},
	"org:departments/:dept:delete": {"admin", "entered-admin"},
	"org:members:read":             {"admin", "entered-admin", "owner", "member", "member-key"},
	"org:members:update":           {"admin", "entered-admin", "owner"},
	"org:settings:read":            {"admin", "entered-admin"},
	"org:settings:update":          {"admin", "entered-admin"},
	"org:audit:read":               {"admin", "entered-admin", "auditor", "auditor-key"},
	"org:audit:export":             {"admin", "entered-admin", "auditor", "auditor-key"},
	"org:audit:verify":             {"admin", "entered-admin", "auditor", "auditor-key"},
	"org:sso:read":                 {"admin", "entered-admin"},
	"org:sso:update":               {"admin", "entered-admin"},
	"org:recordings:read":          {"admin", "entered-admin", "auditor", "auditor-key"},
}

// principal is one way of presenting credentials.
type principal struct {
	name   string
	bearer string
	cookie *http.Cookie // for page routes
	acme   bool
}

func (f *orgFixture) principals() []principal {
	var ps []principal
	// Admin-like principals last: their allowed destructive calls run after
	// everyone else has been checked on the same route.
	for _, n := range []string{"owner", "member", "auditor", "plain", "globex-admin", "admin", "entered-admin"} {
		tok := f.tokens[n]
		ps = append(ps, principal{name: n, bearer: tok, cookie: &http.Cookie{Name: "gh_org_acme", Value: tok}, acme: n != "globex-admin"})
	}
	for _, n := range []string{"auditor-key", "member-key", "globex-key"} {
		ps = append(ps, principal{name: n, bearer: f.keys[n], acme: n != "globex-key"})
	}
	return ps
}

// fill substitutes path parameters with fixture objects. Mutating routes
// get inputs that pass authorization but fail validation, so the matrix
// checks authorization without changing the fixture.
func (f *orgFixture) fill(path string) string {
	r := strings.NewReplacer(":org", "acme", ":dept", fmt.Sprint(f.dept1), ":uid", fmt.Sprint(f.targetUser), ":tid", "999999", ":id", fmt.Sprint(f.targetUser))
	return r.Replace(path)
}

func matrixBody(method, path string) (string, string) {
	if strings.HasPrefix(path, "/o/") {
		if method == http.MethodGet {
			return "", ""
		}
		return "status=bogus&role=bogus&confirm=wrong&current=wrong&new=x", "application/x-www-form-urlencoded"
	}
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		switch {
		case strings.HasSuffix(path, "/auth/password"):
			return `{"current_password":"wrong","new_password":"x"}`, "application/json"
		case strings.HasSuffix(path, "/members/:uid"):
			return `{"role":"bogus"}`, "application/json"
		case strings.HasSuffix(path, "/users/:id"):
			return `{"status":"bogus"}`, "application/json"
		case strings.HasSuffix(path, "/departments/:dept"):
			return `{"name":""}`, "application/json"
		}
		return `{}`, "application/json"
	}
	return "", ""
}

// TestOrgRouteMatrix enumerates every registered org route and checks every
// principal against the declared permission.
func TestOrgRouteMatrix(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	routes := e.c.Server.Routes()
	checked := 0
	for _, rt := range routes {
		if !strings.HasPrefix(rt.Path, "/o/:org") && !strings.HasPrefix(rt.Path, "/api/v1/orgs/:org/") {
			continue
		}
		if rt.Perm.Scope == rbac.ScopePlatform || rt.Perm.Scope == rbac.ScopePublic || strings.HasSuffix(rt.Path, "/logout") || strings.HasSuffix(rt.Path, "/leave") || strings.HasSuffix(rt.Path, "/login") {
			continue // platform routes are covered by the platform tests; logout and login below; public routes authorize nobody
		}
		want := map[string]bool{}
		switch rt.Perm.Scope {
		case rbac.ScopeOrg:
			roles, ok := allowedRoles[rt.Perm.String()]
			if !ok {
				t.Errorf("route %s %s declares %s, which has no expectation in the matrix", rt.Method, rt.Path, rt.Perm)
				continue
			}
			for _, r := range roles {
				want[r] = true
			}
		case rbac.ScopeAuthenticated, rbac.ScopeOwnLogin:
			for _, p := range f.principals() {
				want[p.name] = p.acme
			}
		}
		for _, p := range f.principals() {
			path := f.fill(rt.Path)
			// Deletions target the scratch department.
			if (rt.Method == http.MethodDelete && strings.Contains(rt.Path, "/departments/:dept") && !strings.Contains(rt.Path, "members")) ||
				strings.HasSuffix(rt.Path, "/departments/:dept/delete") {
				path = strings.Replace(path, fmt.Sprintf("/departments/%d", f.dept1), fmt.Sprintf("/departments/%d", f.dept2), 1)
			}
			body, ct := matrixBody(rt.Method, rt.Path)
			req := request{method: rt.Method, path: path, contentType: ct}
			if body != "" {
				req.body = strings.NewReader(body)
			}
			pageRoute := strings.HasPrefix(rt.Path, "/o/")
			if pageRoute && p.cookie != nil {
				csrf := "matrix-csrf-token-0123456789"
				req.cookies = []*http.Cookie{p.cookie, {Name: "gh_csrf", Value: csrf}}
				req.header = http.Header{"X-Csrf-Token": {csrf}}
			} else {
				req.token = p.bearer
			}
			res := e.do(req)
			checked++
			label := fmt.Sprintf("%s %s as %s", rt.Method, path, p.name)
			// A handler failure is neither a refusal nor an answer: it must
			// not count as "allowed".
			if res.status == http.StatusInternalServerError {
				t.Errorf("%s: internal server error (%.200s)", label, res.body)
			}
			if !p.acme {
				if res.status >= 200 && res.status < 300 {
					t.Errorf("%s: foreign principal got %d", label, res.status)
				}
				if res.status != http.StatusUnauthorized && res.status != http.StatusSeeOther {
					t.Errorf("%s: foreign principal got %d, want 401 (or a sign-in redirect): %s", label, res.status, res.body)
				}
				continue
			}
			if rt.Perm.SignedIn() {
				// Any signed-in principal of the org passes the route; which
				// objects it sees is decided per object (tested separately).
				if res.status == http.StatusUnauthorized || (res.status == http.StatusSeeOther && strings.Contains(res.header.Get("Location"), "/login")) {
					t.Errorf("%s: signed-in principal refused (%d): %.200s", label, res.status, res.body)
				}
				continue
			}
			denied := isDenial(res)
			if want[p.name] && denied {
				t.Errorf("%s: denied (%d %.200s), want allowed", label, res.status, res.body)
			}
			if !want[p.name] && !denied {
				t.Errorf("%s: allowed (%d %.200s), want denied", label, res.status, res.body)
			}
			if !want[p.name] && res.status != http.StatusNotFound && hasObjectParam(rt.Path) {
				t.Errorf("%s: denied with %d; a specific object must answer 404 so its existence does not leak", label, res.status)
			}
		}
	}
	if checked < 300 {
		t.Fatalf("matrix checked only %d route×principal pairs", checked)
	}
	// Every denial above is in the audit log.
	evs, err := openAudit(t, f).Query(context.Background(), mustParse(t, "action:authz.deny"), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 50 {
		t.Fatalf("only %d authorization denials were audited", len(evs))
	}
}

func hasObjectParam(path string) bool {
	rest := strings.SplitN(path, ":org", 2)[1]
	return strings.Contains(rest, "/:")
}

// isDenial reports whether a response is an authorization refusal rather
// than the handler's own answer.
func isDenial(r response) bool {
	if r.status == http.StatusSeeOther {
		return strings.Contains(r.header.Get("Location"), "/login")
	}
	if r.status != http.StatusForbidden && r.status != http.StatusNotFound && r.status != http.StatusUnauthorized {
		return false
	}
	if bytes.HasPrefix(bytes.TrimSpace(r.body), []byte("{")) {
		var env errorEnvelope
		_ = json.Unmarshal(r.body, &env)
		return env.Error.Code == "forbidden" || env.Error.Code == "not_found" || env.Error.Code == "unauthenticated"
	}
	// Pages: the error page says the same things.
	return bytes.Contains(r.body, []byte("you may not see it")) || bytes.Contains(r.body, []byte("do not have permission"))
}

func openAudit(t *testing.T, f *orgFixture) *audit.Log {
	t.Helper()
	ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ten.Release)
	return ten.Audit
}

func mustParse(t *testing.T, q string) audit.Filter {
	t.Helper()
	f, err := audit.ParseQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPlatformRouteMatrix: every platform route refuses anonymous callers
// and principals of an org (their tokens are for another audience), and
// lets a platform admin through.
func TestPlatformRouteMatrix(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	checked := 0
	for _, rt := range e.c.Server.Routes() {
		if rt.Perm.Scope != rbac.ScopePlatform {
			continue
		}
		path := strings.NewReplacer(":org", "globex").Replace(rt.Path)
		if rt.Method == http.MethodDelete {
			path += "?confirm=wrong"
		}
		for name, tok := range map[string]string{"anonymous": "", "org admin": f.tokens["admin"], "org key": f.keys["member-key"],
			"entered admin's org token": f.tokens["entered-admin"]} {
			r := e.do(request{method: rt.Method, path: path, token: tok, contentType: "application/json", body: strings.NewReader(`{}`)})
			checked++
			if r.status < 300 || (r.status != http.StatusUnauthorized && r.status != http.StatusSeeOther && r.status != http.StatusForbidden) {
				t.Errorf("%s %s as %s: %d %.200s", rt.Method, path, name, r.status, r.body)
			}
		}
		// The platform admin passes authorization (whatever the handler
		// then says about the empty body).
		r := e.do(request{method: rt.Method, path: path, token: f.platform, contentType: "application/json", body: strings.NewReader(`{}`)})
		if r.status == http.StatusUnauthorized || r.status == http.StatusForbidden {
			t.Errorf("%s %s as platform admin: %d %.200s", rt.Method, path, r.status, r.body)
		}
	}
	if checked < 80 {
		t.Fatalf("only %d platform route checks", checked)
	}
}
