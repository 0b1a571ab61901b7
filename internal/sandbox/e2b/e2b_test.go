package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2b"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

// agentdBin is set once by TestMain before any test runs.
var agentdBin e2bfaketest.Binary

func TestMain(m *testing.M) {
	e2bfaketest.Main(m, func(b e2bfaketest.Binary) { agentdBin = b })
}

func newClient(t *testing.T, f *e2bfake.Server, key string, opts ...e2b.Option) *e2b.Client {
	t.Helper()
	c, err := e2b.New(f.URL(), key, &http.Client{Timeout: 30 * time.Second}, opts...)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return c
}

// execResult is the part of agentd's session answer the tests read.
type execResult struct {
	State    string `json:"state"`
	PID      int    `json:"pid"`
	ExitCode *int   `json:"exit_code"`
	Chunks   []struct {
		Stream string `json:"stream"`
		Data   []byte `json:"data"`
	} `json:"chunks"`
}

func (r execResult) stdout() string {
	var b strings.Builder
	for _, c := range r.Chunks {
		if c.Stream == "stdout" || c.Stream == "pty" {
			b.Write(c.Data)
		}
	}
	return b.String()
}

// execVia runs a command through agentd at base (a proxied sandbox URL).
func execVia(t *testing.T, hc *http.Client, base, command string, waitMS int) (execResult, int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command, "wait_ms": waitMS})
	req, err := http.NewRequest(http.MethodPost, base+"/v1/sessions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2bfaketest.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	defer resp.Body.Close()
	var out execResult
	if resp.StatusCode < 300 {
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("exec %q: decode: %v", command, err)
		}
	}
	return out, resp.StatusCode
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// base returns the agentd URL of a sandbox.
		base func(f *e2bfake.Server, sb sandbox.Sandbox) string
	}{
		{"host-based", func(f *e2bfake.Server, sb sandbox.Sandbox) string {
			return sandbox.Addressing{Scheme: "http"}.AgentdURL(sb)
		}},
		{"path-based", func(f *e2bfake.Server, sb sandbox.Sandbox) string {
			return sandbox.Addressing{ProxyBaseURL: f.ProxyURL()}.AgentdURL(sb)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := e2bfaketest.New(t, agentdBin, e2bfake.Config{})
			c := newClient(t, f, e2bfaketest.APIKey)
			hc := f.HTTPClient()

			md := map[string]string{"gatehouse.org": "acme", "gatehouse.session": tt.name}
			sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: 60, AutoPause: true, Metadata: md})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if sb.ID == "" || sb.Domain != f.Domain() || sb.EnvdVersion == "" {
				t.Fatalf("create answered %+v", sb)
			}
			other, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Metadata: map[string]string{"gatehouse.org": "globex"}})
			if err != nil {
				t.Fatalf("create other: %v", err)
			}

			list, err := c.List(ctx, sandbox.ListFilter{Metadata: map[string]string{"gatehouse.org": "acme"}})
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			if len(list) != 1 || list[0].ID != sb.ID || list[0].State != sandbox.StateRunning || list[0].Metadata["gatehouse.session"] != tt.name {
				t.Fatalf("list by metadata = %+v, want only %s running", list, sb.ID)
			}
			if list[0].CPU != 2 || list[0].MemoryMB != 512 || list[0].StartedAt.IsZero() || !list[0].EndAt.After(list[0].StartedAt) {
				t.Errorf("listed sandbox fields = %+v", list[0])
			}

			base := tt.base(f, sb)
			res, status := execVia(t, hc, base, "echo hi", 5000)
			if status != http.StatusOK && status != http.StatusCreated {
				t.Fatalf("exec echo: status %d", status)
			}
			if res.State != "exited" || res.ExitCode == nil || *res.ExitCode != 0 || res.stdout() != "hi\n" {
				t.Fatalf("exec echo = %+v (stdout %q)", res, res.stdout())
			}

			// A file in the workspace and a long-running child that pause
			// must freeze along with agentd.
			res, _ = execVia(t, hc, base, "echo kept > note.txt && exec sleep 300", 300)
			if res.State != "running" || res.PID <= 0 {
				t.Fatalf("long command = %+v, want running with a pid", res)
			}
			snap, ok := f.Inspect(sb.ID)
			if !ok {
				t.Fatal("sandbox missing from the fake")
			}
			if b, err := os.ReadFile(filepath.Join(snap.Workspace, "note.txt")); err != nil || string(b) != "kept\n" {
				t.Fatalf("workspace file = %q, %v", b, err)
			}

			if err := c.Pause(ctx, sb.ID); err != nil {
				t.Fatalf("pause: %v", err)
			}
			if s := e2bfake.ProcState(snap.PID); s != 'T' {
				t.Errorf("agentd state after pause = %q, want T", s)
			}
			child := res.PID
			if s := e2bfake.ProcState(child); s != 'T' {
				t.Errorf("child state after pause = %q, want T", s)
			}
			if err := c.Pause(ctx, sb.ID); !errors.Is(err, sandbox.ErrConflict) {
				t.Errorf("second pause = %v, want ErrConflict", err)
			}
			info, err := c.Get(ctx, sb.ID)
			if err != nil || info.State != sandbox.StatePaused || info.Lifecycle == nil || info.Lifecycle.OnTimeout != sandbox.OnTimeoutPause {
				t.Errorf("get paused = %+v, %v", info, err)
			}
			paused, err := c.List(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StatePaused}})
			if err != nil || len(paused) != 1 || paused[0].ID != sb.ID {
				t.Errorf("list paused = %+v, %v", paused, err)
			}
			if _, status := execVia(t, hc, base, "true", 1000); status != http.StatusBadGateway {
				t.Errorf("exec while paused: status %d, want 502", status)
			}

			resumed, err := c.Connect(ctx, sb.ID, time.Minute)
			if err != nil || !resumed.Resumed || resumed.ID != sb.ID {
				t.Fatalf("connect = %+v, %v; want resumed", resumed, err)
			}
			for _, pid := range []int{snap.PID, child} {
				if s := e2bfake.ProcState(pid); s == 'T' || s == 0 {
					t.Errorf("process %d state after connect = %q, want thawed", pid, s)
				}
			}
			res, _ = execVia(t, hc, base, "cat note.txt", 5000)
			if res.stdout() != "kept\n" {
				t.Errorf("file after resume = %q", res.stdout())
			}
			again, err := c.Connect(ctx, sb.ID, time.Minute)
			if err != nil || again.Resumed {
				t.Errorf("connect to running = %+v, %v; want not resumed", again, err)
			}

			if err := c.Kill(ctx, sb.ID); err != nil {
				t.Fatalf("kill: %v", err)
			}
			if _, err := c.Get(ctx, sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("get after kill = %v, want ErrNotFound", err)
			}
			if s := e2bfake.ProcState(snap.PID); s != 0 {
				t.Errorf("agentd still exists after kill (state %q)", s)
			}
			if s := e2bfake.ProcState(child); s != 0 && s != 'Z' {
				t.Errorf("child still exists after kill (state %q)", s)
			}
			if _, err := os.Stat(snap.Workspace); !os.IsNotExist(err) {
				t.Errorf("workspace after kill: %v, want gone", err)
			}
			if err := c.Kill(ctx, sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("second kill = %v, want ErrNotFound", err)
			}
			if err := c.Kill(ctx, other.ID); err != nil {
				t.Errorf("kill other: %v", err)
			}
		})
	}
}

