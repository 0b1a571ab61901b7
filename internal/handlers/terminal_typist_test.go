package handlers_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// orgDB is acme's database, for reading recordings as stored.
func (f *terminalFixture) orgDB(t *testing.T) *gorm.DB {
	t.Helper()
	ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ten.Release)
	return ten.DB
}

// waitEvents waits until the org's audit log holds events matching q that
// want accepts, and returns them; it fails after 15 s.
func waitEvents(t *testing.T, f *terminalFixture, q string, want func([]audit.Event) bool) []audit.Event {
	t.Helper()
	log := openAudit(t, f.orgFixture)
	deadline := time.Now().Add(15 * time.Second)
	for {
		evs, err := log.Query(context.Background(), mustParse(t, q), 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if want(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit log has no events %q as wanted after 15 s: %+v", q, evs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// typed reads command cid's input as stored and returns what each typist
// typed, by name, in order of first typing.
func typed(t *testing.T, db *gorm.DB, cid int64) (names []string, by map[string]string) {
	t.Helper()
	in, err := recordings.Read(context.Background(), db, cid, recordings.KindIn)
	if err != nil {
		t.Fatal(err)
	}
	by = map[string]string{}
	who := ""
	for _, c := range in {
		switch c.Stream {
		case recordings.StreamTypist:
			var ty recordings.Typist
			if err := json.Unmarshal(c.Data, &ty); err != nil {
				t.Fatal(err)
			}
			who = ty.Name
			if _, ok := by[who]; !ok {
				names = append(names, who)
				by[who] = ""
			}
		case recordings.StreamStdin:
			if who == "" {
				t.Fatalf("stdin chunk %d has no typist before it", c.Seq)
			}
			by[who] += string(c.Data)
		}
	}
	return names, by
}

// TestTerminalTypist: an owner joins a member's running shell in the
// browser terminal and types; the audit log has the attach and the detach,
// the recording says who typed what, and the replay's exports mark where
// the typist changes. An API client typing into someone else's command
// attaches and, once silent, detaches. Issue 22, item 1.
func TestTerminalTypist(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		origin := f.e.srv.URL
		db := f.orgDB(t)

		var cid int64
		var member *websocket.Conn
		screenOf := func(c *websocket.Conn, want string) {
			t.Helper()
			screen := ""
			readUntil(t, c, func(m terminal.ServerMessage) bool {
				if m.Type == "output" {
					screen += string(m.Data)
				}
				return strings.Contains(screen, want)
			})
		}
		t.Run("the member opens a shell and types", func(t *testing.T) {
			var err error
			member, _, err = f.dialTerminal(t, "member", "rows=24&cols=80", origin, wsCSRF)
			if err != nil {
				t.Fatal(err)
			}
			att := readUntil(t, member, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
			cid = att[len(att)-1].CommandID
			sendInput(t, member, terminal.ClientMessage{Type: "input", Data: "echo member-$((1+1))\r"})
			screenOf(member, "member-2\r\n")
		})
		if cid == 0 {
			t.FailNow()
		}
		t.Run("an owner attaches, types, and leaves: attach and detach are audited", func(t *testing.T) {
			owner, _, err := f.dialTerminal(t, "owner", fmt.Sprintf("command=%d&cursor=0", cid), origin, wsCSRF)
			if err != nil {
				t.Fatal(err)
			}
			readUntil(t, owner, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
			evs := waitEvents(t, f, fmt.Sprintf("action:command.attach target:%d", cid), func(evs []audit.Event) bool { return len(evs) == 1 })
			if evs[0].Actor.Name != "owner@acme.test" || !strings.Contains(string(evs[0].Details), `"client":"terminal"`) ||
				!strings.Contains(string(evs[0].Details), `"credential":"login:`) || !strings.Contains(string(evs[0].Details), "member@acme.test") {
				t.Fatalf("attach event %+v %s", evs[0].Actor, evs[0].Details)
			}
			sendInput(t, owner, terminal.ClientMessage{Type: "input", Data: "echo owner-$((2+3))\r"})
			screenOf(owner, "owner-5\r\n")
			if err := owner.Close(websocket.StatusNormalClosure, "bye"); err != nil {
				t.Logf("close: %v", err)
			}
			evs = waitEvents(t, f, fmt.Sprintf("action:command.detach target:%d", cid), func(evs []audit.Event) bool { return len(evs) == 1 })
			if evs[0].Actor.Name != "owner@acme.test" || !strings.Contains(string(evs[0].Details), "the terminal was closed") {
				t.Fatalf("detach event %+v %s", evs[0].Actor, evs[0].Details)
			}
		})
		t.Run("the member types again and ends the shell", func(t *testing.T) {
			sendInput(t, member, terminal.ClientMessage{Type: "input", Data: "exit\r"})
			readUntil(t, member, func(m terminal.ServerMessage) bool { return m.Type == "exit" })
			member.CloseNow()
			waitCommandEnded(t, f, cid)
			// The member's terminal saw the end: no detach, the end says it.
			if evs := waitEvents(t, f, fmt.Sprintf("action:command.detach target:%d", cid), func([]audit.Event) bool { return true }); len(evs) != 1 {
				t.Fatalf("detach events %d, want only the owner's", len(evs))
			}
			// What was typed is in the recording, not the audit log: the
			// shell's own events are its start, the attach and detach, the
			// programs it started, and its end (the terminal's sentence
			// says so).
			for _, ev := range waitEvents(t, f, fmt.Sprintf("target:%d", cid), func([]audit.Event) bool { return true }) {
				if ev.Target.Type != "command" {
					continue
				}
				switch ev.Action {
				// terminal.command: the programs the shell (and its login
				// files) started, from agentd's exec records.
				case "command.exec", "command.attach", "command.detach", "command.resize", "command.end", "terminal.command":
				default:
					t.Errorf("unexpected event %s of the shell", ev.Action)
				}
				if strings.Contains(string(ev.Details), "owner-$((") || strings.Contains(string(ev.Details), "member-$((") {
					t.Errorf("%s holds typed input: %s", ev.Action, ev.Details)
				}
			}
		})
		t.Run("the recording says who typed what", func(t *testing.T) {
			names, by := typed(t, db, cid)
			if strings.Join(names, ",") != "member@acme.test,owner@acme.test" {
				t.Fatalf("typists %v", names)
			}
			if !strings.Contains(by["member@acme.test"], "echo member-") || !strings.Contains(by["member@acme.test"], "exit") ||
				strings.Contains(by["member@acme.test"], "owner-") || !strings.Contains(by["owner@acme.test"], "echo owner-") ||
				strings.Contains(by["owner@acme.test"], "member-") {
				t.Fatalf("typed %q", by)
			}
			// The input chain with its typists verifies against the end event.
			c, err := recordings.Get(context.Background(), db, cid)
			if err != nil {
				t.Fatal(err)
			}
			v, err := recordings.Verify(context.Background(), db, cid, c.OutHash, c.InHash)
			if err != nil || !v.OK || v.InBytes != c.InBytes {
				t.Fatalf("verify %+v %v", v, err)
			}
			// The typist before a moment: the owner's frames are the
			// owner's, the opener before anything was typed.
			first, err := recordings.TypistBefore(context.Background(), db, cid, c.StartedAt)
			if err != nil || first.Name != "member@acme.test" || first.Type != "user" {
				t.Fatalf("typist at the start %+v %v", first, err)
			}
			changes, err := recordings.TypistChanges(context.Background(), db, cid)
			if err != nil || len(changes) != 3 {
				t.Fatalf("changes %+v %v", changes, err)
			}
			atOwner, err := recordings.TypistBefore(context.Background(), db, cid, changes[1].At)
			if err != nil || atOwner.Name != "owner@acme.test" || !strings.HasPrefix(atOwner.Via, "login:") {
				t.Fatalf("typist at the owner's first frame %+v %v", atOwner, err)
			}
		})
		t.Run("the exports mark where the typist changes", func(t *testing.T) {
			r := f.call(http.MethodGet, f.sessionPath("/commands/%d/recording?format=cast", cid), "member", nil)
			wantStatus(t, "cast", r, http.StatusOK)
			var marks []string
			sc := bufio.NewScanner(bytes.NewReader(r.body))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var ev []any
				if json.Unmarshal(sc.Bytes(), &ev) == nil && len(ev) == 3 && ev[1] == "m" {
					marks = append(marks, ev[2].(string))
				}
			}
			if len(marks) != 3 || !strings.HasPrefix(marks[0], "typist: member@acme.test (user ") ||
				!strings.HasPrefix(marks[1], "typist: owner@acme.test (user ") || !strings.HasPrefix(marks[2], "typist: member@acme.test") {
				t.Fatalf("cast markers %q", marks)
			}
			r = f.call(http.MethodGet, f.sessionPath("/commands/%d/recording?format=json", cid), "member", nil)
			wantStatus(t, "json", r, http.StatusOK)
			var doc struct {
				Events []struct {
					T      float64 `json:"t"`
					Stream string  `json:"stream"`
					Typist *struct{ Type, ID, Name, Via string }
				} `json:"events"`
			}
			r.decode(t, &doc)
			var who []string
			last := 0.0
			for _, ev := range doc.Events {
				if ev.T < last {
					t.Fatalf("events out of time order at %v", ev.T)
				}
				last = ev.T
				if ev.Stream == "typist" {
					who = append(who, ev.Typist.Name)
				}
			}
			if strings.Join(who, ",") != "member@acme.test,owner@acme.test,member@acme.test" {
				t.Fatalf("json typist events %v", who)
			}
			if bytes.Contains(r.body, []byte("echo owner-")) {
				t.Fatal("the export holds typed input")
			}
		})
		t.Run("an API client typing into someone else's command attaches, and detaches once silent", func(t *testing.T) {
			f.e.c.Gateway.SetAttachIdle(300 * time.Millisecond)
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "cat", "stdin": true})
			wantStatus(t, "exec cat", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			r = f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "member", map[string]any{"text": "mine\n"})
			wantStatus(t, "member types", r, http.StatusNoContent)
			r = f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "admin", map[string]any{"text": "admin-line\n"})
			wantStatus(t, "admin types", r, http.StatusNoContent)
			evs := waitEvents(t, f, fmt.Sprintf("target:%d", o.CommandID), func(evs []audit.Event) bool {
				n := 0
				for _, ev := range evs {
					if ev.Action == "command.detach" {
						n++
					}
				}
				return n == 1
			})
			var actions []string
			for i := len(evs) - 1; i >= 0; i-- {
				if evs[i].Target.Type == "command" {
					actions = append(actions, evs[i].Action+" "+evs[i].Actor.Name)
				}
			}
			want := "command.exec member@acme.test,command.attach admin@acme.test,command.detach admin@acme.test"
			if strings.Join(actions, ",") != want {
				t.Fatalf("events %v, want %s", actions, want)
			}
			if !strings.Contains(string(evs[0].Details), `"client":"api"`) || !strings.Contains(string(evs[0].Details), "nothing typed for") {
				t.Fatalf("detach details %s", evs[0].Details)
			}
			_, by := typed(t, db, o.CommandID)
			if by["member@acme.test"] != "mine\n" || by["admin@acme.test"] != "admin-line\n" {
				t.Fatalf("typed %q", by)
			}
			wantStatus(t, "kill", f.call(http.MethodDelete, f.sessionPath("/commands/%d", o.CommandID), "member", nil), http.StatusOK)
		})
	})
}

