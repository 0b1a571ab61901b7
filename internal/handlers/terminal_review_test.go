package handlers_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// newPendingSession starts a session of the fixture's agent as who; nothing
// has used it yet.
func (f *terminalFixture) newPendingSession(t *testing.T, who string) int64 {
	t.Helper()
	r := f.call(http.MethodPost, "/sessions", who, map[string]any{"agent_id": f.agentID})
	wantStatus(t, "create a session", r, http.StatusCreated)
	var sess struct {
		ID    int64
		State string
	}
	r.decode(t, &sess)
	if sess.State != "pending" {
		t.Fatalf("a new session is %s", sess.State)
	}
	return sess.ID
}

// TestTerminalRefusalLeavesSessionDown: a terminal operation that a rule or
// the agent's command policy refuses brings the session up no more than it
// runs: agentd hears nothing (no workspace is made for it) and the session
// stays pending. Before the fix the session was ensured first, so a refused
// exec made the host workspace through agentd (or created a sandbox).
func TestTerminalRefusalLeavesSessionDown(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		// The member may not read files of any session in the department.
		wantStatus(t, "deny rule", f.call(http.MethodPost, "/policies", "admin", rbac.Rule{Subject: fmt.Sprintf("user:%d", f.ids["member"]),
			Domain: rbac.DeptDomain(f.dept1), Object: "sessions/*", Action: "files.read", Effect: "deny"}), http.StatusNoContent)
		for _, tc := range []struct {
			name, method, path string
			body               any
			want               int
		}{
			{"a command the agent's policy refuses", http.MethodPost, "/commands", map[string]any{"command": "rm -rf / --no-preserve-root"}, http.StatusForbidden},
			{"a file read a deny rule refuses", http.MethodGet, "/files?path=notes.txt", nil, http.StatusForbidden},
			{"a stat a deny rule refuses", http.MethodPost, "/files/stat", map[string]any{"paths": []string{"a"}}, http.StatusForbidden},
		} {
			t.Run(tc.name, func(t *testing.T) {
				sid := f.newPendingSession(t, "member")
				before := f.agentd.requests.Load()
				r := f.call(tc.method, fmt.Sprintf("/sessions/%d%s", sid, tc.path), "member", tc.body)
				wantStatus(t, tc.name, r, tc.want)
				if got := f.agentd.callsSince(int(before)); len(got) != 0 {
					t.Errorf("agentd received %v for a refused operation", got)
				}
				var sess struct{ State string }
				f.call(http.MethodGet, fmt.Sprintf("/sessions/%d", sid), "member", nil).decode(t, &sess)
				if sess.State != "pending" {
					t.Errorf("the refused operation brought the session to %s", sess.State)
				}
			})
		}
	})
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestTerminalAddressNowhere: a session's user learns neither the address
// of its environment's agentd from a failed first use (the workspace could
// not be made) nor from the reason a session was lost. Before the fix both
// carried the transport error, `Post "http://<address>/v1/sessions": dial
// tcp <address>: ...`, and the first answered 503 agentd_error instead of
// the gateway's 502 environment_unreachable.
func TestTerminalAddressNowhere(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		wantNoAddress := func(what string, body []byte, addr string) {
			t.Helper()
			if bytes.Contains(body, []byte(addr)) {
				t.Errorf("%s names the environment's address %s: %s", what, addr, body)
			}
		}

		t.Run("first use of a host nobody answers on", func(t *testing.T) {
			addr := closedAddr(t)
			_, sid := f.hostSession(t, "silent-host", "http://"+addr, "agentd-token-"+randomHex(12))
			for _, op := range []struct{ method, path string }{{http.MethodPost, "/commands"}, {http.MethodPost, "/start"}} {
				var body any
				if op.path == "/commands" {
					body = map[string]any{"command": "true"}
				}
				r := f.call(op.method, fmt.Sprintf("/sessions/%d%s", sid, op.path), "member", body)
				wantStatus(t, op.path, r, http.StatusBadGateway)
				if code := r.envelope(t).Error.Code; code != "environment_unreachable" {
					t.Errorf("%s: code %q, want environment_unreachable", op.path, code)
				}
				wantNoAddress(op.path, r.body, addr)
			}
		})

		t.Run("the reason a session was lost", func(t *testing.T) {
			f.e.c.SessionsRT.UnreachableWindow = 500 * time.Millisecond
			token := "agentd-token-" + randomHex(12)
			proc := startAgentdProcess(t, token)
			_, sid := f.hostSession(t, "dying-host", "http://"+proc.Addr(), token)
			wantStatus(t, "first use", f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sid), "member",
				map[string]any{"command": "true", "wait_ms": 5000}), http.StatusCreated)
			if err := proc.Kill(); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/files/stat", sid), "member", map[string]any{"paths": []string{"x"}})
				if r.status == http.StatusConflict {
					wantNoAddress("the answer in a lost session", r.body, proc.Addr())
					break
				}
				wantStatus(t, "stat with agentd dead", r, http.StatusBadGateway)
				if i > 200 {
					t.Fatal("the session was not lost")
				}
				time.Sleep(100 * time.Millisecond)
			}
			r := f.call(http.MethodGet, fmt.Sprintf("/sessions/%d", sid), "member", nil)
			var sess struct{ State, Reason string }
			r.decode(t, &sess)
			if sess.State != "lost" || !strings.Contains(sess.Reason, "refused the connection") {
				t.Errorf("lost session %+v: the reason should say what happened", sess)
			}
			wantNoAddress("the lost session", r.body, proc.Addr())
			page := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d", sid),
				cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}})
			wantNoAddress("the session page", page.body, proc.Addr())
		})
	})
}
