package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// screenJS reads everything the terminal shows, scrollback included, as a
// person scrolling through it would see it.
const screenJS = `(() => { const b = window.gatehouseTerminal.term.buffer.active; const out = [];
	for (let i = 0; i < b.length; i++) { out.push(b.getLine(i).translateToString(true)); } return out.join("\n"); })()`

func screen(t *testing.T, ctx context.Context) string {
	t.Helper()
	return get(t, ctx, "read the terminal", chromedp.Evaluate[string](screenJS))
}

// waitScreen waits until the terminal shows want.
func waitScreen(t *testing.T, ctx context.Context, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := screen(t, ctx)
		if strings.Contains(s, want) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal never showed %q; it shows:\n%s", want, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// typeKeys types into the terminal as text input, the way the browser
// delivers typing to xterm.js. (Synthesized key events reach xterm.js both
// as key presses and as input, and would type every character twice.)
func typeKeys(t *testing.T, ctx context.Context, keys string) {
	t.Helper()
	do(t, ctx, "focus the terminal", chromedp.Focus(css(".xterm-helper-textarea")))
	for i, line := range strings.Split(keys, "\n") {
		if i > 0 {
			do(t, ctx, "press Enter", chromedp.KeyEvent(kb.Enter))
		}
		if line == "" {
			continue
		}
		if _, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: line}); err != nil {
			t.Fatalf("type %q: %v", line, err)
		}
	}
}

// connects is how many times the terminal opened its WebSocket.
func connects(t *testing.T, ctx context.Context) int {
	return get(t, ctx, "connect count", chromedp.Evaluate[int]("window.gatehouseTerminal.connects"))
}

