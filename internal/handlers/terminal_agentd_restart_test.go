package handlers_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestTerminalAgentdRestartedUnderCommand restarts a host's agentd (the
// real binary, SIGKILLed and started again at the same address) while an
// interactive command runs: agentd no longer knows the command, so stdin
// and kill answer 409 command_ended like for any ended command — not
// agentd's own 404 naming its internal id for the command — and the
// command ends lost. Found by the chaos run (internal/bench TestChaos).
func TestTerminalAgentdRestartedUnderCommand(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		token := "agentd-token-" + randomHex(12)
		first := startAgentdProcess(t, token)
		fwd, url := newDBCutter(t, "http://"+first.Addr())
		_, f.session = f.hostSession(t, "restarting-host", url, token)

		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
			"command": `while read l; do echo "got $l"; done`, "stdin": true})
		wantStatus(t, "exec the read loop", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		wantStatus(t, "type a line", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "member",
			map[string]any{"text": "one\n"}), http.StatusNoContent)
		// Once the answer is read, agentd has acknowledged the command.
		seen := ""
		deadline := time.Now().Add(30 * time.Second)
		for cursor := uint64(0); !strings.Contains(seen, "got one"); {
			if time.Now().After(deadline) {
				t.Fatalf("no answer to the typed line: %q", seen)
			}
			r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", o.CommandID, cursor), "member", nil)
			wantStatus(t, "poll", r, http.StatusOK)
			var p outputJSON
			r.decode(t, &p)
			for _, ch := range p.Chunks {
				seen += string(ch.Data)
				cursor = ch.ID
			}
		}

		if err := first.Kill(); err != nil {
			t.Fatal(err)
		}
		second := startAgentdProcess(t, token)
		fwd.SetTarget(second.Addr())

		for _, op := range []struct {
			name, method, path string
			body               any
		}{
			{"stdin", http.MethodPost, "/commands/%d/stdin", map[string]any{"text": "two\n"}},
			{"kill", http.MethodDelete, "/commands/%d", nil},
		} {
			t.Run(op.name+" answers 409 command_ended", func(t *testing.T) {
				r := f.call(op.method, f.sessionPath(op.path, o.CommandID), "member", op.body)
				wantStatus(t, op.name+" after agentd restarted", r, http.StatusConflict)
				if code := r.envelope(t).Error.Code; code != "command_ended" {
					t.Errorf("code %q, want command_ended", code)
				}
				if body := string(r.body); strings.Contains(body, "There is no session") || strings.Contains(body, "gh-") {
					t.Errorf("the answer passes on agentd's own refusal: %s", body)
				}
			})
		}
		t.Run("the command ends lost", func(t *testing.T) {
			deadline := time.Now().Add(30 * time.Second)
			for {
				r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=0&wait_ms=1000", o.CommandID), "member", nil)
				wantStatus(t, "poll after the restart", r, http.StatusOK)
				var p outputJSON
				r.decode(t, &p)
				if p.State == "lost" {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the command is %q 30 s after its agentd restarted, want lost", p.State)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	})
}