// TestExecEnvPolicy: env values are part of the command: the agent's
// command policy refuses a matching value, naming the variable, and the
// exec event records each value's SHA-256 beside its name, never the
// value. Issue 22, item 5.
func TestExecEnvPolicy(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d) // the agent's policy refuses ^rm -rf /
		before := f.agentd.requests.Load()
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": `eval "$X"`, "env": map[string]string{"X": "rm -rf /"}})
		wantStatus(t, "exec with a refused env value", r, http.StatusForbidden)
		if !strings.Contains(string(r.body), "env variable X") || !strings.Contains(string(r.body), "^rm -rf /") {
			t.Fatalf("refusal %s", r.body)
		}
		if n := f.agentd.requests.Load(); n != before {
			t.Fatalf("agentd got %d requests for a refused exec", n-before)
		}
		denials := f.auditEvents(t, "action:authz.deny")
		found := false
		for _, e := range denials {
			found = found || strings.Contains(fmt.Sprint(e.Details), "env variable X")
		}
		if !found {
			t.Fatalf("no authz.deny naming the variable: %+v", denials)
		}

		secret := "s3cret-value-" + randomHex(8)
		r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": `test -n "$TOKEN" && echo ok`,
			"env": map[string]string{"TOKEN": secret, "MODE": "fast"}, "wait_ms": 5000})
		wantStatus(t, "exec with env", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		evs := f.auditEvents(t, fmt.Sprintf("action:command.exec target:%d", o.CommandID))
		if len(evs) != 1 {
			t.Fatalf("exec events %+v", evs)
		}
		sum := sha256.Sum256([]byte(secret))
		hashes, _ := evs[0].Details["env_sha256"].(map[string]any)
		if hashes["TOKEN"] != hex.EncodeToString(sum[:]) || len(hashes) != 2 {
			t.Fatalf("env hashes %v", evs[0].Details)
		}
		all := f.call(http.MethodGet, "/audit/export?format=jsonl", "admin", nil)
		if bytes.Contains(all.body, []byte(secret)) {
			t.Fatal("the audit log holds an env value")
		}
	})
}

