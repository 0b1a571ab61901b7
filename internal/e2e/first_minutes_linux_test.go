//go:build linux

package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserFirstMinutesLocalSandboxes is issue 26's second pass over the
// session, terminal and environment journeys, walked as a newcomer: a
// console with --local-sandboxes and a RELATIVE data dir (and a relative
// path to agentd) → the local backend registered in one action → a
// per-session agent whose only ready template is preselected → a failed
// sandbox start that says what to do → a terminal, `echo hi`, the session
// page following it live → a reload in the middle of `sleep` brings the
// same shell back → the session closed from another tab, whose terminal
// and command list say what closing did → nothing left running under
// agentd.
func TestBrowserFirstMinutesLocalSandboxes(t *testing.T) {
	t.Parallel()
	bin, err := e2bfaketest.BuildAgentd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if bin.StandIn {
		t.Fatalf("this test runs shells in local sandboxes and needs the real agentd; only the stand-in could be had: %s", bin.Reason)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	relative := func(p string) string {
		t.Helper()
		r, err := filepath.Rel(wd, p)
		if err != nil || filepath.IsAbs(r) {
			t.Fatalf("no relative path from %s to %s: %v", wd, p, err)
		}
		return r
	}
	dataDir, agentdPath := relative(t.TempDir()), relative(bin.Path)
	srv := newServer(t, store.SQLite, func(c *config.Config) {
		c.LocalSandboxes, c.DataDir, c.LocalAgentd = true, dataDir, agentdPath
	})
	local := srv.c.Local
	var login, entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs", login.Token, map[string]string{"slug": "acme", "name": "Acme Corp"}, http.StatusCreated, nil)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", login.Token, nil, http.StatusOK, &entered)

	ctx := newJourneyBrowser(t)
	do(t, ctx, "sign in as the platform admin and enter acme",
		chromedp.Navigate(srv.url+"/login"),
		signIn(adminEmail, adminPassword),
		chromedp.WaitVisible(testid("org-row-acme")),
		chromedp.Navigate(srv.url+"/admin/orgs/acme"),
		submits(chromedp.Click(testid("enter"))),
		chromedp.WaitVisible(testid("org-glance")),
	)

	var envID string
	t.Run("register the local backend in one action", func(t *testing.T) {
		do(t, ctx, "open environments", chromedp.Navigate(srv.url+"/o/acme/environments"), chromedp.WaitVisible(testid("local-offer")))
		mustContain(t, "the warning beside it", text(t, ctx, testid("local-warning")), "No isolation", "console's user", "never use it in production")
		if n := get(t, ctx, "hint", chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="local-sandboxes-hint"]').length`)); n != 0 {
			t.Error("a console with the local backend still tells how to start one")
		}
		if *updateScreenshots {
			// The offer, at the top of a short viewport.
			do(t, ctx, "size the viewport", chromedp.EmulateViewport(1200, 420),
				chromedp.Evaluate[chromedp.Void](`document.querySelector('[data-testid="local-offer"]').scrollIntoView()`))
			writeScreenshot(t, get(t, ctx, "screenshot", chromedp.CaptureScreenshot()), "environments-local.png")
			do(t, ctx, "reset the viewport", chromedp.ResetViewport())
		}
		do(t, ctx, "use it", submits(chromedp.Click(testid("use-local"))), chromedp.WaitVisible(testid("templates-table")))
		m := regexp.MustCompile(`/o/acme/environments/(\d+)$`).FindStringSubmatch(get(t, ctx, "location", chromedp.Location()))
		if m == nil {
			t.Fatal("registering did not land on the environment's page")
		}
		envID = m[1]
		mustContain(t, "flash", text(t, ctx, testid("flash")), "registered as local-sandboxes", "base", "per-session")
		mustContain(t, "templates", text(t, ctx, testid("templates-table")), "base", "ready")
		if st := text(t, ctx, css(`dl.facts [data-testid="status"]`)); st != "healthy" {
			t.Errorf("the registered backend is %q, want healthy (checked at once)", st)
		}
		// Issue 41 item 10: the page leads on to an agent.
		mustContain(t, "next step", text(t, ctx, testid("next-agent")), "Next: configure an agent", "per-session")
		if href := get(t, ctx, "next link", chromedp.AttributeValue(testid("next-agent-link"), "href")); href.Value != "/o/acme/agents" {
			t.Errorf("the next step links to %q", href.Value)
		}
		mustContain(t, "last checked", text(t, ctx, testid("last-checked")), "UTC")
		noSecretInPage(t, ctx, "environment page", local.APIKey)
		noSecretInPage(t, ctx, "environment page", local.AgentdToken)
		// Test connection updates "Last checked" in place, with the badge.
		evalJS[string](t, ctx, "forget the last check on the page", `document.querySelector('[data-testid="last-checked"]').textContent = "not yet"`)
		do(t, ctx, "test the connection",
			chromedp.Click(testid("test-connection")),
			chromedp.WaitVisible(css(`[data-testid="test-result"][data-state="healthy"]`)),
		)
		mustContain(t, "last checked after the test", text(t, ctx, testid("last-checked")), "UTC", "ms")
		do(t, ctx, "the offer now names it", chromedp.Navigate(srv.url+"/o/acme/environments"), chromedp.WaitVisible(testid("local-registered")))
		mustContain(t, "registered", text(t, ctx, testid("local-registered")), "local-sandboxes")
		// Audited as creating an environment and a template by hand are.
		for _, action := range []string{"environment.create", "template.create"} {
			var page struct {
				Items []struct{ Actor struct{ Name string } }
			}
			body := callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/audit?q=action:"+action, entered.Token, nil, http.StatusOK, &page)
			if len(page.Items) != 1 || page.Items[0].Actor.Name != adminEmail {
				t.Errorf("%s: audited %s, want once by %s", action, body, adminEmail)
			}
			for _, secret := range []string{local.APIKey, local.AgentdToken} {
				if strings.Contains(string(body), secret) {
					t.Errorf("%s: the audit log holds a secret of the local backend", action)
				}
			}
		}
	})

	var agentPath string
	t.Run("a per-session agent: the only ready template is preselected", func(t *testing.T) {
		do(t, ctx, "follow the environment's next step", chromedp.Navigate(srv.url+"/o/acme/environments/"+envID), chromedp.WaitVisible(testid("next-agent-link")),
			submits(chromedp.Click(testid("next-agent-link"))), chromedp.WaitVisible(testid("agents-empty")))
		tplValue := evalJS[string](t, ctx, "template", `document.querySelector('#template_id').value`)
		tplLabel := evalJS[string](t, ctx, "template label", `document.querySelector('#template_id').selectedOptions[0].textContent`)
		if tplValue == "0" || !strings.Contains(tplLabel, "local-sandboxes / base (ready)") {
			t.Fatalf("the template preselected is %q (%q), want the only ready one", tplValue, tplLabel)
		}
		// Issue 41 item 10: a sandbox backend is not offered to an agent
		// whose sandbox mode is off, only once per-session is chosen.
		if v := evalJS[string](t, ctx, "mode", `document.querySelector('input[name="sandbox_mode"]:checked').value`); v != "off" {
			t.Fatalf("the form starts in sandbox mode %q, want off", v)
		}
		if evalJS[bool](t, ctx, "offered with mode off", `(() => { const b = document.querySelector('input[name="environment_ids"][value="`+envID+`"]'); return b.offsetParent !== null && !b.disabled })()`) {
			t.Error("with sandbox mode off the sandbox backend is offered")
		}
		mustContain(t, "why", text(t, ctx, testid("sandbox-envs-need-mode")), "per-session")
		do(t, ctx, "choose per-session", chromedp.Click(css(`input[name="sandbox_mode"][value="per-session"]`)),
			chromedp.WaitVisible(testid("env-choice-"+envID)))
		mustContain(t, "label", text(t, ctx, testid("env-choice-"+envID)), "local-sandboxes", "per-session mode only")
		do(t, ctx, "create the agent without touching the template",
			chromedp.SendKeys(css(`#aname`), "coder"),
			chromedp.Clear(css(`#config`)),
			chromedp.SendKeys(css(`#config`), `{"model": "claude-sonnet-4"}`),
			chromedp.Click(css(`input[name="environment_ids"][value="`+envID+`"]`)),
			chromedp.Click(css(`input[name="default_environment_id"][value="`+envID+`"]`)),
			submits(chromedp.Click(testid("save-agent"))),
			chromedp.WaitVisible(css(`[data-testid="agent-name"], [data-testid="form-error"]`)),
		)
		if n := evalJS[int](t, ctx, "form error", `document.querySelectorAll('[data-testid="form-error"]').length`); n != 0 {
			t.Fatalf("the agent was refused: %s", text(t, ctx, css("main")))
		}
		mustContain(t, "agent", text(t, ctx, testid("agent-effective")), "per-session", "base")
		agentPath = strings.TrimPrefix(get(t, ctx, "location", chromedp.Location()), srv.url)
	})

	var sessionPath string
	t.Run("a failed start says what to do and marks the environment", func(t *testing.T) {
		do(t, ctx, "new session", chromedp.Navigate(srv.url+agentPath), submits(chromedp.Click(testid("new-session"))), chromedp.WaitVisible(testid("session-state")))
		sessionPath = strings.TrimPrefix(get(t, ctx, "location", chromedp.Location()), srv.url)
		remove := local.Server.InjectFault(e2bfake.Fault{Route: "POST /sandboxes", Status: 500})
		defer remove() // whatever happens here, the next steps find the backend working
		// The page creating the session has a flash of its own: wait for
		// the one the start leaves. The click is one step in the page:
		// the page may still be replacing the button it just rendered.
		clickNow(t, ctx, "start it while the backend fails", "session-start")
		do(t, ctx, "the start's flash", waitContains(testid("flash"), "marked degraded"))
		remove()
		mustContain(t, "what to do", text(t, ctx, testid("flash")), "create the session's sandbox", `"local-sandboxes" is marked degraded`, "start the session again")
		if st := text(t, ctx, testid("session-state")); st != "pending" {
			t.Errorf("after the failed start the session is %q, want pending", st)
		}
		do(t, ctx, "the environment's page", chromedp.Navigate(srv.url+"/o/acme/environments/"+envID), chromedp.WaitVisible(testid("health-error")))
		if n := evalJS[int](t, ctx, "next step", `document.querySelectorAll('[data-testid="next-agent"]').length`); n != 0 {
			t.Error("an environment an agent runs in still leads on to configuring one")
		}
		if st := text(t, ctx, css(`dl.facts [data-testid="status"]`)); st != "degraded" {
			t.Errorf("after the failed start the environment is %q, want degraded", st)
		}
		mustContain(t, "its reason", text(t, ctx, testid("health-error")), "could not start a sandbox")
	})

	var shell int
	var pids []int
	t.Run("a terminal: echo hi, and the page follows it live", func(t *testing.T) {
		do(t, ctx, "open the session", chromedp.Navigate(srv.url+sessionPath), chromedp.WaitVisible(testid("commands-empty")))
		do(t, ctx, "open a terminal", chromedp.Click(testid("terminal-open")))
		waitStatus(t, ctx, "Connected to shell #")
		typeKeys(t, ctx, "echo h''i; echo pid-$$\n")
		s := waitScreen(t, ctx, "\nhi")
		if !hasLine(s, "hi") {
			t.Fatalf("no line \"hi\" on the screen:\n%s", s)
		}
		m := regexp.MustCompile(`(?m)^pid-(\d+)`).FindStringSubmatch(waitScreen(t, ctx, "\npid-"))
		if m == nil {
			t.Fatalf("the shell did not say its pid:\n%s", screen(t, ctx))
		}
		pid, _ := strconv.Atoi(m[1])
		shell = get(t, ctx, "shell", chromedp.Evaluate[int]("window.gatehouseTerminal.commandId"))
		// No reload: the state, the sandbox and the command list follow.
		do(t, ctx, "the page follows the session",
			waitText(testid("session-state"), "running"),
			chromedp.WaitVisible(testid("command-shell")),
		)
		mustContain(t, "the shell as listed", text(t, ctx, testid("command-row-"+strconv.Itoa(shell))),
			"Interactive terminal", "shell #"+strconv.Itoa(shell), "opened by "+adminEmail, "running")
		if n := evalJS[int](t, ctx, "empty list", `document.querySelectorAll('[data-testid="commands-empty"]').length`); n != 0 {
			t.Error(`the page still says "Nothing has run in this session yet"`)
		}
		if n := evalJS[int](t, ctx, "start button", `document.querySelectorAll('[data-testid="session-start"]').length`); n != 0 {
			t.Error(`the page still offers "Start now"`)
		}
		if lu := text(t, ctx, testid("session-last-used")); !strings.Contains(lu, "UTC") {
			t.Errorf("last used reads %q without a reload, want when the shell ran", lu)
		}
		sandboxID := strings.TrimSpace(text(t, ctx, testid("session-sandbox")))
		snap, ok := local.Server.Inspect(sandboxID)
		if !ok || snap.PID == 0 {
			t.Fatalf("sandbox %q is not at the local backend", sandboxID)
		}
		pids = []int{snap.PID, pid}
	})

	t.Run("a reload during sleep brings the same shell back", func(t *testing.T) {
		if len(pids) < 2 {
			t.Fatal("no terminal to reload: the step opening it failed")
		}
		typeKeys(t, ctx, "sleep 30\n")
		sleeper := waitChild(t, pids[1], "sleep")
		pids = append(pids, sleeper)
		do(t, ctx, "reload", chromedp.Reload())
		waitStatus(t, ctx, "Connected to shell #"+strconv.Itoa(shell))
		if got := get(t, ctx, "shell", chromedp.Evaluate[int]("window.gatehouseTerminal.commandId")); got != shell {
			t.Fatalf("after the reload the terminal is on command %d, want shell %d", got, shell)
		}
		// From the start of what agentd holds: the screen is back.
		waitScreen(t, ctx, "pid-"+strconv.Itoa(pids[1]))
		mustContain(t, "new shell offer", text(t, ctx, testid("terminal-new-shell-offer")), "still running", "New shell")
		if n := evalJS[int](t, ctx, "shells", `document.querySelectorAll('[data-testid="command-shell"]').length`); n != 1 {
			t.Errorf("%d interactive terminals listed after the reload, want the one", n)
		}
		if !alive(sleeper) {
			t.Error("the reload ended the sleep")
		}
		if *updateScreenshots {
			// The terminal back after the reload, and the command list.
			do(t, ctx, "size the viewport", chromedp.EmulateViewport(1200, 1100))
			writeScreenshot(t, get(t, ctx, "screenshot", chromedp.CaptureScreenshot()), "session-terminal.png")
			do(t, ctx, "reset the viewport", chromedp.ResetViewport())
		}
	})

	t.Run("closed from another tab: the terminal and the list say what closing did", func(t *testing.T) {
		tab, cancel := chromedp.NewContext(ctx)
		defer cancel()
		do(t, tab, "open the session in a second tab", chromedp.Navigate(srv.url+sessionPath))
		waitStatus(t, tab, "Connected to shell #"+strconv.Itoa(shell))
		do(t, ctx, "close, confirmed",
			chromedp.Click(testid("session-close-open")),
			submits(chromedp.Click(testid("session-close"))),
			waitText(testid("session-state"), "closed"),
		)
		row := css(`[data-testid="command-row-` + strconv.Itoa(shell) + `"]`)
		mustContain(t, "the closing tab's list", text(t, ctx, row), "closed", "ended with the session")
		// The other tab's terminal says it, and its page follows.
		waitStatus(t, tab, "the session was closed")
		waitScreen(t, tab, "closing it ended this shell")
		do(t, tab, "the other tab follows", waitText(testid("session-state"), "closed"))
		mustContain(t, "the other tab's list", text(t, tab, row), "closed", "ended with the session")
		var c struct {
			State   string `json:"state"`
			EndedBy string `json:"ended_by"`
		}
		var list struct {
			Items []struct {
				ID      int64  `json:"id"`
				State   string `json:"state"`
				EndedBy string `json:"ended_by"`
			}
		}
		callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme"+strings.Replace(sessionPath, "/o/acme", "", 1)+"/commands", entered.Token, nil, http.StatusOK, &list)
		for _, it := range list.Items {
			if it.ID == int64(shell) {
				c.State, c.EndedBy = it.State, it.EndedBy
			}
		}
		if c.EndedBy != "session_close" || c.State == "lost" {
			t.Errorf("the API says the shell ended %s (ended_by %q), want ended_by session_close and not lost", c.State, c.EndedBy)
		}
	})

	t.Run("nothing is left running under agentd", func(t *testing.T) {
		for _, pid := range pids {
			waitGone(t, pid)
		}
	})
}

