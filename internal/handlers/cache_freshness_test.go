package handlers_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// hostOrg creates org slug with a department, a host environment on
// agentd a, an agent on it and a session of the entered platform admin,
// and returns the admin's org token and the session's id.
func hostOrg(t *testing.T, e *testEnv, platform, slug string, a *countingAgentd) (string, int64) {
	t.Helper()
	wantStatus(t, "create org "+slug, e.json(http.MethodPost, "/api/v1/orgs", platform, map[string]string{"slug": slug, "name": "Org " + slug}),
		http.StatusCreated)
	r := e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/enter", platform, nil)
	wantStatus(t, "enter "+slug, r, http.StatusOK)
	var entered struct{ Token string }
	r.decode(t, &entered)
	root := entered.Token
	post := func(what, path string, v any, out any) {
		t.Helper()
		r := e.json(http.MethodPost, "/api/v1/orgs/"+slug+path, root, v)
		wantStatus(t, what, r, http.StatusCreated)
		r.decode(t, out)
	}
	var dept, env, ag, sess struct{ ID int64 }
	post("create department", "/departments", map[string]string{"name": "Research"}, &dept)
	post("create host", "/environments", map[string]any{"name": "host", "kind": "host", "department_id": dept.ID, "url": a.url,
		"os": "linux", "deployment": "bare-metal", "agentd_token": a.token}, &env)
	post("create agent", "/agents", map[string]any{"name": "coder", "department_id": dept.ID, "config": map[string]string{"model": "m"},
		"environment_ids": []int64{env.ID}}, &ag)
	post("create session", "/sessions", map[string]any{"agent_id": ag.ID}, &sess)
	return root, sess.ID
}

// TestRecreatedOrgNeverUsesOldMachine: an org deleted and created again
// under the same slug, whose session has the same id as the deleted org's,
// runs its commands on its own environment, never on the deleted org's,
// however soon after the deletion. The session cache is told to keep
// entries for an hour, so only keying it by the org's database (not its
// slug) can keep the old org's target from being used.
func TestRecreatedOrgNeverUsesOldMachine(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		e := newEnv(t, d)
		e.c.SessionsRT.RefreshEvery = time.Hour
		platform := e.adminToken()
		r1, r2 := startCountingAgentd(t), startCountingAgentd(t)
		marker := filepath.Join("gatehouse-sessions", "1", "marker")
		var deleted time.Time
		var since int

		if !t.Run("the first org runs a command on R1", func(t *testing.T) {
			root, sid := hostOrg(t, e, platform, "xyz", r1)
			if sid != 1 {
				t.Fatalf("first session of the org has id %d, want 1", sid)
			}
			r := e.json(http.MethodPost, "/api/v1/orgs/xyz/sessions/1/commands", root, map[string]any{"command": "true", "wait_ms": 5000})
			wantStatus(t, "exec true", r, http.StatusCreated)
			waitFollowersIdle(t, e)
		}) {
			return
		}

		if !t.Run("the org is deleted", func(t *testing.T) {
			wantStatus(t, "delete the org", e.json(http.MethodDelete, "/api/v1/orgs/xyz?confirm=xyz", platform, nil), http.StatusNoContent)
			deleted = time.Now()
			since = int(r1.requests.Load())
		}) {
			return
		}

		t.Run("the re-created org runs its command on R2 only", func(t *testing.T) {
			root, sid := hostOrg(t, e, platform, "xyz", r2)
			if sid != 1 {
				t.Fatalf("first session of the re-created org has id %d, want 1", sid)
			}
			sent := time.Now()
			r := e.json(http.MethodPost, "/api/v1/orgs/xyz/sessions/1/commands", root, map[string]any{"command": "touch marker", "wait_ms": 5000})
			wantStatus(t, "exec touch marker", r, http.StatusCreated)
			t.Logf("the exec was sent %s after the deletion finished (org creation and setup in between)", sent.Sub(deleted).Round(time.Millisecond))
			if calls := r1.callsSince(since); len(calls) > 0 {
				t.Fatalf("the deleted org's agentd R1 received %v after the deletion", calls)
			}
			if _, err := os.Stat(filepath.Join(r2.root, marker)); err != nil {
				t.Errorf("the marker is not in R2's workspace: %v", err)
			}
			if _, err := os.Stat(filepath.Join(r1.root, marker)); err == nil {
				t.Error("the marker is in the deleted org's workspace on R1")
			}
		})
	})
}

