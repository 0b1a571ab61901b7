package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// countingAgentd is a real agentd (running real processes) that counts
// the requests it receives, so tests can prove a refused operation never
// reached it.
type countingAgentd struct {
	url, token string
	requests   atomic.Int64
	srv        *agentd.Server
	ts         *httptest.Server

	// root is the directory agentd runs in: host session workspaces are
	// made under it.
	root string

	mu    sync.Mutex
	calls []string // "METHOD /path" of every counted request
}

// callsSince lists the counted requests after the first n.
func (a *countingAgentd) callsSince(n int) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls[min(n, len(a.calls)):]...)
}

func startCountingAgentd(t *testing.T) *countingAgentd {
	t.Helper()
	a := &countingAgentd{token: "agentd-token-" + randomHex(12), root: t.TempDir()}
	srv, err := agentd.NewServer(agentd.Config{Token: a.token, Root: a.root})
	if err != nil {
		t.Fatal(err)
	}
	a.srv = srv
	a.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			a.requests.Add(1)
			a.mu.Lock()
			a.calls = append(a.calls, r.Method+" "+r.URL.Path)
			a.mu.Unlock()
		}
		srv.Handler().ServeHTTP(w, r)
	}))
	a.url = a.ts.URL
	t.Cleanup(func() {
		srv.Close()
		a.ts.Close()
	})
	return a
}

// terminalFixture is an org with a department agent on a host running a
// real agentd, and a session of the department's member.
type terminalFixture struct {
	*orgFixture
	agentd  *countingAgentd
	session int64
	agentID int64
	bodies  *bytes.Buffer // every response body, to look for the agentd token
}

func newTerminalFixture(t *testing.T, d store.Dialect, opts ...func(*config.Config)) *terminalFixture {
	t.Helper()
	f := &terminalFixture{orgFixture: newOrgFixture(t, d, opts...), agentd: startCountingAgentd(t), bodies: &bytes.Buffer{}}
	f.agentID, f.session = f.hostSession(t, "build-host", f.agentd.url, f.agentd.token)
	return f
}

// hostSession adds a host environment named name (agentd at url with
// token) to the first department, an agent on it and a session of the
// member, and returns the agent's and the session's ids.
func (f *terminalFixture) hostSession(t *testing.T, name, url, token string) (agentID, sessionID int64) {
	t.Helper()
	root := f.tokens["entered-admin"]
	r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/environments", root, map[string]any{"name": name, "kind": "host",
		"department_id": f.dept1, "url": url, "os": "linux", "deployment": "bare-metal", "agentd_token": token})
	wantStatus(t, "create host", r, http.StatusCreated)
	var env struct{ ID int64 }
	r.decode(t, &env)
	r = f.e.json(http.MethodPost, "/api/v1/orgs/acme/agents", root, map[string]any{"name": "coder-" + name, "department_id": f.dept1,
		"config": map[string]string{"model": "m"}, "environment_ids": []int64{env.ID}, "command_policy": []string{`^rm -rf /`}})
	wantStatus(t, "create agent", r, http.StatusCreated)
	var ag struct{ ID int64 }
	r.decode(t, &ag)
	r = f.call(http.MethodPost, "/sessions", "member", map[string]any{"agent_id": ag.ID})
	wantStatus(t, "member creates a session", r, http.StatusCreated)
	var sess struct{ ID int64 }
	r.decode(t, &sess)
	return ag.ID, sess.ID
}

// call sends a JSON request to the org API as a named principal.
func (f *terminalFixture) call(method, path, who string, v any) response {
	f.e.t.Helper()
	tok := f.tokens[who]
	if k, ok := f.keys[who]; ok {
		tok = k
	}
	r := f.e.json(method, "/api/v1/orgs/acme"+path, tok, v)
	f.bodies.Write(r.body)
	return r
}

func (f *terminalFixture) sessionPath(format string, args ...any) string {
	return fmt.Sprintf("/sessions/%d", f.session) + fmt.Sprintf(format, args...)
}

type outputJSON struct {
	CommandID  int64  `json:"command_id"`
	State      string `json:"state"`
	ExitCode   *int   `json:"exit_code"`
	NextCursor uint64 `json:"next_cursor"`
	More       bool   `json:"more"`
	Chunks     []struct {
		ID     uint64 `json:"id"`
		Stream string `json:"stream"`
		Data   []byte `json:"data"`
	} `json:"chunks"`
}

