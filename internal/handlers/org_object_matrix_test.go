package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// objectOutcome is what one principal gets from an object route.
type objectOutcome int

const (
	passes  objectOutcome = iota // authorization passes (the handler may still refuse the input)
	hidden                       // 404, as for an object that does not exist
	refused                      // 403
)

func (o objectOutcome) String() string { return [...]string{"allowed", "404", "403"}[o] }

// objectAccess is who may do what with department 1's environments,
// templates and agents: its owner and org admins manage them, its members
// see them, auditors read them (as they read the sessions on them),
// everyone else does not know they exist.
var objectAccess = map[string]struct{ read, manage objectOutcome }{
	"admin":         {passes, passes},
	"entered-admin": {passes, passes},
	"owner":         {passes, passes},
	"member":        {passes, refused},
	"member-key":    {passes, refused},
	"auditor":       {passes, refused},
	"auditor-key":   {passes, refused},
	"plain":         {hidden, hidden},
}

// objectRouteKind classifies the object routes; a route under
// environments or agents that is not classified fails the test, so a new
// route cannot be added without its expectations.
func objectRouteKind(method, path string) (kind string, ok bool) {
	rest := strings.SplitN(path, ":org", 2)[1]
	switch {
	case !strings.Contains(rest, "/environments") && !strings.Contains(rest, "/agents"):
		return "", false
	case strings.HasSuffix(rest, "/environments") || strings.HasSuffix(rest, "/agents"):
		if method == http.MethodGet {
			return "list", true
		}
		return "create", true
	// Trying an agent's execution policy changes nothing: whoever reads it.
	case strings.HasSuffix(rest, "/exec-policy/try"):
		return "read", true
	// A host's connection check (GET …/connection) probes it: managers only.
	case method == http.MethodGet && !strings.HasSuffix(rest, "/backend-templates") && !strings.HasSuffix(rest, "/connection"):
		return "read", true
	}
	return "manage", true
}

