package handlers_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestOutputInAgentdFraming asks the output long-poll for agentd's binary
// framing and checks it carries exactly what the JSON answer does, both
// while the command runs (from agentd) and after it ended (from the
// recording), including bytes that are not UTF-8.
func TestOutputInAgentdFraming(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		member := f.tokens["member"]
		if k, ok := f.keys["member"]; ok {
			member = k
		}
		poll := func(cid int64, cursor uint64, accept string) response {
			t.Helper()
			r := f.e.do(request{method: http.MethodGet, token: member, header: http.Header{"Accept": {accept}},
				path: "/api/v1/orgs/acme" + f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", cid, cursor)})
			wantStatus(t, "poll "+accept, r, http.StatusOK)
			return r
		}
		decodeBinary := func(r response) gateway.Output {
			t.Helper()
			if v := r.header.Values("Vary"); !slices.Contains(v, "Accept") {
				t.Errorf("Vary %q: a cache could mix the binary and JSON answers", v)
			}
			if ct := r.header.Get("Content-Type"); ct != agentd.ChunksMediaType {
				t.Fatalf("Content-Type %q, want %s", ct, agentd.ChunksMediaType)
			}
			var o gateway.Output
			chunks, err := agentd.ReadChunks(bytes.NewReader(r.body), int64(len(r.body)), &o)
			if err != nil {
				t.Fatalf("decode the binary answer: %v", err)
			}
			o.Chunks = chunks
			return o
		}
		decodeJSON := func(r response) gateway.Output {
			t.Helper()
			var o gateway.Output
			if err := json.Unmarshal(r.body, &o); err != nil {
				t.Fatalf("decode the JSON answer: %v", err)
			}
			return o
		}
		same := func(what string, bin, js gateway.Output) {
			t.Helper()
			if bin.CommandID != js.CommandID || bin.State != js.State || bin.NextCursor != js.NextCursor || bin.More != js.More || len(bin.Chunks) != len(js.Chunks) {
				t.Fatalf("%s: binary %+v differs from JSON %+v", what, bin, js)
			}
			for i := range bin.Chunks {
				b, j := bin.Chunks[i], js.Chunks[i]
				if b.ID != j.ID || b.Stream != j.Stream || !bytes.Equal(b.Data, j.Data) {
					t.Errorf("%s: chunk %d: binary %d %s %q, JSON %d %s %q", what, i, b.ID, b.Stream, b.Data, j.ID, j.Stream, j.Data)
				}
			}
		}

		// Output on both streams, some of it not UTF-8, then the command
		// waits for a line of stdin, so the first polls are answered by
		// agentd while it runs.
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
			"command": `printf 'one\000\377\n'; printf 'err\n' >&2; read line; printf 'two\n'`, "stdin": true, "wait_ms": 0})
		wantStatus(t, "exec", r, http.StatusCreated)
		var started gateway.Output
		r.decode(t, &started)
		cid := started.CommandID

		var live gateway.Output
		for deadline := time.Now().Add(20 * time.Second); len(live.Chunks) < 2; {
			live = decodeBinary(poll(cid, 0, agentd.ChunksMediaType))
			if live.State != agentd.StateRunning || time.Now().After(deadline) {
				t.Fatalf("waiting for the first output: %+v", live)
			}
		}
		js := decodeJSON(poll(cid, 0, "application/json"))
		if js.NextCursor > live.NextCursor && len(js.Chunks) == len(live.Chunks) {
			// agentd's exec records (never given to readers) arrived
			// between the two polls: the cursor moved past them.
			js.NextCursor = live.NextCursor
		}
		same("while running", live, js)
		wantStatus(t, "let it finish", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", cid), "member", map[string]any{"text": "go\n"}), http.StatusNoContent)

		got := map[string]*bytes.Buffer{}
		end := f.drain(t, "member", cid, 0, got)
		if end.State != agentd.StateExited {
			t.Fatalf("command ended %s", end.State)
		}
		recorded := decodeBinary(poll(cid, 0, agentd.ChunksMediaType))
		same("after the end", recorded, decodeJSON(poll(cid, 0, "application/json")))
		var stdout, stderr bytes.Buffer
		for _, c := range recorded.Chunks {
			map[string]*bytes.Buffer{agentd.StreamStdout: &stdout, agentd.StreamStderr: &stderr}[c.Stream].Write(c.Data)
		}
		if want := "one\x00\xff\ntwo\n"; stdout.String() != want || stderr.String() != "err\n" {
			t.Errorf("binary answer from the recording: stdout %q stderr %q, want %q and %q", stdout.String(), stderr.String(), want, "err\n")
		}
		if fmt.Sprint(got["stdout"]) != stdout.String() {
			t.Errorf("JSON drain read %q, binary %q", got["stdout"], stdout.String())
		}

		// Errors stay JSON whatever the client accepts.
		r = f.e.do(request{method: http.MethodGet, token: member, header: http.Header{"Accept": {agentd.ChunksMediaType}},
			path: "/api/v1/orgs/acme" + f.sessionPath("/commands/%d/output?cursor=x", cid)})
		if r.status != http.StatusBadRequest || r.envelope(t).Error.Code == "" {
			t.Errorf("bad cursor with the binary Accept: status %d %s", r.status, r.body)
		}
	})
}