// drain long-polls a command's output from cursor until it ended, and
// returns the output by stream.
func (f *terminalFixture) drain(t *testing.T, who string, cid int64, cursor uint64, out map[string]*bytes.Buffer) outputJSON {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", cid, cursor), who, nil)
		wantStatus(t, "poll output", r, http.StatusOK)
		var o outputJSON
		r.decode(t, &o)
		for _, ch := range o.Chunks {
			if ch.ID <= cursor {
				t.Fatalf("chunk %d returned again after cursor %d", ch.ID, cursor)
			}
			if out[ch.Stream] == nil {
				out[ch.Stream] = &bytes.Buffer{}
			}
			out[ch.Stream].Write(ch.Data)
			cursor = ch.ID
		}
		if o.NextCursor > cursor {
			cursor = o.NextCursor
		}
		if o.State != "running" && !o.More {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("command %d still %s after 30 s", cid, o.State)
		}
	}
}

// TestTerminalGateway walks the gateway's operations as a department member
// through the JSON API, on SQLite and Postgres, against a real agentd.
func TestTerminalGateway(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		var lastCommand int64

		t.Run("exec a short command and get its result at once", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo hello; echo oops >&2; exit 3", "wait_ms": 5000})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			if o.State != "exited" || o.ExitCode == nil || *o.ExitCode != 3 {
				t.Fatalf("exec result %+v", o)
			}
			got := map[string]string{}
			for _, ch := range o.Chunks {
				got[ch.Stream] += string(ch.Data)
			}
			if got["stdout"] != "hello\n" || got["stderr"] != "oops\n" {
				t.Fatalf("output %q", got)
			}
		})

		t.Run("long-poll a running command from a cursor", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "for i in 1 2 3 4 5; do echo line $i; sleep 0.05; done"})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			out := map[string]*bytes.Buffer{}
			end := f.drain(t, "member", o.CommandID, 0, out)
			if end.State != "exited" || out["stdout"].String() != "line 1\nline 2\nline 3\nline 4\nline 5\n" {
				t.Fatalf("ended %s with %q", end.State, out["stdout"])
			}
			lastCommand = o.CommandID
			// Once recorded, the same output comes from the recording.
			waitCommandEnded(t, f, o.CommandID)
			again := map[string]*bytes.Buffer{}
			f.drain(t, "member", o.CommandID, 0, again)
			if again["stdout"].String() != out["stdout"].String() {
				t.Fatalf("recording %q differs from what agentd produced %q", again["stdout"], out["stdout"])
			}
		})

		t.Run("stdin, resize and kill on a TTY", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "cat", "tty": true, "rows": 24, "cols": 80})
			wantStatus(t, "exec cat", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			wantStatus(t, "stdin", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "member", map[string]any{"text": "ping\n"}), http.StatusNoContent)
			seen := ""
			cursor := uint64(0)
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(seen, "ping") && time.Now().Before(deadline); {
				r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=1000", o.CommandID, cursor), "member", nil)
				var p outputJSON
				r.decode(t, &p)
				for _, ch := range p.Chunks {
					seen += string(ch.Data)
					cursor = ch.ID
				}
			}
			if !strings.Contains(seen, "ping") {
				t.Fatalf("echo of stdin not seen: %q", seen)
			}
			wantStatus(t, "resize", f.call(http.MethodPost, f.sessionPath("/commands/%d/resize", o.CommandID), "member", map[string]any{"rows": 40, "cols": 120}), http.StatusNoContent)
			r = f.call(http.MethodDelete, f.sessionPath("/commands/%d", o.CommandID), "member", nil)
			wantStatus(t, "kill", r, http.StatusOK)
			end := waitCommandEnded(t, f, o.CommandID)
			if end.State != "killed" || end.InputBytes != int64(len("ping\n")) {
				t.Fatalf("after kill: %+v", end)
			}
			wantStatus(t, "stdin after the end", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "member", map[string]any{"text": "x"}), http.StatusConflict)
		})

		t.Run("files", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "printf 'file body' > note.txt", "wait_ms": 5000})
			wantStatus(t, "write a file", r, http.StatusCreated)
			r = f.call(http.MethodPost, f.sessionPath("/files/stat"), "member", map[string]any{"paths": []string{"note.txt", "missing.txt"}})
			wantStatus(t, "stat", r, http.StatusOK)
			var st struct {
				Results []struct {
					Exists bool
					Size   int64
				}
			}
			r.decode(t, &st)
			if len(st.Results) != 2 || !st.Results[0].Exists || st.Results[0].Size != 9 || st.Results[1].Exists {
				t.Fatalf("stat %+v", st)
			}
			r = f.call(http.MethodGet, f.sessionPath("/files?path=note.txt"), "member", nil)
			wantStatus(t, "read", r, http.StatusOK)
			if string(r.body) != "file body" {
				t.Fatalf("read %q", r.body)
			}
		})

		t.Run("history", func(t *testing.T) {
			r := f.call(http.MethodGet, f.sessionPath("/commands?limit=2"), "member", nil)
			wantStatus(t, "history", r, http.StatusOK)
			var h struct {
				Items      []commandHistory
				NextBefore int64 `json:"next_before"`
			}
			r.decode(t, &h)
			if len(h.Items) != 2 || h.NextBefore == 0 || h.Items[0].ID < h.Items[1].ID {
				t.Fatalf("history page %+v", h)
			}
			if lastCommand == 0 {
				t.Fatal("no command was recorded")
			}
		})

		t.Run("refusals reach neither agentd nor the recording", func(t *testing.T) {
			// The followers of the commands above poll agentd until they
			// recorded their ends: let them finish first.
			waitFollowersIdle(t, f.e)
			before := f.agentd.requests.Load()
			for _, tc := range []struct {
				who  string
				want int
				body map[string]any
			}{
				{"auditor", http.StatusForbidden, map[string]any{"command": "id"}},
				{"auditor-key", http.StatusForbidden, map[string]any{"command": "id"}},
				{"plain", http.StatusNotFound, map[string]any{"command": "id"}},
				{"globex-admin", http.StatusUnauthorized, map[string]any{"command": "id"}},
				{"member", http.StatusForbidden, map[string]any{"command": "rm -rf / --no-preserve-root"}},
			} {
				r := f.call(http.MethodPost, f.sessionPath("/commands"), tc.who, tc.body)
				if r.status != tc.want {
					t.Errorf("exec as %s: %d %s, want %d", tc.who, r.status, r.body, tc.want)
				}
			}
			if got := f.agentd.requests.Load(); got != before {
				t.Fatalf("agentd received %d requests for refused operations", got-before)
			}
			evs, err := openAudit(t, f.orgFixture).Query(context.Background(), mustParse(t, "action:authz.deny"), 0, 200)
			if err != nil {
				t.Fatal(err)
			}
			policy := false
			for _, ev := range evs {
				if strings.Contains(string(ev.Details), "execution policy") {
					policy = true
				}
			}
			if !policy {
				t.Error("the execution policy refusal is not in the audit log")
			}
		})

		t.Run("audit verify proves the recordings", func(t *testing.T) {
			r := f.call(http.MethodPost, "/audit/verify", "admin", nil)
			wantStatus(t, "verify", r, http.StatusOK)
			var v struct{ OK bool }
			r.decode(t, &v)
			if !v.OK {
				t.Fatalf("verify: %s", r.body)
			}
			ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
			if err != nil {
				t.Fatal(err)
			}
			defer ten.Release()
			// Flip one byte of a stored frame: the chain breaks there.
			if err := ten.DB.Exec("UPDATE recording_frames SET prev_hash = 'forged' WHERE command_id = ? AND kind = 'out'", lastCommand).Error; err != nil {
				t.Fatal(err)
			}
			r = f.call(http.MethodPost, "/audit/verify", "admin", nil)
			var broken struct {
				OK     bool
				Reason string
			}
			r.decode(t, &broken)
			if broken.OK || !strings.Contains(broken.Reason, fmt.Sprintf("command %d", lastCommand)) {
				t.Fatalf("verify after tampering: %s", r.body)
			}
		})

		t.Run("the agentd token appears in no answer", func(t *testing.T) {
			if bytes.Contains(f.bodies.Bytes(), []byte(f.agentd.token)) {
				t.Fatal("a response carried the environment's agentd token")
			}
			r := f.call(http.MethodGet, "/audit/export?format=jsonl", "admin", nil)
			if bytes.Contains(r.body, []byte(f.agentd.token)) {
				t.Fatal("the audit export carries the agentd token")
			}
		})
	})
}

type commandHistory struct {
	ID         int64  `json:"id"`
	State      string `json:"state"`
	ExitCode   *int   `json:"exit_code"`
	InputBytes int64  `json:"input_bytes"`
	Output     int64  `json:"output_bytes"`
	Reason     string `json:"reason"`
}

// waitCommandEnded waits until the follower recorded the command's end.
func waitCommandEnded(t *testing.T, f *terminalFixture, cid int64) commandHistory {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r := f.call(http.MethodGet, f.sessionPath("/commands?limit=200"), "member", nil)
		var h struct{ Items []commandHistory }
		if err := json.Unmarshal(r.body, &h); err != nil {
			t.Fatal(err)
		}
		for _, c := range h.Items {
			if c.ID == cid && c.State != "running" {
				return c
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("command %d was not recorded as ended", cid)
	return commandHistory{}
}

// waitFollowersIdle waits until no recording follower of the console runs.
func waitFollowersIdle(t *testing.T, e *testEnv) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.c.Gateway.Followers.Active() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d recording followers still running after 30 s", e.c.Gateway.Followers.Active())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