// TestOrgObjectMatrix runs every environment, template and agent route as
// every principal against objects of department 1 and checks the exact
// outcome, on SQLite and Postgres.
func TestOrgObjectMatrix(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		root := f.tokens["entered-admin"]
		dept := fmt.Sprint(f.dept1)
		post := func(path string, v any) map[string]any {
			t.Helper()
			r := e.json(http.MethodPost, "/api/v1/orgs/acme"+path, root, v)
			if r.status >= 300 {
				t.Fatalf("POST %s: %d %s", path, r.status, r.body)
			}
			var out map[string]any
			r.decode(t, &out)
			return out
		}
		n := 0
		host := func() string {
			n++
			return fmt.Sprint(post("/environments", map[string]any{"name": fmt.Sprintf("host-%d", n), "kind": "host", "department_id": f.dept1,
				"url": "http://127.0.0.1:1", "os": "linux", "deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20)})["id"])
		}
		sandbox := func() (string, string) {
			n++
			env := fmt.Sprint(post("/environments", map[string]any{"name": fmt.Sprintf("sbx-%d", n), "kind": "sandbox", "department_id": f.dept1,
				"url": "http://127.0.0.1:1", "sandbox_domain": "e2b.app", "agentd_token": strings.Repeat("t", 20)})["id"])
			tpl := fmt.Sprint(post("/environments/"+env+"/templates", map[string]any{"backend_template_id": "base", "vcpu": 1, "memory_mb": 256})["id"])
			return env, tpl
		}
		agent := func(env string) string {
			n++
			return fmt.Sprint(post("/agents", map[string]any{"name": fmt.Sprintf("agent-%d", n), "department_id": f.dept1,
				"config": map[string]string{"model": "m"}, "environment_ids": []json.RawMessage{json.RawMessage(env)}})["id"])
		}
		// Shared objects for routes that change nothing when allowed (an
		// environment in use cannot be deleted; a form with a bad field
		// is refused by validation after authorization).
		usedHost := host()
		sharedAgent := agent(usedHost)
		sbx, _ := sandbox()

		checked := 0
		for _, rt := range e.c.Server.Routes() {
			if !strings.HasPrefix(rt.Path, "/o/:org") && !strings.HasPrefix(rt.Path, "/api/v1/orgs/:org/") {
				continue
			}
			kind, ok := objectRouteKind(rt.Method, rt.Path)
			if !ok {
				continue
			}
			if rt.Perm.Scope != rbac.ScopeAuthenticated {
				t.Errorf("%s %s: object routes pass every signed-in principal and let the service decide; declared %s", rt.Method, rt.Path, rt.Perm)
			}
			for name, want := range objectAccess {
				// Fresh objects for calls that would change them when allowed.
				env, agentID, tpl := usedHost, sharedAgent, "999999"
				switch {
				case strings.Contains(rt.Path, "/templates/:tid"):
					env, tpl = sandbox()
				case strings.Contains(rt.Path, "templates"):
					env = sbx
				case rt.Method == http.MethodDelete && strings.Contains(rt.Path, "/agents/"):
					agentID = agent(usedHost)
				}
				// Page deletions ask for the name: "wrong" changes nothing.
				id := env
				if strings.Contains(rt.Path, "/agents") {
					id = agentID
				}
				path := strings.NewReplacer(":org", "acme", ":tid", tpl, ":id", id).Replace(rt.Path)
				body, ct := objectBody(rt.Method, rt.Path, dept)
				req := request{method: rt.Method, path: path, contentType: ct}
				if body != "" {
					req.body = strings.NewReader(body)
				}
				if strings.HasPrefix(rt.Path, "/o/") {
					if strings.HasSuffix(name, "-key") {
						continue // keys are for the API
					}
					csrf := "matrix-csrf-token-0123456789"
					req.cookies = []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[name]}, {Name: "gh_csrf", Value: csrf}}
					req.header = http.Header{"X-Csrf-Token": {csrf}}
				} else if strings.HasSuffix(name, "-key") {
					req.token = f.keys[name]
				} else {
					req.token = f.tokens[name]
				}
				res := e.do(req)
				checked++
				// A handler failure is not an answer: it must not count as
				// "passes". (A 503 from an absent backend is still one.)
				if res.status == http.StatusInternalServerError {
					t.Errorf("%s %s as %s: internal server error (%.200s)", rt.Method, path, name, res.body)
				}
				expect := passes
				switch kind {
				case "read":
					expect = want.read
				case "manage":
					expect = want.manage
				case "create":
					// Creating in department 1: its owner and admins.
					if want.manage != passes {
						expect = refused
					}
				case "list":
					// Everyone may list; the list is filtered.
				}
				// Handlers answer bad input with 400 (or 409, or a 503 from
				// a backend that is not there): 403 and 404 here are refusals.
				got := passes
				switch res.status {
				case http.StatusForbidden:
					got = refused
				case http.StatusNotFound:
					got = hidden
				}
				if got != expect {
					t.Errorf("%s %s as %s: got %s (%d %.200s), want %s", rt.Method, path, name, got, res.status, res.body, expect)
				}
			}
		}
		if checked < 150 {
			t.Fatalf("object matrix checked only %d route×principal pairs", checked)
		}
		// Object-level refusals are in the audit log with the object, the
		// action and the rule that decided.
		evs, err := openAudit(t, f).Query(context.Background(), mustParse(t, "action:authz.deny"), 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]bool{}
		for _, ev := range evs {
			var det struct{ Object, Action, Rule, Answered string }
			if err := json.Unmarshal(ev.Details, &det); err != nil {
				t.Fatal(err)
			}
			if det.Rule == "" || det.Object == "" || det.Answered == "" {
				t.Errorf("denial without its object or rule: %s", ev.Details)
			}
			kinds[ev.Target.Type+" "+det.Action+" "+det.Answered] = true
		}
		for _, want := range []string{"environment read not_found", "environment update forbidden", "agent read not_found", "agent update forbidden"} {
			if !kinds[want] {
				t.Errorf("no audited denial %q among %v", want, kinds)
			}
		}
	})
}

// objectBody is a request that passes authorization but changes nothing:
// the handler refuses it for its input.
func objectBody(method, path, dept string) (string, string) {
	if strings.HasPrefix(path, "/o/") {
		if method == http.MethodGet {
			return "", ""
		}
		return "name=&kind=host&department_id=" + dept + "&confirm=wrong&backend_template_id=", "application/x-www-form-urlencoded"
	}
	switch {
	case method == http.MethodGet || method == http.MethodDelete:
		return "", ""
	case strings.HasSuffix(path, "/test"):
		return "", ""
	case strings.HasSuffix(path, "/environments"):
		return `{"name":"","kind":"host","department_id":` + dept + `}`, "application/json"
	case strings.HasSuffix(path, "/agents"):
		return `{"name":"","department_id":` + dept + `}`, "application/json"
	}
	return `{"name":""}`, "application/json"
}
