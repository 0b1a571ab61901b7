package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// sandboxSession adds a sandbox environment on fake (real agentd
// processes), a per-session agent on it and a session of the member, and
// returns the session's id.
func (f *terminalFixture) sandboxSession(t *testing.T, fake *e2bfake.Server) int64 {
	t.Helper()
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
	return sess.ID
}

// TestSandboxHasItsOwnAgentdToken runs commands through the gateway in a
// sandbox of the E2B fake (a real agentd): the console rekeyed the
// sandbox's agentd before anything else reached it, so the template's
// token gets 401 there while the gateway's commands work, the session
// says "per_sandbox", and the per-sandbox token appears in no answer,
// page, log, audit record or recording.
func TestSandboxHasItsOwnAgentdToken(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{})
		sid := f.sandboxSession(t, fake)
		path := func(p string) string { return fmt.Sprintf("/sessions/%d%s", sid, p) }

		r := f.call(http.MethodPost, path("/commands"), "member", map[string]any{"command": "echo through the gateway", "wait_ms": 10000})
		wantStatus(t, "exec in the sandbox", r, http.StatusCreated)
		var out outputJSON
		r.decode(t, &out)
		if out.State != "exited" || len(out.Chunks) == 0 || !strings.Contains(string(out.Chunks[0].Data), "through the gateway") {
			t.Fatalf("exec answer %s", r.body)
		}

		r = f.call(http.MethodGet, path(""), "member", nil)
		wantStatus(t, "the session", r, http.StatusOK)
		var sess struct {
			SandboxID   string `json:"sandbox_id"`
			AgentdToken string `json:"agentd_token"`
		}
		r.decode(t, &sess)
		if sess.AgentdToken != "per_sandbox" || sess.SandboxID == "" {
			t.Fatalf("session %s", r.body)
		}

		// The per-sandbox token, as the console holds it (sealed).
		ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		var sealedTok string
		err = ten.DB.Raw("SELECT sealed_agentd_token FROM sessions WHERE id = ?", sid).Scan(&sealedTok).Error
		ten.Release()
		if err != nil || sealedTok == "" {
			t.Fatalf("sealed token: %v", err)
		}
		plain, err := f.e.c.Box.Open(sealedTok, sealed.AD("acme", fmt.Sprintf("session/%d/sandbox/%s/agentd_token", sid, sess.SandboxID)))
		if err != nil {
			t.Fatal(err)
		}
		tok := string(plain)
		sandboxURL := fake.ProxyURL() + "/sandbox/" + sess.SandboxID + "/49984"
		hc := &http.Client{Timeout: 30 * time.Second}
		if _, err := agentd.NewClient(sandboxURL, e2bfaketest.Token, hc).Stat(context.Background(), "."); !errors.Is(err, agentd.ErrUnauthorized) {
			t.Fatalf("the template token at the sandbox's agentd: %v, want 401", err)
		}
		if _, err := agentd.NewClient(sandboxURL, tok, hc).Stat(context.Background(), "."); err != nil {
			t.Fatalf("the per-sandbox token: %v", err)
		}

		page := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d", sid),
			cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}})
		wantStatus(t, "session page", page, http.StatusOK)
		if !strings.Contains(string(page.body), "this sandbox&#39;s own") && !strings.Contains(string(page.body), "this sandbox's own") {
			t.Fatal("the session page does not say the sandbox has its own token")
		}
		auditLog := f.e.json(http.MethodGet, "/api/v1/orgs/acme/audit?limit=100", f.tokens["admin"], nil)
		wantStatus(t, "audit log", auditLog, http.StatusOK)
		rec := f.call(http.MethodGet, path(fmt.Sprintf("/commands/%d/recording?format=json", out.CommandID)), "member", nil)
		wantStatus(t, "recording", rec, http.StatusOK)
		for what, text := range map[string]string{"an API answer": f.bodies.String(), "the session page": string(page.body),
			"the audit log": string(auditLog.body), "the recording": string(rec.body), "the console's log": f.e.logs.String()} {
			if strings.Contains(text, tok) {
				t.Errorf("%s holds the per-sandbox token", what)
			}
		}
	})
}

// restartingLauncher runs each sandbox's agentd in process behind a
// handler that restart swaps for a fresh agentd with the template's
// token, as a sandbox whose agentd restarted would have.
type restartingLauncher struct {
	t     *testing.T
	mu    sync.Mutex
	procs []*restartingAgentd
}

type restartingAgentd struct {
	t    *testing.T
	root string
	ts   *httptest.Server
	srv  atomic.Pointer[agentd.Server]
}

