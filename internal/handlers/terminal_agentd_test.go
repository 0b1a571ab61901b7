package handlers_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// startAgentdProcess runs the real agentd binary as a process of its own
// (so a test can kill it with SIGKILL) with token; it is killed at cleanup.
func startAgentdProcess(t *testing.T, token string) e2bfake.Process {
	t.Helper()
	l := e2bfake.ExecLauncher{Binary: agentdBin.Path, Token: token, ExtraEnv: agentdBin.Env}
	p, err := l.Launch(context.Background(), e2bfake.LaunchSpec{SandboxID: "host", Workspace: t.TempDir(), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// TestTerminalAgentdKilled kills a host's agentd (SIGKILL) while a command
// runs and is followed: operations answer 502 environment_unreachable
// naming neither the address nor the token, the session becomes lost after
// the threshold of consecutive failures, the command ends lost with what was
// recorded before, and further operations answer 409 with the state.
func TestTerminalAgentdKilled(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		// A window the operations below run into: failures inside it
		// leave the session running, the first one past it loses it.
		const window = 1500 * time.Millisecond
		f.e.c.SessionsRT.UnreachableWindow = window
		token := "agentd-token-" + randomHex(12)
		proc := startAgentdProcess(t, token)
		_, f.session = f.hostSession(t, "doomed-host", "http://"+proc.Addr(), token)

		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "for i in $(seq 1 400); do echo $i; sleep 0.05; done"})
		wantStatus(t, "exec the counter", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		// Read until some output is there (and so recorded soon after).
		seen := ""
		for cursor := uint64(0); !strings.Contains(seen, "3\n"); {
			r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", o.CommandID, cursor), "member", nil)
			wantStatus(t, "poll", r, http.StatusOK)
			var p outputJSON
			r.decode(t, &p)
			for _, ch := range p.Chunks {
				seen += string(ch.Data)
				cursor = ch.ID
			}
		}
		if err := proc.Kill(); err != nil {
			t.Fatal(err)
		}

		unreachable := 0
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; ; i++ {
			if time.Now().After(deadline) {
				t.Fatalf("session not lost after %d operations", i)
			}
			if i > 0 {
				time.Sleep(100 * time.Millisecond)
			}
			r := f.call(http.MethodPost, f.sessionPath("/files/stat"), "member", map[string]any{"paths": []string{"x"}})
			if r.status == http.StatusConflict {
				if code := r.envelope(t).Error.Code; code != "session_lost" {
					t.Fatalf("after the threshold: code %q, want session_lost", code)
				}
				break
			}
			wantStatus(t, "stat with agentd dead", r, http.StatusBadGateway)
			if code := r.envelope(t).Error.Code; code != "environment_unreachable" {
				t.Fatalf("code %q, want environment_unreachable", code)
			}
			if bytes.Contains(r.body, []byte(proc.Addr())) {
				t.Fatalf("the answer names agentd's address: %s", r.body)
			}
			unreachable++
		}
		if unreachable < 2 {
			// Every failure inside the window answers 502 and leaves the
			// session running; many fit in it.
			t.Fatalf("only %d operations answered 502 before the session was lost; the window is %s", unreachable, window)
		}
		r = f.call(http.MethodGet, fmt.Sprintf("/sessions/%d", f.session), "member", nil)
		wantStatus(t, "read the session", r, http.StatusOK)
		var sess struct{ State, Reason string }
		r.decode(t, &sess)
		if sess.State != "lost" || !strings.Contains(sess.Reason, "did not answer for") {
			t.Fatalf("session after agentd died: %+v", sess)
		}

		// The follower ends the command lost, keeping what it recorded.
		end := waitCommandEnded(t, f, o.CommandID)
		if end.State != "lost" {
			t.Fatalf("the followed command ended %+v, want lost", end)
		}
		out := map[string]*bytes.Buffer{}
		f.drain(t, "member", o.CommandID, 0, out)
		if !strings.HasPrefix(out["stdout"].String(), "1\n2\n3\n") {
			t.Fatalf("recording of the lost command: %q", out["stdout"])
		}
		r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "true"})
		wantStatus(t, "exec in a lost session", r, http.StatusConflict)
		if code := r.envelope(t).Error.Code; code != "session_lost" {
			t.Fatalf("exec in a lost session: code %q", code)
		}
		r = f.call(http.MethodPost, "/audit/verify", "admin", nil)
		var v struct{ OK bool }
		r.decode(t, &v)
		if !v.OK {
			t.Fatalf("audit verify: %s", r.body)
		}
		wantSecretNowhere(t, f, token, f.session)
	})
}
