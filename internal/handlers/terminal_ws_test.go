package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

const wsCSRF = "ws-test-csrf-token-0123456789"

// ansiEscape matches the terminal control sequences a shell prints
// (bracketed paste, colours, the terminal shell's OSC 133 marks), which a
// person does not see as text.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)`)

// dialTerminal opens the browser terminal's WebSocket as a browser would:
// the sign-in cookie, the CSRF cookie, the CSRF token as a subprotocol and
// the console's origin.
func (f *terminalFixture) dialTerminal(t *testing.T, who, query, origin, csrf string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	u := strings.Replace(f.e.srv.URL, "http://", "ws://", 1) + fmt.Sprintf("/o/acme/sessions/%d/terminal?%s", f.session, query)
	h := http.Header{}
	h.Add("Cookie", "gh_org_acme="+f.tokens[who])
	h.Add("Cookie", "gh_csrf="+wsCSRF)
	if origin != "" {
		h.Set("Origin", origin)
	}
	protos := []string{"gatehouse.v1"}
	if csrf != "" {
		protos = append(protos, "csrf."+csrf)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h, Subprotocols: protos})
}

// readUntil reads server messages until cond says stop, or fails after
// 20 s.
func readUntil(t *testing.T, c *websocket.Conn, cond func(terminal.ServerMessage) bool) []terminal.ServerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []terminal.ServerMessage
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read after %d messages: %v", len(got), err)
		}
		var m terminal.ServerMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
		if cond(m) {
			return got
		}
	}
}