// TestBrowserTerminal: a member opens a terminal on a session, types, sees
// the output; the connection drops and the terminal continues without
// losing or repeating a line; an auditor watches the same shell live and
// cannot type into it.
func TestBrowserTerminal(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	agentdURL, agentdToken := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs", login.Token, map[string]string{"slug": "acme", "name": "Acme Corp"}, http.StatusCreated, nil)
	var entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", login.Token, nil, http.StatusOK, &entered)
	root := entered.Token
	var dept, env, agent struct{ ID int64 }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/departments", root, map[string]string{"name": "Research"}, http.StatusCreated, &dept)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/environments", root, map[string]any{"name": "build-host", "kind": "host",
		"department_id": dept.ID, "url": agentdURL, "os": "linux", "deployment": "bare-metal", "agentd_token": agentdToken}, http.StatusCreated, &env)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/agents", root, map[string]any{"name": "coder", "department_id": dept.ID,
		"config": map[string]string{"model": "m"}, "environment_ids": []int64{env.ID}, "command_policy": []string{`^echo denied-pattern`}},
		http.StatusCreated, &agent)
	person := func(email, role, domain string) string {
		const password = "a long and private passphrase"
		var u struct {
			User            struct{ ID int64 }
			OneTimePassword string `json:"one_time_password"`
		}
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/users", root, map[string]string{"email": email, "name": email}, http.StatusCreated, &u)
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/roles", root, map[string]string{"subject": "user:" + strconv.FormatInt(u.User.ID, 10),
			"role": role, "domain": domain}, http.StatusNoContent, nil)
		var otp struct{ Token string }
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": email, "password": u.OneTimePassword}, http.StatusOK, &otp)
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/password", otp.Token,
			map[string]string{"current_password": u.OneTimePassword, "new_password": password}, http.StatusNoContent, nil)
		return password
	}
	memberPass := person("mia@acme.test", "member", "dept:"+strconv.FormatInt(dept.ID, 10))
	auditorPass := person("ada@acme.test", "auditor", "org")
	var sess struct{ ID int64 }
	var memberTok struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": "mia@acme.test", "password": memberPass}, http.StatusOK, &memberTok)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/sessions", memberTok.Token, map[string]any{"agent_id": agent.ID}, http.StatusCreated, &sess)
	sessionURL := fmt.Sprintf("%s/o/acme/sessions/%d", srv.url, sess.ID)

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the member", chromedp.Navigate(srv.url+"/o/acme/login"), signIn("mia@acme.test", memberPass), chromedp.WaitVisible(testid("my-roles")))
	t.Run("open a terminal and run a command", func(t *testing.T) {
		do(t, ctx, "open the terminal",
			chromedp.Navigate(sessionURL),
			chromedp.WaitVisible(testid("terminal-open")),
			chromedp.Click(testid("terminal-open")),
		)
		waitStatus(t, ctx, "Connected")
		typeKeys(t, ctx, "echo h''i\n")
		s := waitScreen(t, ctx, "\nhi")
		if !hasLine(s, "hi") {
			t.Fatalf("no line \"hi\" on the screen:\n%s", s)
		}
	})
	t.Run("the header says the execution rules are not applied to what is typed, and they are not", func(t *testing.T) {
		promise := get(t, ctx, "terminal header", chromedp.Text(testid("terminal-promise")))
		unchecked := get(t, ctx, "terminal header", chromedp.Text(testid("terminal-unchecked")))
		if strings.Contains(promise, "Everything typed here is checked") || !strings.Contains(unchecked, "not applied to what is typed here") {
			t.Fatalf("the terminal header says %q and %q", promise, unchecked)
		}
		typeKeys(t, ctx, "echo denied-pattern-$((40+2))\n")
		waitScreen(t, ctx, "\ndenied-pattern-42")
		callAPI(t, srv.url, http.MethodPost, fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands", sess.ID), memberTok.Token,
			map[string]any{"command": "echo denied-pattern-api"}, http.StatusForbidden, nil)
	})
	t.Run("a dropped connection reconnects and continues", func(t *testing.T) {
		dropAndReconnect(t, ctx, srv)
		waitStatus(t, ctx, "Connected")
		typeKeys(t, ctx, "echo again-$((20+1))\n")
		waitScreen(t, ctx, "again-21")
	})
	t.Run("seq 1 2000 with a reconnect in the middle shows every line once", func(t *testing.T) {
		typeKeys(t, ctx, "seq 1 2000; echo seq-$((1+1))-done\n")
		waitScreen(t, ctx, "\n700")
		dropAndReconnect(t, ctx, srv)
		s := waitScreen(t, ctx, "seq-2-done")
		count := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			count[strings.TrimSpace(l)]++
		}
		for i := 1; i <= 2000; i++ {
			if n := count[strconv.Itoa(i)]; n != 1 {
				t.Fatalf("line %d shown %d times", i, n)
			}
		}
	})
	t.Run("an auditor watches live and cannot type", func(t *testing.T) {
		cid := get(t, ctx, "command id", chromedp.Evaluate[int]("window.gatehouseTerminal.commandId"))
		actx := newBrowser(t)
		do(t, actx, "sign in as the auditor", chromedp.Navigate(srv.url+"/o/acme/login"), signIn("ada@acme.test", auditorPass), chromedp.WaitVisible(testid("my-roles")))
		do(t, actx, "watch the command", chromedp.Navigate(fmt.Sprintf("%s/commands/%d/watch", sessionURL, cid)))
		waitStatus(t, actx, "Watching (read-only)")
		waitScreen(t, actx, "seq-2-done")
		typeKeys(t, ctx, "echo live-$((3*3))\n")
		waitScreen(t, actx, "live-9")
		typeKeys(t, actx, "touch /tmp/auditor-typed\n")
		time.Sleep(500 * time.Millisecond)
		if strings.Contains(screen(t, ctx), "touch /tmp/auditor-typed") {
			t.Fatal("the auditor's keystrokes reached the member's shell")
		}
	})
}

// dropAndReconnect drops the server's terminal connections and waits for
// the page's terminal to open a new one; it fails if there was no
// connection to drop or the terminal never reconnected.
func dropAndReconnect(t *testing.T, ctx context.Context, srv *server) {
	t.Helper()
	before := connects(t, ctx)
	if n := srv.hijacked.dropAll(); n < 1 {
		t.Fatalf("dropped %d terminal connections; want at least 1", n)
	}
	deadline := time.Now().Add(15 * time.Second)
	for connects(t, ctx) <= before {
		if time.Now().After(deadline) {
			t.Fatalf("the terminal did not reconnect: still %d connects", before)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitStatus(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := get(t, ctx, "terminal status", chromedp.Text(testid("terminal-status")))
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminal status %q, want %q", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func hasLine(screen, line string) bool {
	for _, l := range strings.Split(screen, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}