// TestRecordingDrainsASmallAgentdBuffer: the follower reads agentd's next
// batch while it stores the one before, acknowledging only what it stored.
// With an agentd buffer far smaller than the output, and no client
// reading, that read-ahead finds the buffer full of unacknowledged output;
// it must not wait for more (agentd waits for the follower) but go on, so
// the whole output is recorded. An older agentd, which ignores ack_to and
// would release the batch being stored, is never read ahead of.
func TestRecordingDrainsASmallAgentdBuffer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		older bool // answers without agentd.HeaderAckTo, as before ack_to
	}{
		{"current agentd", false},
		{"older agentd", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, d store.Dialect) {
				f := newTerminalFixture(t, d)
				token := "small-ring-token-" + randomHex(8)
				srv, err := agentd.NewServer(agentd.Config{Token: token, Root: t.TempDir(), RingBytes: 64 << 10, PollBytes: 64 << 10})
				if err != nil {
					t.Fatal(err)
				}
				var readAheads atomic.Int64
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Query().Has("ack_to") {
						readAheads.Add(1)
					}
					if tt.older {
						w = withoutHeader{w, agentd.HeaderAckTo}
					}
					srv.Handler().ServeHTTP(w, r)
				}))
				t.Cleanup(func() {
					srv.Close()
					ts.Close()
				})
				_, f.session = f.hostSession(t, "small-ring", ts.URL, token)

				const size = 4 << 20
				r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
					"command": fmt.Sprintf(`head -c %d /dev/zero | tr '\000' a`, size), "wait_ms": 0})
				wantStatus(t, "exec", r, http.StatusCreated)
				var started gateway.Output
				r.decode(t, &started)
				// Nobody polls: the follower alone drains agentd.
				c := waitCommandEnded(t, f, started.CommandID)
				if c.State != agentd.StateExited || c.Output != size {
					t.Fatalf("recorded %s with %d output bytes, want exited with %d", c.State, c.Output, size)
				}
				got := map[string]*bytes.Buffer{}
				f.drain(t, "member", started.CommandID, 0, got)
				if got["stdout"] == nil || got["stdout"].Len() != size || bytes.Count(got["stdout"].Bytes(), []byte("a")) != size {
					t.Errorf("the recording does not hold the %d bytes of output", size)
				}
				switch n := readAheads.Load(); {
				case tt.older && n > 0:
					t.Errorf("an agentd that ignores ack_to was sent %d read-aheads", n)
				case !tt.older && n == 0:
					t.Error("the follower never read ahead")
				}
			})
		})
	}
}

// withoutHeader drops one header from the answer, as an older agentd.
type withoutHeader struct {
	http.ResponseWriter
	name string
}

func (w withoutHeader) WriteHeader(code int) {
	w.Header().Del(w.name)
	w.ResponseWriter.WriteHeader(code)
}

func (w withoutHeader) Write(b []byte) (int, error) {
	w.Header().Del(w.name)
	return w.ResponseWriter.Write(b)
}

