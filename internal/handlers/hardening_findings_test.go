package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// The attack run of issue 12, one regression test per finding, on SQLite
// and Postgres.

// platformEvents returns the platform audit events matching q.
func platformEvents(t *testing.T, e *testEnv, q string) []audit.Event {
	t.Helper()
	evs, err := e.c.Server.PlatformAudit.Query(context.Background(), mustParse(t, q), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// orgEvents returns acme's audit events matching q.
func orgEvents(t *testing.T, f *orgFixture, q string) []audit.Event {
	t.Helper()
	evs, err := openAudit(t, f).Query(context.Background(), mustParse(t, q), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// fakeAgentd answers /healthz like agentd and counts what it was sent.
func fakeAgentd(t *testing.T) (srv *httptest.Server, hits, bearers *atomic.Int64) {
	t.Helper()
	hits, bearers = &atomic.Int64{}, &atomic.Int64{}
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "" {
			bearers.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok","version":"6.6.6","active_sessions":42}`))
	}))
	t.Cleanup(srv.Close)
	return srv, hits, bearers
}

// Finding 1: a member's private host at a name that resolves to loopback
// is never called; "Test connection" shows nothing of what answers there.
func TestHardeningPrivateEnvironmentSSRF(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		loop, hits, _ := fakeAgentd(t)
		// The console's resolver sends every name to the loopback server,
		// as a DNS record (or a rebinding answer) pointing there would.
		target := strings.TrimPrefix(loop.URL, "http://")
		f.e.c.Server.OutboundHTTP = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, network, target)
		}}}
		r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/environments", f.tokens["plain"], map[string]any{"name": "laptop", "kind": "host",
			"private": true, "url": "http://laptop.corp.example:49984", "os": "linux", "deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20)})
		wantStatus(t, "private env", r, http.StatusCreated)
		var env envOut
		r.decode(t, &env)
		r = f.e.json(http.MethodPost, fmt.Sprintf("/api/v1/orgs/acme/environments/%d/test", env.ID), f.tokens["plain"], nil)
		wantStatus(t, "test connection", r, http.StatusOK)
		for _, leak := range []string{"6.6.6", `"active_sessions":42`} {
			if strings.Contains(string(r.body), leak) {
				t.Errorf("test connection shows %q from the loopback service: %s", leak, r.body)
			}
		}
		mustContain(t, "test connection", string(r.body), "not allowed")
		if n := hits.Load(); n != 0 {
			t.Fatalf("the console called the loopback service %d times", n)
		}
		// The literal forms are refused when the address is entered.
		for _, u := range []string{"http://localhost.:49984", "http://[::ffff:127.0.0.1]:49984", "http://169.254.169.254", "http://[fd00:ec2::254]"} {
			r := f.e.json(http.MethodPatch, fmt.Sprintf("/api/v1/orgs/acme/environments/%d", env.ID), f.tokens["plain"],
				map[string]any{"url": u, "agentd_token": strings.Repeat("t", 20)})
			wantStatus(t, "point at "+u, r, http.StatusBadRequest)
		}
	})
}

// Finding 2: a host environment that redirects does not get the probe's
// token sent to the redirect target; the answer says where it pointed.
func TestHardeningRedirectsKeepSecrets(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		target, hits, bearers := fakeAgentd(t)
		redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+r.URL.Path, http.StatusFound)
		}))
		t.Cleanup(redirector.Close)
		r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/environments", f.tokens["owner"], map[string]any{"name": "hop", "kind": "host",
			"department_id": f.dept1, "url": redirector.URL, "os": "linux", "deployment": "bare-metal", "agentd_token": strings.Repeat("s", 20)})
		wantStatus(t, "shared env", r, http.StatusCreated)
		var env envOut
		r.decode(t, &env)
		r = f.e.json(http.MethodPost, fmt.Sprintf("/api/v1/orgs/acme/environments/%d/test", env.ID), f.tokens["admin"], nil)
		wantStatus(t, "test connection", r, http.StatusOK)
		r.decode(t, &env)
		if env.Health.Status == "healthy" || !strings.Contains(env.Health.Error, "redirect to "+target.URL) {
			t.Fatalf("health %+v, want a failure naming the redirect target", env.Health)
		}
		if hits.Load() != 0 || bearers.Load() != 0 {
			t.Fatalf("the redirect target got %d requests (%d with a token)", hits.Load(), bearers.Load())
		}
	})
}