func TestListPaging(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ignore    bool
		pageSize  int
		wantCount int
		wantCalls int
	}{
		{"follows X-Next-Token", false, 1, 5, 5},
		{"pages of two", false, 2, 5, 3},
		{"one page", false, 0, 5, 1},
		// CubeSandbox ignores nextToken: the repeated page ends the walk.
		{"server ignores nextToken", true, 2, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}, IgnoreNextToken: tt.ignore})
			c := newClient(t, f, e2bfaketest.APIKey)
			var want []string
			for range 5 {
				sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Metadata: map[string]string{"k": "v"}})
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				want = append(want, sb.ID)
			}
			list, err := c.List(ctx, sandbox.ListFilter{Metadata: map[string]string{"k": "v"}, PageSize: tt.pageSize})
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			var got []string
			for _, s := range list {
				got = append(got, s.ID)
			}
			// E2B lists newest first.
			slices.Reverse(want)
			if len(got) != tt.wantCount || !slices.Equal(got, want[:tt.wantCount]) {
				t.Errorf("list = %v, want %v", got, want[:tt.wantCount])
			}
			if n := f.Calls("GET /v2/sandboxes"); n != tt.wantCalls {
				t.Errorf("GET /v2/sandboxes calls = %d, want %d", n, tt.wantCalls)
			}
		})
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := e2bfaketest.NewManualClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}, Clock: clock.Now})
	c := newClient(t, f, e2bfaketest.APIKey)
	mk := func(md map[string]string) string {
		sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Metadata: md})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		return sb.ID
	}
	// A manual clock moved between creates gives distinct start times, so
	// the order and startedAfter are exact.
	a := mk(map[string]string{"org": "acme", "agent": "x"})
	startA := f.Now()
	f.Advance(time.Second)
	b := mk(map[string]string{"org": "acme", "agent": "y & z=1"})
	f.Advance(time.Second)
	g := mk(map[string]string{"org": "globex"})
	if err := c.Pause(ctx, b); err != nil {
		t.Fatalf("pause: %v", err)
	}
	tests := []struct {
		name string
		f    sandbox.ListFilter
		want []string
	}{
		{"all, newest first", sandbox.ListFilter{}, []string{g, b, a}},
		{"one pair", sandbox.ListFilter{Metadata: map[string]string{"org": "acme"}}, []string{b, a}},
		{"all pairs must match", sandbox.ListFilter{Metadata: map[string]string{"org": "acme", "agent": "x"}}, []string{a}},
		{"value needing escapes", sandbox.ListFilter{Metadata: map[string]string{"agent": "y & z=1"}}, []string{b}},
		{"no match", sandbox.ListFilter{Metadata: map[string]string{"org": "initech"}}, nil},
		{"running", sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning}}, []string{g, a}},
		{"paused and acme", sandbox.ListFilter{States: []sandbox.State{sandbox.StatePaused}, Metadata: map[string]string{"org": "acme"}}, []string{b}},
		{"both states", sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}}, []string{g, b, a}},
		{"template by alias", sandbox.ListFilter{Template: "base"}, []string{g, b, a}},
		{"unknown template", sandbox.ListFilter{Template: "other"}, nil},
		{"started after the first", sandbox.ListFilter{StartedAfter: startA}, []string{g, b}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			list, err := c.List(ctx, tt.f)
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			var got []string
			for _, s := range list {
				got = append(got, s.ID)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("list = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestErrorsFromFake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}})
	good := newClient(t, f, e2bfaketest.APIKey)
	sb, err := good.Create(ctx, sandbox.CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := good.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	tests := []struct {
		name   string
		call   func(c *e2b.Client) error
		key    string
		want   error
		status int
	}{
		{"missing key", func(c *e2b.Client) error { _, err := c.List(ctx, sandbox.ListFilter{}); return err }, "", sandbox.ErrUnauthorized, 401},
		{"wrong key", func(c *e2b.Client) error { _, err := c.Get(ctx, sb.ID); return err }, "e2b_wrong", sandbox.ErrUnauthorized, 401},
		{"unknown sandbox", func(c *e2b.Client) error { _, err := c.Get(ctx, "nosuch"); return err }, e2bfaketest.APIKey, sandbox.ErrNotFound, 404},
		{"kill unknown", func(c *e2b.Client) error { return c.Kill(ctx, "nosuch") }, e2bfaketest.APIKey, sandbox.ErrNotFound, 404},
		{"connect unknown", func(c *e2b.Client) error { _, err := c.Connect(ctx, "nosuch", time.Minute); return err }, e2bfaketest.APIKey, sandbox.ErrNotFound, 404},
		{"unknown template", func(c *e2b.Client) error {
			_, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "nosuch"})
			return err
		}, e2bfaketest.APIKey, sandbox.ErrNotFound, 404},
		{"bad env var name", func(c *e2b.Client) error {
			_, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", EnvVars: map[string]string{"1BAD": "x"}})
			return err
		}, e2bfaketest.APIKey, sandbox.ErrBadRequest, 400},
		{"pause paused", func(c *e2b.Client) error { return c.Pause(ctx, sb.ID) }, e2bfaketest.APIKey, sandbox.ErrConflict, 409},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.call(newClient(t, f, tt.key))
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			var ae *sandbox.APIError
			if !errors.As(err, &ae) || ae.Status != tt.status || ae.Code != tt.status || ae.Message == "" {
				t.Errorf("APIError = %+v, want status and code %d with a message", ae, tt.status)
			}
		})
	}
	// The JSON 404 of an unknown sandbox must not send Connect to /resume.
	if n := f.Calls("POST /sandboxes/{sandboxID}/resume"); n != 0 {
		t.Errorf("resume calls = %d, want 0", n)
	}
}

