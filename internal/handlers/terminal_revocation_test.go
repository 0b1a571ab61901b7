package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// dialTerminalAs opens the terminal's WebSocket as a browser with the
// sign-in cookie tok, or (key true) as an agent runtime with tok as its
// bearer API key.
func (f *terminalFixture) dialTerminalAs(t *testing.T, tok string, key bool) *websocket.Conn {
	t.Helper()
	u := strings.Replace(f.e.srv.URL, "http://", "ws://", 1) + fmt.Sprintf("/o/acme/sessions/%d/terminal?rows=24&cols=80", f.session)
	h := http.Header{}
	protos := []string{"gatehouse.v1"}
	if key {
		h.Set("Authorization", "Bearer "+tok)
	} else {
		h.Add("Cookie", "gh_org_acme="+tok)
		h.Add("Cookie", "gh_csrf="+wsCSRF)
		h.Set("Origin", f.e.srv.URL)
		protos = append(protos, "csrf."+wsCSRF)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h, Subprotocols: protos})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

// typeAndSee types line into the terminal and waits for want on screen.
func typeAndSee(t *testing.T, c *websocket.Conn, line, want string) {
	t.Helper()
	sendInput(t, c, terminal.ClientMessage{Type: "input", Data: line})
	screen := ""
	readUntil(t, c, func(m terminal.ServerMessage) bool {
		screen += string(m.Data)
		return strings.Contains(screen, want)
	})
}

// closedWith reads until the terminal ends and returns the error message it
// sent and the close reason.
func closedWith(t *testing.T, c *websocket.Conn) (msg, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return msg, ce.Reason
			}
			t.Fatalf("the terminal did not close: %v", err)
		}
		var m terminal.ServerMessage
		if json.Unmarshal(b, &m) == nil && m.Type == "error" {
			msg = m.Message
		}
	}
}