// Finding 3 (and 9's header case): creating, suspending and deleting an
// org with a User-Agent of invalid UTF-8, NUL and 900 KB succeeds on both
// databases, each with its platform record, the stored agent cleaned and
// capped.
func TestHardeningPlatformChangesAreAudited(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		e := newEnv(t, d)
		tok := e.adminToken()
		// (A NUL cannot be sent in a header: net/http refuses it on both
		// ends; the audit package's own test covers NUL.)
		for _, ua := range []string{"curl/8 \xff\xfe", strings.Repeat("M", 900<<10)} {
			slug := storetest.NewName("ua-")
			hdr := http.Header{"User-Agent": {ua}}
			steps := []struct {
				req    request
				status int
				action string
			}{
				{request{method: http.MethodPost, path: "/api/v1/orgs", contentType: "application/json",
					body: strings.NewReader(`{"slug":"` + slug + `","name":"UA"}`)}, http.StatusCreated, "org.create"},
				{request{method: http.MethodPost, path: "/api/v1/orgs/" + slug + "/suspend"}, http.StatusOK, "org.suspend"},
				{request{method: http.MethodDelete, path: "/api/v1/orgs/" + slug + "?confirm=" + slug}, http.StatusNoContent, "org.delete"},
			}
			for _, s := range steps {
				s.req.token, s.req.header = tok, hdr
				wantStatus(t, s.action, e.do(s.req), s.status)
				evs := platformEvents(t, e, "action:"+s.action+" target:"+slug)
				if len(evs) != 1 {
					t.Fatalf("%s of %s: %d platform records, want 1", s.action, slug, len(evs))
				}
				if got := evs[0].UserAgent; len(got) > audit.MaxUserAgent || strings.ContainsRune(got, 0) || !strings.HasPrefix(got, strings.ToValidUTF8(ua[:4], "\uFFFD")) {
					t.Errorf("%s: stored user agent %.60q (%d bytes)", s.action, got, len(got))
				}
			}
		}
		r := e.json(http.MethodPost, "/api/v1/audit/verify", tok, nil)
		mustContain(t, "verify", string(r.body), `"ok":true`)
	})
}

// Finding 4: one valid sign-in every third attempt does not reset the
// address's budget: the address is locked after ten failures all the same.
func TestHardeningLoginLockSurvivesOwnSuccess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		failures := 0
		for i := 0; i < 40; i++ {
			email, pw := fmt.Sprintf("victim%d@acme.test", i), "wrong-password-guess"
			if i%3 == 2 {
				email, pw = "plain@acme.test", userPassword
			}
			r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": email, "password": pw})
			if r.status == http.StatusTooManyRequests {
				if failures != 10 {
					t.Fatalf("locked after %d failures, want 10", failures)
				}
				return
			}
			if r.status == http.StatusUnauthorized {
				failures++
			}
		}
		t.Fatalf("the address tried %d accounts, interleaved with its own sign-ins, without being locked", failures)
	})
}

// Finding 5: concurrent wrong passwords for one account are counted
// before the slow hash: at most ten of them are checked.
func TestHardeningParallelGuessesAreCounted(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		const guesses = 19
		statuses := make(chan int, guesses)
		for i := 0; i < guesses; i++ {
			go func(i int) {
				b, _ := json.Marshal(map[string]string{"email": "target@acme.test", "password": fmt.Sprintf("guess-%d", i)})
				resp, err := http.Post(f.e.srv.URL+"/api/v1/orgs/acme/auth/login", "application/json", strings.NewReader(string(b)))
				if err != nil {
					statuses <- 0
					return
				}
				resp.Body.Close()
				statuses <- resp.StatusCode
			}(i)
		}
		checked := 0
		for i := 0; i < guesses; i++ {
			switch <-statuses {
			case http.StatusUnauthorized:
				checked++
			case http.StatusTooManyRequests:
			default:
				t.Fatal("a guess got neither 401 nor 429")
			}
		}
		if checked > 10 {
			t.Fatalf("%d of %d concurrent guesses were checked, want at most 10", checked, guesses)
		}
	})
}

