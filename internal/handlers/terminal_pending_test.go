package handlers_test

import (
	"net/http"
	"testing"

	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestPendingSandboxSessionHistory: the command history of a sandbox
// session that has no sandbox yet is an empty list, as for any session
// where nothing ran — not 409 session_pending, a code the docs do not
// list. Found by the chaos run (internal/bench TestChaos), whose driver
// looks for an exec that got no answer in the session's history.
func TestPendingSandboxSessionHistory(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}})
		root := f.tokens["entered-admin"]
		r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/environments", root, map[string]any{"name": "sandboxes", "kind": "sandbox",
			"department_id": f.dept1, "url": fake.URL(), "proxy_base_url": fake.ProxyURL(), "sandbox_scheme": "http",
			"api_key": e2bfaketest.APIKey, "agentd_token": e2bfaketest.Token})
		wantStatus(t, "create the sandbox environment", r, http.StatusCreated)
		var env, tpl, agent, sess struct{ ID int64 }
		r.decode(t, &env)
		r = f.e.json(http.MethodPost, "/api/v1/orgs/acme/environments/"+itoa(env.ID)+"/templates", root,
			map[string]any{"import": true, "backend_template_id": "base"})
		wantStatus(t, "import the template", r, http.StatusCreated)
		r.decode(t, &tpl)
		r = f.e.json(http.MethodPost, "/api/v1/orgs/acme/agents", root, map[string]any{"name": "sandboxed", "department_id": f.dept1,
			"config": map[string]string{"model": "m"}, "sandbox_mode": "per-session", "template_id": tpl.ID, "environment_ids": []int64{env.ID}})
		wantStatus(t, "create the agent", r, http.StatusCreated)
		r.decode(t, &agent)
		r = f.call(http.MethodPost, "/sessions", "member", map[string]any{"agent_id": agent.ID})
		wantStatus(t, "member creates a session", r, http.StatusCreated)
		r.decode(t, &sess)

		r = f.call(http.MethodGet, "/sessions/"+itoa(sess.ID)+"/commands", "member", nil)
		wantStatus(t, "history of the pending session", r, http.StatusOK)
		var h struct {
			Items []struct{ ID int64 } `json:"items"`
		}
		r.decode(t, &h)
		if len(h.Items) != 0 {
			t.Errorf("history of a session where nothing ran: %+v", h.Items)
		}
		r = f.call(http.MethodGet, "/sessions/"+itoa(sess.ID)+"/commands/1/output?cursor=0", "member", nil)
		wantStatus(t, "output of a command the pending session does not have", r, http.StatusNotFound)
	})
}