// TestFollowerEndsWhenEnvironmentDeleted: a command running when its
// environment is deleted is recorded as lost instead of its follower
// retrying for ever. On the way, deleting the agent is refused while its
// sessions hold recordings (deleting it would delete them).
func TestFollowerEndsWhenEnvironmentDeleted(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		admin := f.tokens["entered-admin"]
		// The follower notices between its long-polls of agentd; shorten
		// them (no follower runs yet).
		f.e.c.Gateway.Followers.Wait = time.Second
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "sleep 60", "wait_ms": 0})
		wantStatus(t, "exec", r, http.StatusCreated)
		var started gateway.Output
		r.decode(t, &started)

		agentPath := fmt.Sprintf("/api/v1/orgs/acme/agents/%d", f.agentID)
		r = f.e.json(http.MethodDelete, agentPath, admin, nil)
		if r.status != http.StatusConflict || r.envelope(t).Error.Code != "agent_has_recordings" || !strings.Contains(string(r.body), "recording retention") {
			t.Fatalf("delete an agent whose session holds a recording: status %d %s; want 409 agent_has_recordings", r.status, r.body)
		}

		// Move the agent to another environment, then delete the first.
		var ag struct {
			EnvironmentIDs []int64 `json:"environment_ids"`
		}
		f.e.json(http.MethodGet, agentPath, admin, nil).decode(t, &ag)
		r = f.e.json(http.MethodPost, "/api/v1/orgs/acme/environments", admin, map[string]any{"name": "other-host", "kind": "host",
			"department_id": f.dept1, "url": f.agentd.url, "os": "linux", "deployment": "bare-metal", "agentd_token": f.agentd.token})
		wantStatus(t, "create another host", r, http.StatusCreated)
		var other struct{ ID int64 }
		r.decode(t, &other)
		r = f.e.json(http.MethodPatch, agentPath, admin, map[string]any{"environment_ids": []int64{other.ID}, "default_environment_id": other.ID})
		wantStatus(t, "move the agent", r, http.StatusOK)
		r = f.e.json(http.MethodDelete, fmt.Sprintf("/api/v1/orgs/acme/environments/%d", ag.EnvironmentIDs[0]), admin, nil)
		if r.status/100 != 2 {
			t.Fatalf("delete the session's environment: status %d %s", r.status, r.body)
		}

		// Its history stays readable, and the follower records the end.
		c := waitCommandEnded(t, f, started.CommandID)
		if c.State != "lost" {
			t.Errorf("command recorded as %s, want lost", c.State)
		}
		waitFollowersIdle(t, f.e)
		r = f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=0", started.CommandID), "member", nil)
		wantStatus(t, "read the output of a session whose environment is gone", r, http.StatusOK)
	})
}

// TestBearerCallsGetNoCSRFCookie: a call with its own credentials (every
// agent runtime's call to the gateway) is answered without minting a CSRF
// token and cookie it has no use for.
func TestBearerCallsGetNoCSRFCookie(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	r := f.call(http.MethodGet, f.sessionPath("/commands"), "member", nil)
	wantStatus(t, "history", r, http.StatusOK)
	for _, ck := range r.header.Values("Set-Cookie") {
		if strings.HasPrefix(ck, "gh_csrf=") {
			t.Errorf("a bearer call was given a CSRF cookie: %s", ck)
		}
	}
}

// TestSessionPageHidesCommandsARuleRefuses: a rule refusing a viewer the
// session's terminal reads hides its command history on the session page
// too, not only in the API.
func TestSessionPageHidesCommandsARuleRefuses(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo page-secret-4711", "wait_ms": 5000})
	wantStatus(t, "exec", r, http.StatusCreated)
	page := func() string {
		t.Helper()
		p := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d", f.session),
			cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}})
		wantStatus(t, "session page", p, http.StatusOK)
		return string(p.body)
	}
	if !strings.Contains(page(), "page-secret-4711") {
		t.Fatal("the session page does not list the command at all")
	}
	wantStatus(t, "deny rule", f.call(http.MethodPost, "/policies", "admin", rbac.Rule{Subject: fmt.Sprintf("user:%d", f.ids["member"]),
		Domain: rbac.DeptDomain(f.dept1), Object: "sessions/*", Action: "read", Effect: "deny"}), http.StatusNoContent)
	wantStatus(t, "history through the API", f.call(http.MethodGet, f.sessionPath("/commands"), "member", nil), http.StatusForbidden)
	if strings.Contains(page(), "page-secret-4711") {
		t.Error("the session page lists a command whose terminal a rule refuses the viewer")
	}
}