// Finding 6: object-level refusals are audit events.
func TestHardeningObjectDenialsAreAudited(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		env, agent := f.hostAndAgent(t, "dept1")
		var adminKeys struct{ Items []struct{ ID int64 } }
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/api-keys", f.tokens["admin"], map[string]string{"name": "admin laptop"})
		wantStatus(t, "admin key", r, http.StatusCreated)
		e.json(http.MethodGet, "/api/v1/orgs/acme/api-keys", f.tokens["admin"], nil).decode(t, &adminKeys)

		plain := f.tokens["plain"]
		cases := []struct {
			name   string
			method string
			path   string
			body   any
			status int
			object string
		}{
			{"another department's environment", http.MethodGet, fmt.Sprintf("/environments/%d", env), nil, http.StatusNotFound, fmt.Sprintf("environments/%d", env)},
			{"another's agent", http.MethodGet, fmt.Sprintf("/agents/%d", agent), nil, http.StatusNotFound, fmt.Sprintf("agents/%d", agent)},
			{"a shared environment", http.MethodPost, "/environments", map[string]any{"name": "mine", "kind": "host", "url": "http://10.9.9.8:1",
				"os": "linux", "deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20)}, http.StatusForbidden, "environments"},
			{"a service key", http.MethodPost, "/api-keys", map[string]any{"name": "svc", "service": true,
				"roles": []map[string]string{{"role": "auditor", "domain": "org"}}}, http.StatusForbidden, ""},
			{"revoking an admin's key", http.MethodDelete, fmt.Sprintf("/api-keys/%d", adminKeys.Items[0].ID), nil, http.StatusNotFound, ""},
		}
		for _, tc := range cases {
			before := len(orgEvents(t, f, "action:authz.deny"))
			r := e.json(tc.method, "/api/v1/orgs/acme"+tc.path, plain, tc.body)
			wantStatus(t, tc.name, r, tc.status)
			evs := orgEvents(t, f, "action:authz.deny")
			if len(evs) != before+1 {
				t.Errorf("%s: %d new authz.deny events, want 1", tc.name, len(evs)-before)
				continue
			}
			if evs[0].Actor.ID != fmt.Sprint(f.ids["plain"]) || evs[0].Decision != audit.Deny {
				t.Errorf("%s: denial %+v is not the plain user's", tc.name, evs[0])
			}
			if tc.object != "" && !strings.Contains(string(evs[0].Details), `"object":"`+tc.object+`"`) {
				t.Errorf("%s: denial details %s do not name %s", tc.name, evs[0].Details, tc.object)
			}
		}
	})
}

// Finding 7: reading the platform audit log is itself audited.
func TestHardeningPlatformAuditReadsAreAudited(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		e := newEnv(t, d)
		tok := e.adminToken()
		wantStatus(t, "read", e.json(http.MethodGet, "/api/v1/audit?q=action:org.", tok, nil), http.StatusOK)
		r := e.do(request{method: http.MethodGet, path: "/admin/audit?q=" + url.QueryEscape("action:platform."), cookies: []*http.Cookie{{Name: "gh_login", Value: tok}}})
		wantStatus(t, "page", r, http.StatusOK)
		evs := platformEvents(t, e, "action:audit.view")
		if len(evs) != 2 || evs[0].Actor.Name != adminEmail || !strings.Contains(string(evs[1].Details), `"q":"action:org."`) {
			t.Fatalf("audit views recorded: %+v", evs)
		}
	})
}

// Finding 8: an org admin cannot target platform admins (or a built-in
// role they hold) with a rule.
func TestHardeningBuiltinSubjectsAreNotRuleTargets(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		for _, sub := range []string{rbac.PlatformSubject, rbac.RoleOrgAdmin, rbac.RoleMember} {
			r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/policies", f.tokens["admin"],
				rbac.Rule{Subject: sub, Domain: rbac.DomainOrg, Object: "*", Action: "*", Effect: "deny"})
			wantStatus(t, "deny "+sub, r, http.StatusBadRequest)
			if r.envelope(t).Error.Fields["subject"] == "" {
				t.Errorf("deny %s: the refusal does not name the subject: %s", sub, r.body)
			}
		}
		wantStatus(t, "entered admin still in", f.e.json(http.MethodGet, "/api/v1/orgs/acme/users", f.tokens["entered-admin"], nil), http.StatusOK)
	})
}

