package handlers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// closedCommand is a command as the history lists it after its session's
// close.
type closedCommand struct {
	ID          int64  `json:"id"`
	State       string `json:"state"`
	Reason      string `json:"reason"`
	OutputBytes int64  `json:"output_bytes"`
}

// commandByID reads one command of session sid from its history.
func (f *terminalFixture) commandByID(t *testing.T, sid, cid int64) closedCommand {
	t.Helper()
	r := f.call(http.MethodGet, fmt.Sprintf("/sessions/%d/commands?limit=200", sid), "member", nil)
	wantStatus(t, "history", r, http.StatusOK)
	var h struct{ Items []closedCommand }
	r.decode(t, &h)
	for _, c := range h.Items {
		if c.ID == cid {
			return c
		}
	}
	t.Fatalf("command %d is not in session %d's history: %s", cid, sid, r.body)
	return closedCommand{}
}

// processWith reports whether a live process's command line contains s
// (a zombie's is empty).
func processWith(t *testing.T, s string) bool {
	t.Helper()
	lines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range lines {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// wantClosedByClose checks that command cid of session sid was recorded
// as killed by its session's close, at once: the close waited for it.
func (f *terminalFixture) wantClosedByClose(t *testing.T, sid, cid int64) closedCommand {
	t.Helper()
	c := f.commandByID(t, sid, cid)
	if c.State != "killed" || !strings.Contains(c.Reason, "session's close") {
		t.Fatalf("right after the close command %d is %s (%q), want killed by the session's close", cid, c.State, c.Reason)
	}
	return c
}

// TestSessionCloseEndsCommands: closing a session kills what it started
// (a background process and a loop of a host command, a browser shell
// whose tab was closed) and records each command as ended by the close,
// with its output to the end, before the close answers. Before, the
// commands ran on after the close, were recorded lost, their output no
// longer recorded.
func TestSessionCloseEndsCommands(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		ctx := context.Background()
		var n [4]byte
		_, _ = rand.Read(n[:])
		// A number no other test's process holds: the processes of this
		// one are found by it.
		marker := fmt.Sprint(900000 + binary.BigEndian.Uint32(n[:])%99999)
		ag := agentd.NewClient(f.agentd.url, f.agentd.token, nil)
		var workspace string
		alive := func(t *testing.T) string {
			t.Helper()
			b, _, err := ag.ReadFile(ctx, workspace+"/alive", 0, 1024)
			if err != nil {
				t.Fatalf("read the loop's file: %v", err)
			}
			return string(b)
		}

		var loop, shell int64
		ticks := 0
		t.Run("a loop with a background process runs", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
				"command": "sleep " + marker + " & while :; do date +%s.%N > alive; echo tick; sleep 0.5; done"})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			loop = o.CommandID
			r = f.call(http.MethodGet, f.sessionPath(""), "member", nil)
			var s sessionOut
			r.decode(t, &s)
			workspace = s.Workspace
			cursor := o.NextCursor
			for _, ch := range o.Chunks {
				ticks += strings.Count(string(ch.Data), "tick")
			}
			for deadline := time.Now().Add(20 * time.Second); ticks < 3; {
				if time.Now().After(deadline) {
					t.Fatalf("%d ticks after 20 s", ticks)
				}
				r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", loop, cursor), "member", nil)
				wantStatus(t, "poll", r, http.StatusOK)
				var p outputJSON
				r.decode(t, &p)
				for _, ch := range p.Chunks {
					ticks += strings.Count(string(ch.Data), "tick")
					cursor = ch.ID
				}
			}
			before := alive(t)
			time.Sleep(1200 * time.Millisecond)
			if alive(t) == before {
				t.Fatal("the loop does not write its file")
			}
			if !processWith(t, marker) {
				t.Fatal("the background sleep is not running")
			}
		})

		t.Run("a browser shell whose tab was closed runs", func(t *testing.T) {
			c, _, err := f.dialTerminal(t, "member", "rows=24&cols=80", f.e.srv.URL, wsCSRF)
			if err != nil {
				t.Fatal(err)
			}
			att := readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
			shell = att[len(att)-1].CommandID
			sendInput(t, c, terminal.ClientMessage{Type: "input", Data: "echo shell-$((40+2))\r"})
			screen := ""
			readUntil(t, c, func(m terminal.ServerMessage) bool {
				screen += string(m.Data)
				return strings.Contains(screen, "shell-42")
			})
			_ = c.Close(websocket.StatusNormalClosure, "the tab was closed")
			if got := f.commandByID(t, f.session, shell); got.State != "running" {
				t.Fatalf("the shell of the closed tab is %s", got.State)
			}
		})

		t.Run("the close ends both before it answers", func(t *testing.T) {
			started := time.Now()
			wantStatus(t, "close", f.call(http.MethodDelete, f.sessionPath(""), "member", nil), http.StatusOK)
			if took := time.Since(started); took > 16*time.Second {
				t.Errorf("the close took %s", took)
			}
			f.wantClosedByClose(t, f.session, loop)
			f.wantClosedByClose(t, f.session, shell)
		})

		t.Run("nothing it started runs on", func(t *testing.T) {
			before := alive(t)
			time.Sleep(1500 * time.Millisecond)
			if after := alive(t); after != before {
				t.Errorf("the loop still writes after the close: %q, then %q", before, after)
			}
			gone := false
			for deadline := time.Now().Add(2 * time.Second); !gone && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				gone = !processWith(t, marker)
			}
			if !gone {
				t.Errorf("sleep %s outlived the session's close", marker)
			}
		})

		t.Run("the recordings hold the output to the end", func(t *testing.T) {
			out := map[string]*bytes.Buffer{}
			end := f.drain(t, "member", loop, 0, out)
			if end.State != "killed" {
				t.Errorf("the recording ends %s", end.State)
			}
			if got := strings.Count(out["stdout"].String(), "tick"); got < ticks {
				t.Errorf("the recording holds %d ticks; %d were printed before the close", got, ticks)
			}
			screen := map[string]*bytes.Buffer{}
			f.drain(t, "member", shell, 0, screen)
			if screen["pty"] == nil || !strings.Contains(screen["pty"].String(), "shell-42") {
				t.Errorf("the shell's recording lost its output: %q", screen["pty"])
			}
			r := f.call(http.MethodPost, "/audit/verify", "admin", nil)
			wantStatus(t, "verify", r, http.StatusOK)
			var v struct{ OK bool }
			r.decode(t, &v)
			if !v.OK {
				t.Fatalf("verify: %s", r.body)
			}
			evs, err := openAudit(t, f.orgFixture).Query(ctx, mustParse(t, "action:command.end"), 0, 200)
			if err != nil {
				t.Fatal(err)
			}
			said := 0
			for _, ev := range evs {
				if strings.Contains(string(ev.Details), "session's close") {
					said++
				}
			}
			if said != 2 {
				t.Errorf("%d end events give the close as the reason, want 2", said)
			}
		})

		t.Run("the page's close ends commands too", func(t *testing.T) {
			sid := f.newPendingSession(t, "member")
			r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sid), "member", map[string]any{"command": "sleep " + marker + "1"})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			const csrf = "close-csrf-token-0123456789"
			form := url.Values{"_csrf": {csrf}}
			r = f.e.do(request{method: http.MethodPost, path: fmt.Sprintf("/o/acme/sessions/%d/close", sid), contentType: "application/x-www-form-urlencoded",
				body: strings.NewReader(form.Encode()), cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}, {Name: "gh_csrf", Value: csrf}}})
			wantStatus(t, "close from the page", r, http.StatusSeeOther)
			f.wantClosedByClose(t, sid, o.CommandID)
			if processWith(t, "sleep "+marker+"1") {
				t.Error("the page's close left the command running")
			}
		})

		// A kill agentd refuses is sent again without grace; a command it
		// still will not end is named by the close (its audit event and
		// the session's reason), not passed over.
		for _, tc := range []struct {
			name      string
			refuseAll bool
			sleep     string
		}{{"a refused kill is escalated and ends the command", false, "2"}, {"a command agentd will not kill is reported by the close", true, "3"}} {
			t.Run(tc.name, func(t *testing.T) {
				var deletes, withoutGrace atomic.Int32
				h := startHostileAgentd(t, func(h *hostileAgentd, w http.ResponseWriter, r *http.Request) bool {
					if r.Method != http.MethodDelete || !strings.HasPrefix(r.URL.Path, "/v1/sessions/") {
						return false
					}
					deletes.Add(1)
					if r.URL.Query().Get("grace") == "0" {
						withoutGrace.Add(1)
						if !tc.refuseAll {
							return false
						}
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusConflict)
					w.Write([]byte(`{"error":{"code":"busy","message":"not now"}}` + "\n"))
					return true
				})
				_, sid := f.hostSession(t, "refusing-"+strconv.FormatBool(tc.refuseAll), h.url, h.token)
				r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sid), "member", map[string]any{"command": "sleep " + marker + tc.sleep})
				wantStatus(t, "exec", r, http.StatusCreated)
				var o outputJSON
				r.decode(t, &o)
				r = f.call(http.MethodDelete, fmt.Sprintf("/sessions/%d", sid), "member", nil)
				wantStatus(t, "close", r, http.StatusOK)
				var closed struct{ State, Reason string }
				r.decode(t, &closed)
				if withoutGrace.Load() == 0 {
					t.Fatalf("%d kills, none without grace: the refusal was not escalated", deletes.Load())
				}
				evs := f.auditEvents(t, "action:session.close")
				var notEnded []any
				for _, e := range evs {
					if e.Target.ID == strconv.FormatInt(sid, 10) {
						notEnded, _ = e.Details["not_ended"].([]any)
					}
				}
				if !tc.refuseAll {
					f.wantClosedByClose(t, sid, o.CommandID)
					if len(notEnded) != 0 || strings.Contains(closed.Reason, "could not be ended") {
						t.Errorf("an ended command is reported as left running: %v, %q", notEnded, closed.Reason)
					}
					return
				}
				if len(notEnded) != 1 || !strings.Contains(fmt.Sprint(notEnded[0]), strconv.FormatInt(o.CommandID, 10)) {
					t.Errorf("session.close lists %v as not ended, want command %d", notEnded, o.CommandID)
				}
				if closed.State != "closed" || !strings.Contains(closed.Reason, "1 command(s) could not be ended") || !strings.Contains(closed.Reason, "#"+strconv.FormatInt(o.CommandID, 10)) {
					t.Errorf("the closed session says %q (%s)", closed.Reason, closed.State)
				}
			})
		}

		t.Run("an unreachable environment does not hold the close", func(t *testing.T) {
			down := startCountingAgentd(t)
			_, sid := f.hostSession(t, "down-host", down.url, down.token)
			r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sid), "member", map[string]any{"command": "sleep 60"})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			// Connections are refused from now on; the command runs on
			// where nobody can reach it.
			down.ts.Listener.Close()
			down.ts.CloseClientConnections()
			started := time.Now()
			wantStatus(t, "close", f.call(http.MethodDelete, fmt.Sprintf("/sessions/%d", sid), "member", nil), http.StatusOK)
			if took := time.Since(started); took > 16*time.Second {
				t.Errorf("the close took %s", took)
			}
			deadline := time.Now().Add(20 * time.Second)
			c := f.commandByID(t, sid, o.CommandID)
			for ; c.State == "running" && time.Now().Before(deadline); c = f.commandByID(t, sid, o.CommandID) {
				time.Sleep(100 * time.Millisecond)
			}
			if c.State != "lost" || !strings.Contains(c.Reason, "session's close while its environment was unreachable") {
				t.Fatalf("the command of the unreachable environment ended %s (%q)", c.State, c.Reason)
			}
			// Its process may run on, on the host: the close says so.
			var notEnded []any
			for _, e := range f.auditEvents(t, "action:session.close") {
				if e.Target.ID == strconv.FormatInt(sid, 10) {
					notEnded, _ = e.Details["not_ended"].([]any)
				}
			}
			if len(notEnded) != 1 || !strings.Contains(fmt.Sprint(notEnded[0]), strconv.FormatInt(o.CommandID, 10)) || !strings.Contains(fmt.Sprint(notEnded[0]), "may still run") {
				t.Errorf("session.close lists %v as not ended, want command %d, which may still run", notEnded, o.CommandID)
			}
		})
	})
}