func TestErrorsFromServer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		status     int
		body       string
		retryAfter string
		want       error
		wantMsg    string
		wantCode   string
		wantRetry  time.Duration
	}{
		{"rate limited", 429, `{"code":429,"message":"slow down","error_code":"rate_limited"}`, "7", sandbox.ErrRateLimited, "slow down", "rate_limited", 7 * time.Second},
		{"capacity", 503, `{"code":503,"message":"no capacity","error_code":"sandbox_capacity_unavailable"}`, "", sandbox.ErrUnavailable, "no capacity", "sandbox_capacity_unavailable", 0},
		{"gateway", 502, `<html>bad gateway</html>`, "", sandbox.ErrUnavailable, "the server did not answer like an E2B-compatible API", "", 0},
		{"forbidden", 403, `{"code":403,"message":"team blocked"}`, "", sandbox.ErrUnauthorized, "team blocked", "", 0},
		{"gone", 410, `{"code":410,"message":"killed"}`, "", sandbox.ErrNotFound, "killed", "", 0},
		{"internal", 500, `{"code":500,"message":"boom"}`, "", sandbox.ErrServer, "boom", "", 0},
		{"unavailable with Retry-After", 503, `{"code":503,"message":"draining"}`, "12", sandbox.ErrUnavailable, "draining", "", 12 * time.Second},
		{"gateway timeout", 504, `upstream timed out`, "", sandbox.ErrUnavailable, "the server did not answer like an E2B-compatible API", "", 0},
		{"not implemented", 501, `{"code":501,"message":"nope"}`, "", sandbox.ErrServer, "nope", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-API-Key") != "k" {
					t.Errorf("X-API-Key = %q", r.Header.Get("X-API-Key"))
				}
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			c, err := e2b.New(srv.URL, "k", srv.Client())
			if err != nil {
				t.Fatal(err)
			}
			err = c.Kill(context.Background(), "sb1")
			var ae *sandbox.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want *APIError", err)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
			for _, s := range []error{sandbox.ErrNotFound, sandbox.ErrConflict, sandbox.ErrUnauthorized, sandbox.ErrRateLimited, sandbox.ErrUnavailable, sandbox.ErrServer} {
				if s != tt.want && errors.Is(err, s) {
					t.Errorf("err also matches %v", s)
				}
			}
			if ae.Status != tt.status || ae.Message != tt.wantMsg || ae.ErrorCode != tt.wantCode || ae.RetryAfter != tt.wantRetry {
				t.Errorf("APIError = %+v", ae)
			}
		})
	}
}

func TestUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, err := e2b.New(url, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Health(context.Background()); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("health of a closed server = %v, want ErrUnavailable", err)
	}
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := e2bfaketest.NewManualClock(start)
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Clock: clock.Now})
	c := newClient(t, f, e2bfaketest.APIKey)

	pausing, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: 30, AutoPause: true})
	if err != nil {
		t.Fatalf("create auto-pause: %v", err)
	}
	killing, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: 30})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	extended, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: 30})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := c.SetTimeout(ctx, extended.ID, 10*time.Minute); err != nil {
		t.Fatalf("set timeout: %v", err)
	}
	info, err := c.Get(ctx, extended.ID)
	if err != nil || !info.EndAt.Equal(start.Add(10*time.Minute)) || !info.StartedAt.Equal(start) {
		t.Fatalf("extended = %+v, %v; want endAt start+10m", info, err)
	}

	f.Advance(29 * time.Second)
	if info, err := c.Get(ctx, pausing.ID); err != nil || info.State != sandbox.StateRunning {
		t.Fatalf("before timeout: %+v, %v", info, err)
	}
	f.Advance(2 * time.Second)

	info, err = c.Get(ctx, pausing.ID)
	if err != nil || info.State != sandbox.StatePaused {
		t.Fatalf("auto-pause sandbox after timeout = %+v, %v; want paused", info, err)
	}
	// Like E2B, a paused sandbox's endAt is when it was paused: what a
	// reclaimer measures "paused for" from.
	if !info.EndAt.Equal(start.Add(30*time.Second)) || !info.StartedAt.Equal(start) {
		t.Errorf("auto-paused startedAt %v endAt %v, want %v and %v", info.StartedAt, info.EndAt, start, start.Add(30*time.Second))
	}
	// E2B keeps timeouts of running sandboxes only: a paused one is 404
	// for set-timeout and must be resumed with connect.
	if err := c.SetTimeout(ctx, pausing.ID, time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("set timeout of a paused sandbox = %v, want ErrNotFound", err)
	}
	snap, _ := f.Inspect(pausing.ID)
	if s := e2bfake.ProcState(snap.PID); s != 'T' {
		t.Errorf("auto-paused agentd state = %q, want T", s)
	}
	if _, err := c.Get(ctx, killing.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("sandbox without auto-pause after timeout: %v, want ErrNotFound", err)
	}
	if info, err := c.Get(ctx, extended.ID); err != nil || info.State != sandbox.StateRunning {
		t.Errorf("extended sandbox = %+v, %v; want running", info, err)
	}

	sb, err := c.Connect(ctx, pausing.ID, time.Minute)
	if err != nil || !sb.Resumed {
		t.Fatalf("connect after auto-pause = %+v, %v", sb, err)
	}
	info, err = c.Get(ctx, pausing.ID)
	if err != nil || info.State != sandbox.StateRunning || !info.EndAt.Equal(f.Now().Add(time.Minute)) {
		t.Errorf("after connect = %+v, %v; want running until now+1m", info, err)
	}
}

func TestConnectFallsBackToResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}, NoConnectRoute: true})
	c := newClient(t, f, e2bfaketest.APIKey)
	sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := c.Connect(ctx, sb.ID, time.Minute)
	if err != nil || !got.Resumed || got.ID != sb.ID {
		t.Fatalf("connect via resume = %+v, %v", got, err)
	}
	// Resume of a running sandbox answers 409, which Connect treats as
	// "already running".
	got, err = c.Connect(ctx, sb.ID, time.Minute)
	if err != nil || got.Resumed || got.ID != sb.ID {
		t.Fatalf("connect to running via resume = %+v, %v", got, err)
	}
	if n := f.Calls("POST /sandboxes/{sandboxID}/resume"); n != 2 {
		t.Errorf("resume calls = %d, want 2", n)
	}
	if _, err := c.Connect(ctx, "nosuch", time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("connect unknown = %v, want ErrNotFound", err)
	}

	// ResumeOnly goes straight to /resume.
	r := newClient(t, f, e2bfaketest.APIKey, e2b.WithConnectMode(e2b.ResumeOnly))
	if err := r.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Connect(ctx, sb.ID, time.Minute); err != nil || !got.Resumed {
		t.Errorf("ResumeOnly connect = %+v, %v", got, err)
	}
	// ConnectOnly reports the missing route instead.
	o := newClient(t, f, e2bfaketest.APIKey, e2b.WithConnectMode(e2b.ConnectOnly))
	if _, err := o.Connect(ctx, sb.ID, time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ConnectOnly connect on a server without the route = %v, want ErrNotFound", err)
	}
}