// Finding 9: NUL, invalid UTF-8 and over-long values answer 400 naming the
// field on Postgres as on SQLite, and a sign-in refused for them is still
// in the audit log.
func TestHardeningHostileTextAnswers400(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		admin := f.tokens["admin"]
		long := strings.Repeat("a", 4000) + "@acme.test"
		cases := []struct {
			name  string
			req   request
			field string
		}{
			{"NUL in a user's e-mail", request{method: http.MethodPost, path: "/api/v1/orgs/acme/users", token: admin, contentType: "application/json",
				body: strings.NewReader(`{"email":"a\u0000b@acme.test"}`)}, "email"},
			{"invalid UTF-8 in a department name", request{method: http.MethodPost, path: "/api/v1/orgs/acme/departments", token: admin, contentType: "application/json",
				body: strings.NewReader("{\"name\":\"R\xffD\"}")}, "name"},
			{"NUL nested in a key's roles", request{method: http.MethodPost, path: "/api/v1/orgs/acme/api-keys", token: admin, contentType: "application/json",
				body: strings.NewReader(`{"name":"k","service":true,"roles":[{"role":"auditor","domain":"org\u0000"}]}`)}, "roles[0].domain"},
			{"NUL in an audit query", request{method: http.MethodGet, path: "/api/v1/orgs/acme/audit?q=actor:%00", token: admin}, "q"},
			{"an org slug of %FF", request{method: http.MethodGet, path: "/api/v1/orgs/%FF", token: e.adminToken()}, "org"},
			{"a 4,000-character e-mail", request{method: http.MethodPost, path: "/api/v1/orgs/acme/users", token: admin, contentType: "application/json",
				body: strings.NewReader(`{"email":"` + long + `"}`)}, "email"},
			{"NUL in a sign-in e-mail", request{method: http.MethodPost, path: "/api/v1/orgs/acme/auth/login", contentType: "application/json",
				body: strings.NewReader(`{"email":"plain@acme.test\u0000","password":"x"}`)}, "email"},
			{"JSON nested 40 deep", request{method: http.MethodPost, path: "/api/v1/orgs/acme/departments", token: admin, contentType: "application/json",
				body: strings.NewReader(strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40))}, "a.a.a"},
		}
		for _, tc := range cases {
			r := e.do(tc.req)
			wantStatus(t, tc.name, r, http.StatusBadRequest)
			fields := r.envelope(t).Error.Fields
			found := false
			for k := range fields {
				found = found || strings.HasPrefix(k, tc.field)
			}
			if !found {
				t.Errorf("%s: fields %v do not name %s", tc.name, fields, tc.field)
			}
		}
		// The refused sign-in is on record.
		if evs := orgEvents(t, f, "action:request.rejected decision:deny"); len(evs) == 0 ||
			!strings.Contains(orgEventsText(evs), "/auth/login") {
			t.Errorf("the refused sign-in left no audit record: %+v", evs)
		}
		// A 4,000-character e-mail at sign-in fails like any wrong one, and
		// the failure is recorded (its name bounded).
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": long, "password": "whatever-it-is"})
		wantStatus(t, "long e-mail sign-in", r, http.StatusUnauthorized)
		evs := orgEvents(t, f, "action:user.login decision:deny")
		if len(evs) == 0 || len(evs[0].Actor.Name) > audit.MaxIndexedText || !strings.HasPrefix(evs[0].Actor.Name, "aaaa") {
			t.Fatalf("the failed sign-in with a long e-mail is not recorded: %+v", evs)
		}
	})
}

// rootCreate posts v to acme's API as the entered platform admin and
// returns the new object's id.
func (f *orgFixture) rootCreate(t *testing.T, path string, v any) int64 {
	t.Helper()
	r := f.e.json(http.MethodPost, "/api/v1/orgs/acme"+path, f.tokens["entered-admin"], v)
	if r.status >= 300 {
		t.Fatalf("POST %s: %d %s", path, r.status, r.body)
	}
	var out struct{ ID int64 }
	r.decode(t, &out)
	return out.ID
}

// hostAndAgent creates a host environment in department 1 (at an address
// nothing answers on) and an agent there using it.
func (f *orgFixture) hostAndAgent(t *testing.T, name string) (env, agent int64) {
	t.Helper()
	env = f.rootCreate(t, "/environments", map[string]any{"name": name + "-host", "kind": "host", "department_id": f.dept1,
		"url": "http://10.255.0.1:1", "os": "linux", "deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20)})
	agent = f.rootCreate(t, "/agents", map[string]any{"name": name + "-agent", "department_id": f.dept1,
		"config": map[string]string{"model": "m"}, "environment_ids": []int64{env}})
	return env, agent
}

func orgEventsText(evs []audit.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(ev.Target.Name + " " + string(ev.Details) + "\n")
	}
	return b.String()
}

// Also tightened: the CSRF token is taken from the header or the form
// body, never the query string; workspace_root is cleaned.
func TestHardeningTightenings(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		const csrf = "tightening-csrf-token-0123456789"
		ck := []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["admin"]}, {Name: "gh_csrf", Value: csrf}}
		form := url.Values{"name": {"Via query"}}
		r := f.e.do(request{method: http.MethodPost, path: "/o/acme/departments?_csrf=" + csrf, contentType: "application/x-www-form-urlencoded",
			body: strings.NewReader(form.Encode()), cookies: ck})
		wantStatus(t, "csrf in the query", r, http.StatusForbidden)
		form.Set("_csrf", csrf)
		r = f.e.do(request{method: http.MethodPost, path: "/o/acme/departments", contentType: "application/x-www-form-urlencoded",
			body: strings.NewReader(form.Encode()), cookies: ck})
		if r.status >= 400 {
			t.Fatalf("csrf in the body: %d %s", r.status, r.body)
		}

		r = f.e.json(http.MethodPost, "/api/v1/orgs/acme/environments", f.tokens["admin"], map[string]any{"name": "escape", "kind": "host",
			"url": "http://10.0.0.7:49984", "os": "linux", "deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20), "workspace_root": "/srv/../../etc"})
		wantStatus(t, "workspace root with ..", r, http.StatusBadRequest)
		mustContain(t, "workspace root", r.envelope(t).Error.Fields["workspace_root"], "..")
	})
}