func (l *restartingLauncher) Launch(_ context.Context, spec e2bfake.LaunchSpec) (e2bfake.Process, error) {
	p := &restartingAgentd{t: l.t, root: spec.Workspace}
	if err := p.restart(); err != nil {
		return nil, err
	}
	p.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.srv.Load().Handler().ServeHTTP(w, r) }))
	l.t.Cleanup(func() { p.Kill() })
	l.mu.Lock()
	l.procs = append(l.procs, p)
	l.mu.Unlock()
	return p, nil
}

// restart replaces the agentd with a fresh one taking the template token.
func (p *restartingAgentd) restart() error {
	srv, err := agentd.NewServer(agentd.Config{Token: e2bfaketest.Token, Root: p.root})
	if err != nil {
		return err
	}
	if old := p.srv.Swap(srv); old != nil {
		old.Close()
	}
	return nil
}

func (p *restartingAgentd) Addr() string  { return p.ts.Listener.Addr().String() }
func (p *restartingAgentd) PID() int      { return 0 }
func (p *restartingAgentd) Freeze() error { return nil }
func (p *restartingAgentd) Thaw() error   { return nil }
func (p *restartingAgentd) Kill() error {
	p.srv.Load().Close()
	p.ts.Close()
	return nil
}

// TestSandboxAgentdRestartCountsAsUnreachable: a sandbox's agentd that
// restarted holds the template's token again and refuses the sandbox's
// own: the gateway answers as for an unreachable environment and the
// session starts counting toward its loss.
func TestSandboxAgentdRestartCountsAsUnreachable(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		l := &restartingLauncher{t: t}
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: l})
		sid := f.sandboxSession(t, fake)
		path := func(p string) string { return fmt.Sprintf("/sessions/%d%s", sid, p) }
		r := f.call(http.MethodPost, path("/commands"), "member", map[string]any{"command": "echo before", "wait_ms": 10000})
		wantStatus(t, "exec before the restart", r, http.StatusCreated)
		l.mu.Lock()
		procs := l.procs
		l.mu.Unlock()
		if len(procs) != 1 {
			t.Fatalf("%d sandboxes started", len(procs))
		}
		if err := procs[0].restart(); err != nil {
			t.Fatal(err)
		}
		r = f.call(http.MethodPost, path("/files/stat"), "member", map[string]any{"paths": []string{"."}})
		wantStatus(t, "stat after the restart", r, http.StatusBadGateway)
		if code := r.envelope(t).Error.Code; code != "environment_unreachable" {
			t.Fatalf("code %q", code)
		}
		r = f.call(http.MethodGet, path(""), "member", nil)
		var sess struct {
			UnreachableSince *time.Time `json:"unreachable_since"`
		}
		r.decode(t, &sess)
		if sess.UnreachableSince == nil {
			t.Fatalf("the session does not count the refusal as unreachable: %s", r.body)
		}
	})
}

// oldAgentdLauncher runs each sandbox's agentd in process behind a
// handler that answers POST /v1/token as an agentd from before rekeys:
// 404 not_found.
type oldAgentdLauncher struct{ t *testing.T }

func (l oldAgentdLauncher) Launch(ctx context.Context, spec e2bfake.LaunchSpec) (e2bfake.Process, error) {
	p := &restartingAgentd{t: l.t, root: spec.Workspace}
	if err := p.restart(); err != nil {
		return nil, err
	}
	p.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/token" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"not_found","message":"There is no such endpoint."}}`))
			return
		}
		p.srv.Load().Handler().ServeHTTP(w, r)
	}))
	l.t.Cleanup(func() { p.Kill() })
	return p, nil
}

// TestSandboxOldAgentdKeepsTemplateToken: a sandbox whose agentd cannot be
// rekeyed is used with the template's token, and the session's API answer
// and page say so.
func TestSandboxOldAgentdKeepsTemplateToken(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: oldAgentdLauncher{t}})
		sid := f.sandboxSession(t, fake)
		r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sid), "member", map[string]any{"command": "echo old agentd", "wait_ms": 10000})
		wantStatus(t, "exec", r, http.StatusCreated)
		r = f.call(http.MethodGet, fmt.Sprintf("/sessions/%d", sid), "member", nil)
		var sess struct {
			AgentdToken string `json:"agentd_token"`
		}
		r.decode(t, &sess)
		if sess.AgentdToken != "template" {
			t.Fatalf("session %s", r.body)
		}
		page := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d", sid),
			cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}})
		wantStatus(t, "session page", page, http.StatusOK)
		if !strings.Contains(string(page.body), "too old to be given a token of its own") {
			t.Fatal("the session page does not say the sandbox takes the template's token")
		}
	})
}
