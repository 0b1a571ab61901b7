package handlers_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// flakyHostSession is a session on a host whose agentd the test reaches
// through a loopback forwarder it can cut (live connections closed, new
// ones refused) and restore: the network between the console and agentd.
func flakyHostSession(t *testing.T, f *terminalFixture, name string) *dbCutter {
	t.Helper()
	cut, url := newDBCutter(t, f.agentd.url)
	_, f.session = f.hostSession(t, name, url, f.agentd.token)
	return cut
}

type sessionFacts struct {
	State            string
	Reason           string
	UnreachableSince *time.Time `json:"unreachable_since"`
}

func (f *terminalFixture) sessionFacts(t *testing.T) sessionFacts {
	t.Helper()
	r := f.call(http.MethodGet, f.sessionPath(""), "member", nil)
	wantStatus(t, "read the session", r, http.StatusOK)
	var s sessionFacts
	r.decode(t, &s)
	return s
}

// TestTerminalNetworkFaults: interruptions between the console and agentd
// shorter than the unreachable window leave the session and its command
// running, and the recording resumes from its cursor and ends complete; an
// interruption longer than the window makes the session lost. On SQLite
// and Postgres, against a real agentd running the command.
func TestTerminalNetworkFaults(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		t.Run("two 3-second interruptions during a command", func(t *testing.T) {
			t.Parallel()
			f := newTerminalFixture(t, d) // the default window: 60 s
			cut := flakyHostSession(t, f, "flaky-host")
			const lines = 100
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
				"command": fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.1; done", lines)})
			wantStatus(t, "exec the counter", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			for i := range 2 {
				time.Sleep(time.Second)
				cut.Cut()
				// Operations meanwhile answer 502 and leave the session
				// running; the page says since when it is unreachable.
				r := f.call(http.MethodPost, f.sessionPath("/files/stat"), "member", map[string]any{"paths": []string{"x"}})
				wantStatus(t, "stat during the interruption", r, http.StatusBadGateway)
				s := f.sessionFacts(t)
				if s.State != "running" || s.UnreachableSince == nil {
					t.Fatalf("interruption %d: session %+v, want running and unreachable since a time", i+1, s)
				}
				page := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d", f.session),
					cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}})
				if !strings.Contains(string(page.body), "environment unreachable since") {
					t.Errorf("interruption %d: the session page does not say the environment is unreachable", i+1)
				}
				time.Sleep(3 * time.Second)
				cut.Restore()
			}
			end := waitCommandEndedWithin(t, f, o.CommandID, 60*time.Second)
			if end.State != "exited" || end.ExitCode == nil || *end.ExitCode != 0 {
				t.Fatalf("the counter ended %+v, want exited 0", end)
			}
			out := map[string]*bytes.Buffer{}
			f.drain(t, "member", o.CommandID, 0, out)
			wantCounter(t, out["stdout"].String(), lines)
			s := f.sessionFacts(t)
			if s.State != "running" || s.UnreachableSince != nil {
				t.Fatalf("after the interruptions: session %+v, want running and reachable", s)
			}
		})

		t.Run("an interruption longer than the window", func(t *testing.T) {
			t.Parallel()
			f := newTerminalFixture(t, d)
			const window = 2 * time.Second
			f.e.c.SessionsRT.UnreachableWindow = window
			cut := flakyHostSession(t, f, "gone-host")
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo before; sleep 60"})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			waitRecorded(t, f, o.CommandID, "before\n")
			cut.Cut()
			start := time.Now()
			for {
				r := f.call(http.MethodPost, f.sessionPath("/files/stat"), "member", map[string]any{"paths": []string{"x"}})
				if r.status == http.StatusConflict {
					if code := r.envelope(t).Error.Code; code != "session_lost" {
						t.Fatalf("past the window: code %q, want session_lost", code)
					}
					break
				}
				wantStatus(t, "stat while agentd is cut off", r, http.StatusBadGateway)
				if time.Since(start) > 60*time.Second {
					t.Fatal("the session was not lost a minute into a cut longer than its window")
				}
				time.Sleep(200 * time.Millisecond)
			}
			if lost := time.Since(start); lost < window {
				t.Fatalf("the session was lost %s into the cut, inside its %s window", lost, window)
			}
			s := f.sessionFacts(t)
			if s.State != "lost" || !strings.Contains(s.Reason, "did not answer for 2s") {
				t.Fatalf("session %+v, want lost saying for how long agentd did not answer", s)
			}
			end := waitCommandEndedWithin(t, f, o.CommandID, 30*time.Second)
			if end.State != "lost" {
				t.Fatalf("the command ended %+v, want lost", end)
			}
		})

		t.Run("a create that got no answer is sent again, not declared lost", func(t *testing.T) {
			t.Parallel()
			f := newTerminalFixture(t, d)
			cut := flakyHostSession(t, f, "late-host")
			// The session's workspace exists (first use), then agentd is
			// cut off: only the command's create meets the cut.
			wantStatus(t, "first use", f.call(http.MethodPost, f.sessionPath("/commands"), "member",
				map[string]any{"command": "true", "wait_ms": 5000}), http.StatusCreated)
			cut.Cut()
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo started-late"})
			wantStatus(t, "exec with agentd cut off", r, http.StatusBadGateway)
			if msg := r.envelope(t).Error.Message; !strings.Contains(msg, "may still start") {
				t.Errorf("the 502 does not say the command may still start: %q", msg)
			}
			var id int64
			r = f.call(http.MethodGet, f.sessionPath("/commands"), "member", nil)
			var h struct{ Items []commandHistory }
			r.decode(t, &h)
			if len(h.Items) != 2 || h.Items[0].State != "running" {
				t.Fatalf("commands after the unanswered exec: %+v", h.Items)
			}
			id = h.Items[0].ID
			// A reader meets agentd not knowing the command: before the fix
			// its follower ended the command lost right there.
			time.Sleep(500 * time.Millisecond)
			cut.Restore()
			end := waitCommandEndedWithin(t, f, id, 30*time.Second)
			if end.State != "exited" {
				t.Fatalf("the command ended %+v, want exited (its create sent again)", end)
			}
			out := map[string]*bytes.Buffer{}
			f.drain(t, "member", id, 0, out)
			if out["stdout"] == nil || out["stdout"].String() != "started-late\n" {
				t.Fatalf("recording %v, want started-late", out)
			}
		})
	})
}

