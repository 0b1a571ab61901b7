package handlers_test

import (
	"fmt"
	"net/http"
	"testing"

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