// TestTerminalRevocation: an open browser terminal obeys revocation at
// once. After a logout, after the user is disabled and after the API key is
// revoked, the terminal closes with a message naming the cause — without a
// keystroke, and a keystroke typed after the revocation runs nothing. On
// SQLite and Postgres, against a real agentd.
func TestTerminalRevocation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		admin := f.tokens["admin"]
		// An API key gets a shell only from an agent whose rules refuse
		// nothing (TestAPIKeyShellIsDecided): this agent's pattern goes.
		wantStatus(t, "drop the agent's pattern", f.e.json(http.MethodPatch, fmt.Sprintf("/api/v1/orgs/acme/agents/%d", f.agentID),
			f.tokens["entered-admin"], map[string]any{"command_policy": []string{}}), http.StatusOK)
		for _, tc := range []struct {
			name    string
			key     bool
			revoke  func(t *testing.T, tok string)
			wantMsg string
		}{
			{"the API key is revoked", true, func(t *testing.T, tok string) {
				var keys struct {
					Items []struct {
						ID     int64
						Prefix string
					}
				}
				r := f.call(http.MethodGet, "/api-keys", "member", nil)
				r.decode(t, &keys)
				for _, k := range keys.Items {
					if strings.HasPrefix(tok, "gh_"+k.Prefix) {
						wantStatus(t, "revoke the key", f.call(http.MethodDelete, fmt.Sprintf("/api-keys/%d", k.ID), "member", nil), http.StatusNoContent)
						return
					}
				}
				t.Fatal("the member's key is not listed")
			}, "API key"},
			{"the member's role is removed", false, func(t *testing.T, _ string) {
				r := f.e.json(http.MethodDelete, "/api/v1/orgs/acme/roles", admin, rbac.Assignment{
					Subject: fmt.Sprintf("user:%d", f.ids["member"]), Role: rbac.RoleMember, Domain: rbac.DeptDomain(f.dept1)})
				wantStatus(t, "remove the member's role", r, http.StatusNoContent)
				t.Cleanup(func() {
					r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/roles", admin, rbac.Assignment{
						Subject: fmt.Sprintf("user:%d", f.ids["member"]), Role: rbac.RoleMember, Domain: rbac.DeptDomain(f.dept1)})
					wantStatus(t, "give the role back", r, http.StatusNoContent)
				})
			}, "access to this terminal was removed"},
			{"the person signs out", false, func(t *testing.T, tok string) {
				wantStatus(t, "logout", f.e.json(http.MethodPost, "/api/v1/orgs/acme/auth/logout", tok, nil), http.StatusNoContent)
				wantStatus(t, "me after logout", f.e.json(http.MethodGet, "/api/v1/orgs/acme/me", tok, nil), http.StatusUnauthorized)
			}, "signed out"},
			{"an admin disables the user", false, func(t *testing.T, _ string) {
				r := f.e.json(http.MethodPatch, fmt.Sprintf("/api/v1/orgs/acme/users/%d", f.ids["member"]), admin, map[string]any{"status": "disabled"})
				wantStatus(t, "disable the member", r, http.StatusOK)
			}, "access was removed"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tok := f.keys["member-key"]
				if !tc.key {
					tok = f.e.orgLogin("acme", "member@acme.test", userPassword)
				}
				c := f.dialTerminalAs(t, tok, tc.key)
				att := readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
				typeAndSee(t, c, "echo before-$((6*7))\r", "before-42")
				tc.revoke(t, tok)
				marker := "after-" + randomHex(6)
				// Typed right after the revocation: refused, never run.
				sendInputQuiet(c, terminal.ClientMessage{Type: "input", Data: "touch " + marker + "\r"})
				msg, reason := closedWith(t, c)
				if !strings.Contains(msg, tc.wantMsg) || !strings.Contains(reason, tc.wantMsg) {
					t.Fatalf("closed with message %q, reason %q; want them to say %q", msg, reason, tc.wantMsg)
				}
				time.Sleep(300 * time.Millisecond)
				if f.agentdHasFile(t, marker) {
					t.Fatalf("a keystroke typed after the revocation ran (%s exists)", marker)
				}
				// The shell still runs: its terminal's leaving is audited, saying why.
				waitEvents(t, f, fmt.Sprintf("action:command.detach target:%d", att[len(att)-1].CommandID), func(evs []audit.Event) bool {
					return len(evs) == 1 && strings.Contains(string(evs[0].Details), tc.wantMsg)
				})
			})
		}

		t.Run("an idle terminal closes without a keystroke", func(t *testing.T) {
			r := f.e.json(http.MethodPatch, fmt.Sprintf("/api/v1/orgs/acme/users/%d", f.ids["member"]), admin, map[string]any{"status": "active"})
			wantStatus(t, "enable the member again", r, http.StatusOK)
			tok := f.e.orgLogin("acme", "member@acme.test", userPassword)
			c := f.dialTerminalAs(t, tok, false)
			readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
			wantStatus(t, "logout", f.e.json(http.MethodPost, "/api/v1/orgs/acme/auth/logout", tok, nil), http.StatusNoContent)
			if msg, _ := closedWith(t, c); !strings.Contains(msg, "signed out") {
				t.Fatalf("an idle terminal closed with %q, want it to say signed out", msg)
			}
		})
	})
}

// TestTerminalHandshakeRefusalsAudited: a refused terminal handshake (a
// foreign Origin, no CSRF token) is in the audit log as terminal.refused,
// written when it happens.
func TestTerminalHandshakeRefusalsAudited(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		if _, resp, err := f.dialTerminal(t, "member", "", "https://evil.example", wsCSRF); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("cross-site handshake: %v %v", resp, err)
		}
		if _, resp, err := f.dialTerminal(t, "member", "", f.e.srv.URL, ""); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("handshake without csrf: %v %v", resp, err)
		}
		ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		defer ten.Release()
		var rows []struct {
			Decision string
			Details  string
		}
		if err := ten.DB.Table(audit.OrgTable).Where("action = ?", "terminal.refused").Order("seq").Find(&rows).Error; err != nil {
			t.Fatal(err)
		}
		if len(rows) != 2 || rows[0].Decision != audit.Deny || !strings.Contains(rows[0].Details, "evil.example") ||
			!strings.Contains(rows[1].Details, "CSRF") {
			t.Fatalf("terminal.refused records: %+v, want the foreign origin and the missing CSRF token", rows)
		}
	})
}