// waitRecorded waits until the command's stored output starts with want.
func waitRecorded(t *testing.T, f *terminalFixture, cid int64, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r := f.call(http.MethodGet, f.sessionPath("/commands"), "member", nil)
		var h struct{ Items []commandHistory }
		r.decode(t, &h)
		for _, c := range h.Items {
			if c.ID == cid && c.Output >= int64(len(want)) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("command %d: %q was not recorded", cid, want)
}

// waitCommandEndedWithin is waitCommandEnded with a longer bound, for
// commands that outlast network faults.
func waitCommandEndedWithin(t *testing.T, f *terminalFixture, cid int64, d time.Duration) commandHistory {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		r := f.call(http.MethodGet, f.sessionPath("/commands?limit=200"), "member", nil)
		var h struct{ Items []commandHistory }
		r.decode(t, &h)
		for _, c := range h.Items {
			if c.ID == cid && c.State != "running" {
				return c
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("command %d was not recorded as ended within %s", cid, d)
	return commandHistory{}
}

// TestExecDuringCloseIsRefused: from the moment a session's close began no
// command starts in it, so nothing started during the close (while it waits
// for a TERM-ignoring command's kill grace) outlives the session. On SQLite
// and Postgres, against a real agentd.
func TestExecDuringCloseIsRefused(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "trap '' TERM; sleep 100 & wait"})
		wantStatus(t, "exec a command that ignores SIGTERM", r, http.StatusCreated)
		marker := fmt.Sprintf("sleep 98%04d", time.Now().UnixNano()%10000)
		closed := make(chan response, 1)
		// (f.e.json, not f.call: call's body log is not for two goroutines.)
		go func() {
			closed <- f.e.json(http.MethodDelete, "/api/v1/orgs/acme"+f.sessionPath(""), f.tokens["member"], nil)
		}()
		// The close now waits out agentd's kill grace; an exec meanwhile
		// must be refused, however it races the close's first step.
		var refused response
		for deadline := time.Now().Add(30 * time.Second); ; {
			refused = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": marker})
			if refused.status == http.StatusConflict {
				break
			}
			if refused.status != http.StatusCreated || time.Now().After(deadline) {
				t.Fatalf("exec during the close: %d %s", refused.status, refused.body)
			}
			// Started before the close began: the close must end it too.
			time.Sleep(20 * time.Millisecond)
		}
		if code := refused.envelope(t).Error.Code; code != "session_closing" && code != "session_closed" {
			t.Fatalf("exec during the close: code %q, want session_closing", code)
		}
		wantStatus(t, "close", <-closed, http.StatusOK)
		// Killed by the close: gone as soon as the kernel has reaped it
		// (a loaded machine may take a moment; a survivor stays).
		for deadline := time.Now().Add(10 * time.Second); processWith(t, marker); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%q outlived the session's close", marker)
			}
		}
	})
}