// newJourneyBrowser is newBrowser for a journey of many steps: each step
// waits on its own condition, and the whole walk gets three minutes, not
// newBrowser's 90 s, so that a loaded machine (every browser test at
// once on two cores) slows it down without failing it.
func newJourneyBrowser(t *testing.T) context.Context {
	t.Helper()
	return newBrowserFor(t, 3*time.Minute)
}

// waitContains waits until the element's text contains want, across the
// page a click is leaving.
func waitContains(sel chromedp.CSS, want string) chromedp.Action[chromedp.Void] {
	js := `document.querySelector(` + strconv.Quote(string(sel)) + `)?.textContent ?? ""`
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		last := ""
		for {
			if got, err := chromedp.Evaluate[string](js)(ctx, tg); err == nil {
				if strings.Contains(got, want) {
					return chromedp.Void{}, nil
				}
				last = got
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("%s never said %q (last %q): %w", sel, want, last, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// waitChild waits for a child of pid running name and returns its pid.
func waitChild(t *testing.T, pid int, name string) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
		for _, f := range strings.Fields(string(b)) {
			child, _ := strconv.Atoi(f)
			if comm, _ := os.ReadFile("/proc/" + f + "/comm"); strings.TrimSpace(string(comm)) == name {
				return child
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never started %s (children %q)", pid, name, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie has ended).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// waitGone waits until pid no longer runs.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
			t.Fatalf("process %d (%s) still runs after the session closed", pid, strings.TrimSpace(string(comm)))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
