//go:build linux

package e2e_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserHostShellsAndClose is issue 26's items 3, 6 and 16 on a host
// session (a real agentd on this machine), as the member who uses it: a
// reload goes back to their running shell; "New shell" opens a second one
// and a reload then goes back to that one (not a third); the command list
// names both as interactive terminals with who opened them and when;
// closing the session from the page ends both shells, and the list, the
// API and a terminal left open in another tab say that closing did it.
func TestBrowserHostShellsAndClose(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := newJourneyBrowser(t)
	do(t, ctx, "sign in as "+w.memberEmail,
		chromedp.Navigate(w.srv.url+"/o/acme/login"),
		signIn(w.memberEmail, w.pwd),
		chromedp.WaitVisible(testid("org-glance")),
	)
	sessionURL := w.srv.url + "/o/acme/sessions/" + idStr(w.sessionID)
	pidRE := regexp.MustCompile(`(?m)^pid-(\d+)`)
	shellPID := func() int {
		t.Helper()
		m := pidRE.FindAllStringSubmatch(waitScreen(t, ctx, "\npid-"), -1)
		pid, _ := strconv.Atoi(m[len(m)-1][1])
		return pid
	}
	commandID := func() int {
		return get(t, ctx, "command", chromedp.Evaluate[int]("window.gatehouseTerminal.commandId"))
	}

	var first, second int
	var pids []int
	t.Run("a reload goes back to the running shell", func(t *testing.T) {
		do(t, ctx, "open a terminal", chromedp.Navigate(sessionURL), chromedp.Click(testid("terminal-open")))
		waitStatus(t, ctx, "Connected to shell #")
		first = commandID()
		typeKeys(t, ctx, "echo pid-$$\n")
		pids = append(pids, shellPID())
		do(t, ctx, "reload", chromedp.Reload())
		waitStatus(t, ctx, "Connected to shell #"+strconv.Itoa(first))
		waitScreen(t, ctx, "pid-"+strconv.Itoa(pids[0]))
	})

	t.Run("New shell opens another; a reload goes back to the newest", func(t *testing.T) {
		// The page being left is connected too: wait for the new one's.
		do(t, ctx, "new shell", submits(chromedp.Click(testid("terminal-new-shell"))),
			waitJS(`window.gatehouseTerminal && window.gatehouseTerminal.commandId > `+strconv.Itoa(first)+
				` && document.getElementById("terminal-status").dataset.state === "connected"`))
		if second = commandID(); second == first {
			t.Fatalf("New shell attached to shell #%d again", first)
		}
		// The address no longer asks for a new shell: a reload must not
		// open a third.
		if loc := get(t, ctx, "location", chromedp.Location()); strings.Contains(loc, "terminal=new") {
			t.Errorf("after the new shell attached the address is %s", loc)
		}
		typeKeys(t, ctx, "echo pid-$$\n")
		pids = append(pids, shellPID())
		do(t, ctx, "reload", chromedp.Reload())
		waitStatus(t, ctx, "Connected to shell #"+strconv.Itoa(second))
		for _, id := range []int{first, second} {
			mustContain(t, "shell "+strconv.Itoa(id), text(t, ctx, testid("command-row-"+strconv.Itoa(id))),
				"Interactive terminal", "shell #"+strconv.Itoa(id), "opened by "+w.memberEmail, "UTC", "running")
		}
		if n := evalJS[int](t, ctx, "shells", `document.querySelectorAll('[data-testid="command-shell"]').length`); n != 2 {
			t.Errorf("%d interactive terminals listed, want 2", n)
		}
	})

	t.Run("closing ends both shells and says so", func(t *testing.T) {
		tab, cancel := chromedp.NewContext(ctx)
		defer cancel()
		do(t, tab, "open the first shell in another tab", chromedp.Navigate(sessionURL+"?terminal="+strconv.Itoa(first)),
			chromedp.Click(testid("terminal-open")))
		waitStatus(t, tab, "Connected to shell #"+strconv.Itoa(first))
		do(t, ctx, "close, confirmed",
			chromedp.Click(testid("session-close-open")),
			submits(chromedp.Click(testid("session-close"))),
			waitText(testid("session-state"), "closed"),
		)
		for _, id := range []int{first, second} {
			mustContain(t, "closed shell "+strconv.Itoa(id), text(t, ctx, testid("command-row-"+strconv.Itoa(id))), "closed", "ended with the session")
		}
		// A closed session's page no longer follows it.
		if n := evalJS[int](t, ctx, "live script", `document.querySelectorAll('script[src="/static/session-live.js"]').length`); n != 0 {
			t.Error("the page of a closed session still follows it")
		}
		waitStatus(t, tab, "the session was closed")
		waitScreen(t, tab, "closing it ended this shell")
		var list struct {
			Items []struct {
				ID      int
				State   string
				EndedBy string `json:"ended_by"`
			}
		}
		callAPI(t, w.srv.url, "GET", "/api/v1/orgs/acme/sessions/"+idStr(w.sessionID)+"/commands", w.orgToken, nil, 200, &list)
		for _, c := range list.Items {
			if c.EndedBy != "session_close" || c.State != "killed" {
				t.Errorf("command %d ended %s (ended_by %q), want killed with ended_by session_close", c.ID, c.State, c.EndedBy)
			}
		}
		for _, pid := range pids {
			waitGone(t, pid)
		}
	})
}

// waitJS waits until the expression is true, across the page a click is
// leaving.
func waitJS(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		for {
			if ok, err := chromedp.Evaluate[bool]("!!("+expr+")")(ctx, tg); err == nil && ok {
				return chromedp.Void{}, nil
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("never true: %s: %w", expr, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