// TestLiveRecordingSearch: a word an open shell printed is found by
// recording search while the shell still runs, on SQLite and Postgres,
// with the hit linking to its moment. Issue 22, item 4.
func TestLiveRecordingSearch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		c, _, err := f.dialTerminal(t, "member", "rows=24&cols=80", f.e.srv.URL, wsCSRF)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		att := readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
		cid := att[len(att)-1].CommandID
		// The word is printed, not typed: the command line holds
		// "zebrafinch$((40+2))", the output "zebrafinch42".
		sendInput(t, c, terminal.ClientMessage{Type: "input", Data: "echo zebrafinch$((40+2))\r"})
		screen := ""
		readUntil(t, c, func(m terminal.ServerMessage) bool {
			if m.Type == "output" {
				screen += string(m.Data)
			}
			return strings.Contains(screen, "zebrafinch42\r\n")
		})
		type hit struct {
			ID        int64   `json:"id"`
			State     string  `json:"state"`
			At        float64 `json:"at"`
			Snippet   string  `json:"snippet"`
			ReplayURL string  `json:"replay_url"`
		}
		var found []hit
		deadline := time.Now().Add(20 * time.Second)
		for len(found) == 0 {
			r := f.call(http.MethodGet, "/recordings?q=zebrafinch42", "auditor", nil)
			wantStatus(t, "search", r, http.StatusOK)
			var page struct{ Items []hit }
			r.decode(t, &page)
			found = page.Items
			if len(found) == 0 && time.Now().After(deadline) {
				t.Fatal("the word the open shell printed is not found after 20 s")
			}
			if len(found) == 0 {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if len(found) != 1 || found[0].ID != cid || found[0].State != "running" || !strings.Contains(found[0].Snippet, "zebrafinch42") ||
			!strings.Contains(found[0].ReplayURL, fmt.Sprintf("/commands/%d/replay?t=", cid)) {
			t.Fatalf("hits %+v", found)
		}
		// The shell is still open: the hit came from the live index.
		r := f.call(http.MethodGet, f.sessionPath("/commands?state=running"), "member", nil)
		if !bytes.Contains(r.body, []byte(fmt.Sprintf(`"id":%d`, cid))) {
			t.Fatalf("the shell is no longer running: %s", r.body)
		}
		sendInput(t, c, terminal.ClientMessage{Type: "input", Data: "exit\r"})
		readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "exit" })
	})
}