// TestCommandPolicyChangeAppliesAtOnce: a pattern added to an agent's
// command policy refuses the very next exec on the replica that made the
// change, though the session was just used (and cached). The cache is told
// to keep entries for an hour: only the change itself can invalidate them.
func TestCommandPolicyChangeAppliesAtOnce(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		f.e.c.SessionsRT.RefreshEvery = time.Hour
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo warm", "wait_ms": 5000})
		wantStatus(t, "exec before the change", r, http.StatusCreated)
		waitFollowersIdle(t, f.e)

		setPolicy(t, f.e, f.tokens["entered-admin"], f.agentID, `^rm -rf /`, `^echo stale`)
		before := f.agentd.requests.Load()
		r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo stale-now", "wait_ms": 5000})
		wantPolicyRefusal(t, r)
		if got := f.agentd.requests.Load(); got != before {
			t.Fatalf("agentd received %d requests for the refused exec: %v", got-before, f.agentd.callsSince(int(before)))
		}
	})
}

// TestCommandPolicyChangeReachesOtherReplica: two consoles on one
// database. Replica B used the session (and cached it); the policy is
// changed through replica A; within the documented second B refuses the
// command too.
func TestCommandPolicyChangeReachesOtherReplica(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.Postgres)
	b := secondConsole(t, f.e)
	b.c.SessionsRT.RefreshEvery = time.Hour
	member := f.tokens["member"]
	path := fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands", f.session)

	r := b.json(http.MethodPost, path, member, map[string]any{"command": "echo warm-b", "wait_ms": 5000})
	wantStatus(t, "exec on replica B before the change", r, http.StatusCreated)
	waitFollowersIdle(t, b)

	setPolicy(t, f.e, f.tokens["entered-admin"], f.agentID, `^rm -rf /`, `^echo stale`)
	// The documented bound: another replica's change applies within a
	// second (config_version is read at most once a second per org).
	time.Sleep(1100 * time.Millisecond)
	before := f.agentd.requests.Load()
	r = b.json(http.MethodPost, path, member, map[string]any{"command": "echo stale-now", "wait_ms": 5000})
	wantPolicyRefusal(t, r)
	if got := f.agentd.requests.Load(); got != before {
		t.Fatalf("agentd received %d requests for the refused exec: %v", got-before, f.agentd.callsSince(int(before)))
	}
}

// setPolicy replaces an agent's command policy through the API.
func setPolicy(t *testing.T, e *testEnv, token string, agentID int64, patterns ...string) {
	t.Helper()
	r := e.json(http.MethodPatch, fmt.Sprintf("/api/v1/orgs/acme/agents/%d", agentID), token, map[string]any{"command_policy": patterns})
	wantStatus(t, "change the command policy", r, http.StatusOK)
}

// wantPolicyRefusal checks r is the command policy's refusal naming the
// pattern that matched.
func wantPolicyRefusal(t *testing.T, r response) {
	t.Helper()
	wantStatus(t, "exec after the change", r, http.StatusForbidden)
	if msg := r.envelope(t).Error.Message; !strings.Contains(msg, "^echo stale") {
		t.Fatalf("refusal %q does not name the pattern", msg)
	}
}

// secondConsole starts another console on e's database, as a second
// replica behind a load balancer would run.
func secondConsole(t *testing.T, e *testEnv) *testEnv {
	t.Helper()
	cfg := e.cfg
	cfg.DataDir = t.TempDir()
	logs := &lockedBuffer{}
	c, err := console.New(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("second console: %v", err)
	}
	c.Platform.Sleep = func(context.Context, time.Duration) {}
	srv := httptest.NewServer(validateAPI(t, c.Handler()))
	t.Cleanup(func() {
		srv.Close()
		c.Close()
	})
	return &testEnv{t: t, c: c, srv: srv, cfg: cfg, logs: logs}
}