// sendInputQuiet writes a message and ignores a closed connection: the
// console may have closed it already.
func sendInputQuiet(c *websocket.Conn, msg terminal.ClientMessage) {
	b, _ := json.Marshal(msg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Write(ctx, websocket.MessageText, b)
}

// agentdHasFile reports whether name exists in the session's workspace,
// asking agentd directly.
func (f *terminalFixture) agentdHasFile(t *testing.T, name string) bool {
	t.Helper()
	var ws string
	r := f.call(http.MethodGet, f.sessionPath(""), "admin", nil)
	var s struct{ Workspace string }
	r.decode(t, &s)
	ws = s.Workspace
	res, err := agentd.NewClient(f.agentd.url, f.agentd.token, nil).Stat(context.Background(), ws+"/"+name)
	if err != nil {
		t.Fatal(err)
	}
	return len(res) == 1 && res[0].Exists
}

// TestLongPollEndsOnRevocation: an API long-poll waiting for output ends
// as soon as its API key is revoked, answering 401 credential_revoked with
// the cause, not when its wait runs out. On SQLite and Postgres.
func TestLongPollEndsOnRevocation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": "sleep 60"})
		wantStatus(t, "exec", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		// A long-poll that ran its wait out would answer 200 with no
		// output: the 401 says the revocation ended it.
		polled := make(chan response, 1)
		go func() {
			polled <- f.e.json(http.MethodGet, "/api/v1/orgs/acme"+f.sessionPath("/commands/%d/output?cursor=0&wait_ms=30000", o.CommandID),
				f.keys["member-key"], nil)
		}()
		time.Sleep(500 * time.Millisecond)
		var keys struct {
			Items []struct {
				ID     int64
				Prefix string
			}
		}
		f.e.json(http.MethodGet, "/api/v1/orgs/acme/api-keys", f.tokens["member"], nil).decode(t, &keys)
		revoked := false
		for _, k := range keys.Items {
			if strings.HasPrefix(f.keys["member-key"], "gh_"+k.Prefix) {
				r := f.e.json(http.MethodDelete, fmt.Sprintf("/api/v1/orgs/acme/api-keys/%d", k.ID), f.tokens["member"], nil)
				wantStatus(t, "revoke the key", r, http.StatusNoContent)
				revoked = true
			}
		}
		if !revoked {
			t.Fatal("the member's key is not listed")
		}
		r = <-polled
		wantStatus(t, "the waiting long-poll", r, http.StatusUnauthorized)
		if e := r.envelope(t).Error; e.Code != "credential_revoked" || !strings.Contains(e.Message, "API key") {
			t.Fatalf("the long-poll ended with %+v, want credential_revoked naming the key", e)
		}
	})
}

// TestRevocationReachesOtherReplica: a terminal open on replica B closes,
// saying why, when the person signs out through replica A (two consoles on
// one Postgres): credentials are cached for at most a second.
func TestRevocationReachesOtherReplica(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.Postgres)
	b := secondConsole(t, f.e)
	tok := f.e.orgLogin("acme", "member@acme.test", userPassword)
	onB := &terminalFixture{orgFixture: &orgFixture{e: b}, session: f.session}
	c := onB.dialTerminalAs(t, tok, false)
	readUntil(t, c, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
	typeAndSee(t, c, "echo on-b-$((6*7))\r", "on-b-42")
	wantStatus(t, "logout through replica A", f.e.json(http.MethodPost, "/api/v1/orgs/acme/auth/logout", tok, nil), http.StatusNoContent)
	if msg, _ := closedWith(t, c); !strings.Contains(msg, "signed out") {
		t.Fatalf("the terminal on replica B closed with %q, want it to say signed out", msg)
	}
}