// TestTerminalPromise: the terminal's sentence says what is recorded and
// audited, each claim proven by a test of this file (who typed:
// TestTerminalTypist; joining and leaving: TestTerminalTypist; searchable
// within seconds: TestLiveRecordingSearch; not each command in the audit
// log: TestTerminalTypist finds only command.* events of the shell), and
// its link leads to the section of the served docs that says the rest.
func TestTerminalPromise(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	page := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d", f.session),
		cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}})
	wantStatus(t, "session page", page, http.StatusOK)
	for _, claim := range []string{"recorded with who typed it before the shell gets it", "joining or leaving it, and each program the shell starts",
		"searchable within seconds", "Builtins such as cd, and what those programs start in turn, are in the recording only",
		`href="/docs/sessions#in-the-terminal-what-is-recorded-and-audited"`} {
		if !strings.Contains(string(page.body), claim) {
			t.Errorf("the terminal's sentence lacks %q", claim)
		}
	}
	if strings.Contains(string(page.body), "Every keystroke and command is authorized, recorded and audited") {
		t.Error("the terminal still claims every command is audited")
	}
	// Since agentd reports what a shell runs (TestTerminalCommandsAudited
	// proves the terminal.command events), saying they are not audited
	// would be false.
	if strings.Contains(string(page.body), "not each in the audit log") {
		t.Error("the terminal says the programs run in it are not audited")
	}
	doc := f.e.do(request{method: http.MethodGet, path: "/docs/sessions"})
	wantStatus(t, "sessions doc", doc, http.StatusOK)
	if !strings.Contains(string(doc.body), `id="in-the-terminal-what-is-recorded-and-audited"`) || !strings.Contains(string(doc.body), "command.attach") {
		t.Fatal("the linked section is missing from the served docs")
	}
}
