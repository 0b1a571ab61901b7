package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestUseLocalSandboxes (issue 26, item 2): with --local-sandboxes the
// environments page registers the local backend in one action, authorized
// exactly like creating that sandbox environment by hand: in department 1
// its owner may, its member, the auditor and a plain user are refused
// (403, audited as authz.deny); the environment and its template are
// created together with their audit records; once registered, another
// attempt is refused (400, the name is taken) and creates nothing. Without
// --local-sandboxes there is no such route.
func TestUseLocalSandboxes(t *testing.T) {
	t.Parallel()
	if agentdBin.StandIn {
		t.Fatalf("the local sandbox backend needs the real agentd: %s", agentdBin.Reason)
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d, func(c *config.Config) { c.LocalSandboxes, c.LocalAgentd = true, agentdBin.Path })
		e := f.e
		use := func(who string) response {
			t.Helper()
			csrf := "local-csrf-token-0123456789"
			return e.do(request{method: http.MethodPost, path: "/o/acme/environments/local",
				body: strings.NewReader(fmt.Sprintf("department_id=%d", f.dept1)), contentType: "application/x-www-form-urlencoded",
				cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[who]}, {Name: "gh_csrf", Value: csrf}},
				header:  http.Header{"X-Csrf-Token": {csrf}}})
		}
		envCount := func() int {
			t.Helper()
			var list struct{ Items []struct{ Name string } }
			e.json(http.MethodGet, "/api/v1/orgs/acme/environments", f.tokens["entered-admin"], nil).decode(t, &list)
			return len(list.Items)
		}
		for _, who := range []string{"member", "auditor", "plain"} {
			// The page offers it only where the viewer may add it.
			page := e.do(request{method: http.MethodGet, path: "/o/acme/environments", cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[who]}}})
			if page.status != http.StatusOK || strings.Contains(string(page.body), `data-testid="use-local"`) {
				t.Errorf("%s: the environments page (%d) offers the local backend", who, page.status)
			}
			r := use(who)
			if r.status != http.StatusForbidden || !strings.Contains(string(r.body), "was not registered") {
				t.Errorf("%s: %d %.300s, want 403 saying it was not registered", who, r.status, r.body)
			}
		}
		if n := envCount(); n != 0 {
			t.Fatalf("refused attempts left %d environments", n)
		}
		page := e.do(request{method: http.MethodGet, path: "/o/acme/environments", cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["owner"]}}})
		offer := string(page.body)
		if i := strings.Index(offer, `data-testid="local-offer"`); i >= 0 {
			offer = offer[i:]
			offer = offer[:strings.Index(offer, "</section>")]
		} else {
			offer = ""
		}
		if !strings.Contains(offer, `data-testid="use-local"`) || !strings.Contains(offer, "Research") || strings.Contains(offer, "whole organization") {
			t.Errorf("the department owner is not offered the local backend in their department alone: %s", offer)
		}
		r := use("owner")
		if r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Location"), "/o/acme/environments/") {
			t.Fatalf("owner: %d %s %.300s, want a redirect to the new environment", r.status, r.header.Get("Location"), r.body)
		}
		var list struct {
			Items []struct {
				ID           int64
				Name, Kind   string
				DepartmentID *int64 `json:"department_id"`
			}
		}
		e.json(http.MethodGet, "/api/v1/orgs/acme/environments", f.tokens["entered-admin"], nil).decode(t, &list)
		if len(list.Items) != 1 || list.Items[0].Name != "local-sandboxes" || list.Items[0].Kind != "sandbox" ||
			list.Items[0].DepartmentID == nil || *list.Items[0].DepartmentID != f.dept1 {
			t.Fatalf("environments after the owner's registration: %+v", list.Items)
		}
		var tpls struct {
			Items []struct{ BackendTemplateID, Status string }
		}
		tr := e.json(http.MethodGet, fmt.Sprintf("/api/v1/orgs/acme/environments/%d/templates", list.Items[0].ID), f.tokens["owner"], nil)
		tr.decode(t, &tpls)
		if len(tpls.Items) != 1 || !strings.Contains(string(tr.body), `"base"`) {
			t.Fatalf("templates of the local backend: %s", tr.body)
		}
		// Once registered, a second attempt is refused for the name.
		if r := use("admin"); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "was not registered") || envCount() != 1 {
			t.Errorf("a second registration: %d (%d environments), want 400 saying it was not registered, and still one", r.status, envCount())
		}

		lg := openAudit(t, f)
		for q, want := range map[string]int{"action:authz.deny": 3, "action:environment.create": 1, "action:template.create": 1} {
			evs, err := lg.Query(context.Background(), mustParse(t, q), 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, ev := range evs {
				if q != "action:authz.deny" || strings.Contains(string(ev.Details), `"environments"`) {
					n++
				}
				b, _ := json.Marshal(ev)
				if strings.Contains(string(b), e.c.Local.APIKey) || strings.Contains(string(b), e.c.Local.AgentdToken) {
					t.Errorf("%s: an audit event holds a secret of the local backend", q)
				}
			}
			if n != want {
				t.Errorf("%s: %d events about environments, want %d", q, n, want)
			}
		}
	})

	t.Run("without --local-sandboxes there is no such route", func(t *testing.T) {
		f := newOrgFixture(t, store.SQLite)
		for _, rt := range f.e.c.Server.Routes() {
			if strings.HasSuffix(rt.Path, "/environments/local") {
				t.Fatalf("route %s %s is registered without a local backend", rt.Method, rt.Path)
			}
		}
	})
}