// TestHealth: /health needs no key, so Health also makes an authenticated
// call and names a refused key.
func TestHealth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		noHealth bool
		key      string
		want     error
		wantMsg  string
	}{
		{"healthy", false, e2bfaketest.APIKey, nil, ""},
		{"wrong key is caught although /health answers", false, "wrong", sandbox.ErrUnauthorized, "refuses the API key"},
		{"missing key", false, "", sandbox.ErrUnauthorized, "refuses the API key"},
		{"no /health route", true, e2bfaketest.APIKey, nil, ""},
		{"no /health route, wrong key", true, "wrong", sandbox.ErrUnauthorized, "refuses the API key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, NoHealthRoute: tt.noHealth})
			err := newClient(t, f, tt.key).Health(context.Background())
			if tt.want == nil && err != nil || !errors.Is(err, tt.want) {
				t.Fatalf("health = %v, want %v", err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("health error %q does not say %q", err, tt.wantMsg)
			}
			if n := f.Calls("GET /templates"); n != 1 {
				t.Errorf("authenticated calls = %d, want 1", n)
			}
		})
	}
}

func TestTemplates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{
		Launcher: e2bfaketest.StubLauncher{},
		Templates: []e2bfake.Template{
			{ID: "tpl1", Aliases: []string{"python"}, CPU: 2, MemoryMB: 1024, DiskSizeMB: 4096},
			{ID: "tpl2", CPU: 4, MemoryMB: 2048, DiskSizeMB: 8192},
		},
	})
	c := newClient(t, f, e2bfaketest.APIKey)
	list, err := c.ListTemplates(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list templates = %+v, %v", list, err)
	}
	want := sandbox.Template{ID: "tpl1", Aliases: []string{"python"}, CPU: 2, MemoryMB: 1024, DiskSizeMB: 4096, BuildStatus: "ready"}
	got := list[0]
	if got.ID != want.ID || !slices.Equal(got.Aliases, want.Aliases) || got.CPU != want.CPU || got.MemoryMB != want.MemoryMB ||
		got.DiskSizeMB != want.DiskSizeMB || got.BuildStatus != want.BuildStatus || got.EnvdVersion == "" {
		t.Errorf("template = %+v, want %+v", got, want)
	}
	one, err := c.GetTemplate(ctx, "tpl2")
	if err != nil || one.ID != "tpl2" || one.CPU != 4 || one.DiskSizeMB != 8192 {
		t.Errorf("get template = %+v, %v", one, err)
	}
	if _, err := c.GetTemplate(ctx, "nosuch"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("get unknown template = %v, want ErrNotFound", err)
	}
	// Creating by alias resolves to the template.
	sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "python"})
	if err != nil || sb.TemplateID != "tpl1" || sb.Alias != "python" {
		t.Errorf("create by alias = %+v, %v", sb, err)
	}
}

func TestNewRejectsBadURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"ftp://x", "::", "localhost:3000"} {
		if _, err := e2b.New(u, "k", nil); err == nil {
			t.Errorf("New(%q) succeeded, want error", u)
		}
	}
}