// TestOutputReadsFollowUse: a session's owner reads its output and
// recordings only while they may use its agent. Removed from the agent's
// department, their waiting long-poll ends within about a second (not
// when its wait runs out), a fresh poll and the recording are refused,
// and auditors and admins keep reading by their own roles.
func TestOutputReadsFollowUse(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		admin := f.tokens["admin"]
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo early; sleep 60"})
		wantStatus(t, "exec", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		output := f.sessionPath("/commands/%d/output?cursor=0", o.CommandID)
		recording := f.sessionPath("/commands/%d/recording", o.CommandID)
		wantStatus(t, "the owner's poll before", f.call(http.MethodGet, output, "member", nil), http.StatusOK)

		polled := make(chan response, 1)
		go func() {
			polled <- f.call(http.MethodGet, output+"&wait_ms=30000", "member", nil)
		}()
		// The poll waits on the quiet command (cursor past "early").
		time.Sleep(500 * time.Millisecond)
		removed := time.Now()
		r = f.e.json(http.MethodDelete, "/api/v1/orgs/acme/roles", admin, rbac.Assignment{
			Subject: fmt.Sprintf("user:%d", f.ids["member"]), Role: rbac.RoleMember, Domain: rbac.DeptDomain(f.dept1)})
		wantStatus(t, "remove the member's role", r, http.StatusNoContent)
		r = <-polled
		if r.status == http.StatusOK {
			// The first answer may have carried "early": ask again from its cursor.
			var first outputJSON
			r.decode(t, &first)
			go func() {
				polled <- f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=30000", o.CommandID, first.NextCursor), "member", nil)
			}()
			r = <-polled
		}
		wantStatus(t, "the waiting long-poll", r, http.StatusForbidden)
		if took := time.Since(removed); took > 5*time.Second {
			t.Errorf("the waiting poll ended %s after the removal", took)
		}
		wantStatus(t, "a fresh poll", f.call(http.MethodGet, output, "member", nil), http.StatusForbidden)
		wantStatus(t, "the recording", f.call(http.MethodGet, recording, "member", nil), http.StatusForbidden)
		for _, who := range []string{"auditor", "admin"} {
			wantStatus(t, who+"'s poll", f.call(http.MethodGet, output, who, nil), http.StatusOK)
			wantStatus(t, who+"'s recording", f.call(http.MethodGet, recording, who, nil), http.StatusOK)
		}
	})
}

// TestAPIKeyShellIsDecided: an agent runtime's interactive shell would run
// whatever it types, past the rules its execs meet. With an agent whose
// rules refuse or ask about anything, an API key gets no shell of its own
// and may not type into a person's terminal (dynamic ask: approval
// required, audited); the person's own shell works. On SQLite and
// Postgres, against a real agentd.
func TestAPIKeyShellIsDecided(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d) // its agent denies ^rm -rf /
		key := f.dialTerminalAs(t, f.keys["member-key"], true)
		msgs := readUntil(t, key, func(m terminal.ServerMessage) bool { return m.Type == "error" || m.Type == "attached" })
		if last := msgs[len(msgs)-1]; last.Type != "error" || !strings.Contains(last.Message, "interactive shell") {
			t.Fatalf("an API key's shell: %+v, want an error saying why", last)
		}
		member, _, err := f.dialTerminal(t, "member", "rows=24&cols=80", f.e.srv.URL, wsCSRF)
		if err != nil {
			t.Fatal(err)
		}
		att := readUntil(t, member, func(m terminal.ServerMessage) bool { return m.Type == "attached" })
		cid := att[len(att)-1].CommandID
		r := f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", cid), "member-key", map[string]any{"text": "echo typed-by-key\n"})
		wantStatus(t, "the key types into the member's shell", r, http.StatusForbidden)
		if code := r.envelope(t).Error.Code; code != "approval_required" {
			t.Errorf("code %q, want approval_required", code)
		}
		_, by := typed(t, f.orgDB(t), cid)
		for who := range by {
			if strings.Contains(who, "gh_") || strings.Contains(who, "key") {
				t.Errorf("the key's input was recorded as typed: %v", by)
			}
		}
	})
}