func sendInput(t *testing.T, c *websocket.Conn, msg terminal.ClientMessage) {
	t.Helper()
	b, _ := json.Marshal(msg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// TestTerminalWebSocket walks the browser terminal's protocol: handshake
// rules, typing, a dropped connection continued from the cursor, and a
// read-only watcher.
func TestTerminalWebSocket(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	origin := f.e.srv.URL

	t.Run("a foreign origin is refused", func(t *testing.T) {
		_, resp, err := f.dialTerminal(t, "member", "", "https://evil.example", wsCSRF)
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("cross-site handshake: %v %v", resp, err)
		}
	})
	t.Run("a handshake without the CSRF token is refused", func(t *testing.T) {
		_, resp, err := f.dialTerminal(t, "member", "", origin, "")
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("handshake without csrf: %v %v", resp, err)
		}
	})

	var cid int64
	var cursor uint64
	t.Run("type a command and see its output", func(t *testing.T) {
		c, _, err := f.dialTerminal(t, "member", "rows=24&cols=80", origin, wsCSRF)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		att := readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
		cid = att[len(att)-1].CommandID
		sendInput(t, c, terminal.ClientMessage{Type: "input", Data: "echo h''i\r"})
		screen := ""
		readUntil(t, c, func(m terminal.ServerMessage) bool {
			if m.Type == "output" {
				screen += string(m.Data)
				cursor = m.ID
			}
			return strings.Contains(screen, "hi\r\n")
		})
	})

	t.Run("a dropped connection continues from its cursor", func(t *testing.T) {
		c, _, err := f.dialTerminal(t, "member", fmt.Sprintf("command=%d&cursor=%d", cid, cursor), origin, wsCSRF)
		if err != nil {
			t.Fatal(err)
		}
		readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
		sendInput(t, c, terminal.ClientMessage{Type: "input", Data: "seq 1 2000; echo done-$((40+2))\r"})
		var got strings.Builder
		seen := map[uint64]bool{}
		collect := func(m terminal.ServerMessage) {
			if m.Type != "output" {
				return
			}
			if seen[m.ID] || m.ID <= cursor {
				t.Fatalf("chunk %d delivered twice", m.ID)
			}
			seen[m.ID] = true
			got.Write(m.Data)
			cursor = m.ID
		}
		readUntil(t, c, func(m terminal.ServerMessage) bool { collect(m); return strings.Contains(got.String(), "\n1000\r\n") })
		// Dropped without a close handshake, as a lost network does.
		_ = c.CloseNow()
		c, _, err = f.dialTerminal(t, "member", fmt.Sprintf("command=%d&cursor=%d", cid, cursor), origin, wsCSRF)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		readUntil(t, c, func(m terminal.ServerMessage) bool { collect(m); return strings.Contains(got.String(), "done-42") })
		plain := ansiEscape.ReplaceAllString(got.String(), "")
		lines := strings.Split(strings.ReplaceAll(plain, "\r\n", "\n"), "\n")
		count := map[string]int{}
		for _, l := range lines {
			count[strings.Trim(l, "\r")]++
		}
		for i := 1; i <= 2000; i++ {
			if n := count[fmt.Sprint(i)]; n != 1 {
				t.Fatalf("line %d seen %d times", i, n)
			}
		}
	})

	t.Run("an auditor watches read-only", func(t *testing.T) {
		w, _, err := f.dialTerminal(t, "auditor", fmt.Sprintf("command=%d&watch=1", cid), origin, wsCSRF)
		if err != nil {
			t.Fatal(err)
		}
		defer w.CloseNow()
		att := readUntil(t, w, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
		if !att[len(att)-1].ReadOnly {
			t.Fatal("the watch is not read-only")
		}
		var screen strings.Builder
		readUntil(t, w, func(m terminal.ServerMessage) bool {
			screen.Write(m.Data)
			return strings.Contains(screen.String(), "done-42")
		})
		sendInput(t, w, terminal.ClientMessage{Type: "input", Data: "touch /tmp/auditor-was-here\r"})
		time.Sleep(300 * time.Millisecond)
		// The watcher's long-poll may reach agentd; a stdin may not.
		evs, err := openAudit(t, f.orgFixture).Query(context.Background(), mustParse(t, "action:command.watch"), 0, 10)
		if err != nil || len(evs) == 0 {
			t.Fatalf("watching was not audited: %v", err)
		}
		r := f.call(http.MethodGet, f.sessionPath("/commands?limit=200"), "member", nil)
		var h struct{ Items []commandHistory }
		r.decode(t, &h)
		found := false
		for _, c := range h.Items {
			if c.ID != cid {
				continue
			}
			found = true
			if c.InputBytes != int64(len("echo h''i\r")+len("seq 1 2000; echo done-$((40+2))\r")) {
				t.Fatalf("the watcher's keystrokes reached the command: %d input bytes", c.InputBytes)
			}
		}
		if !found {
			t.Fatalf("command %d is not in the session's history (%d %.200s)", cid, r.status, r.body)
		}
	})
}

// TestTerminalPollOfDeletedOrg: a long-poll waiting on a command's output
// when its org is deleted ends at once and answers with the deletion, not
// with a suspension (the revocation's own cause reaches the caller).
func TestTerminalPollOfDeletedOrg(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "sleep 60"})
	wantStatus(t, "exec", r, http.StatusCreated)
	var o outputJSON
	r.decode(t, &o)
	before := len(f.agentd.callsSince(0))
	answered := make(chan response, 1)
	started := time.Now()
	go func() {
		answered <- f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=30000", o.CommandID, o.NextCursor), "member", nil)
	}()
	// Wait until the poll waits: on the follower's window of the output
	// (a followed command's polls never reach agentd), or at agentd when
	// the command is not followed here. It holds the org then.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if f.e.c.Gateway.Followers.LiveWindow().Waiting > 0 ||
			slices.ContainsFunc(f.agentd.callsSince(before), func(c string) bool { return strings.HasPrefix(c, "GET ") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long-poll never began waiting")
		}
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := f.e.c.Orgs.Delete(context.Background(), "acme", "acme"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-answered:
		if time.Since(started) > 20*time.Second {
			t.Fatalf("the poll ran out its wait instead of ending at the deletion")
		}
		wantStatus(t, "poll of a deleted org", r, http.StatusNotFound)
		if env := r.envelope(t); env.Error.Code != "org_deleted" {
			t.Fatalf("the poll of a deleted org answered %q: %s", env.Error.Code, env.Error.Message)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("the waiting poll was not answered after the org's deletion")
	}
}

// TestTerminalWatchOfClosedSession: the watch page of a command of a
// closed session renders (recordings outlive sessions), and so its
// terminal must work too: it replays the command from its recording and
// ends, rather than failing on the closed session.
func TestTerminalWatchOfClosedSession(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo watched-$((40+2))", "wait_ms": 5000})
	wantStatus(t, "exec", r, http.StatusCreated)
	var o outputJSON
	r.decode(t, &o)
	waitCommandEnded(t, f, o.CommandID)
	wantStatus(t, "close the session", f.call(http.MethodDelete, fmt.Sprintf("/sessions/%d", f.session), "member", nil), http.StatusOK)
	page := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d/commands/%d/watch", f.session, o.CommandID),
		cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["auditor"]}}})
	wantStatus(t, "watch page of a closed session's command", page, http.StatusOK)
	for _, who := range []string{"auditor", "member"} {
		w, _, err := f.dialTerminal(t, who, fmt.Sprintf("command=%d&watch=1", o.CommandID), f.e.srv.URL, wsCSRF)
		if err != nil {
			t.Fatal(err)
		}
		var screen strings.Builder
		msgs := readUntil(t, w, func(m terminal.ServerMessage) bool {
			if m.Type == "error" {
				t.Fatalf("%s's watch of a closed session's command failed: %s", who, m.Message)
			}
			screen.Write(m.Data)
			return m.Type == "exit"
		})
		if msgs[0].Type != "attached" || !msgs[0].ReadOnly || msgs[0].CommandID != o.CommandID {
			t.Fatalf("%s's watch began with %+v", who, msgs[0])
		}
		if !strings.Contains(screen.String(), "watched-42") {
			t.Fatalf("%s's watch replayed %q, not the command's output", who, screen.String())
		}
		if end := msgs[len(msgs)-1]; end.State != "exited" || end.ExitCode == nil || *end.ExitCode != 0 {
			t.Fatalf("%s's watch ended with %+v", who, end)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _, err = w.Read(ctx)
		cancel()
		if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Fatalf("after the replay the watch closed with %v, want a normal closure", err)
		}
		w.CloseNow()
	}
}
