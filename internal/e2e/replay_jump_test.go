package e2e_test

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// typeIntoShell opens the browser terminal's shell through the API as the
// member, types each line at its own prompt (the shell's OSC 133 B mark),
// exits, and waits until the command's end is recorded.
func (o *recOrg) typeIntoShell(t *testing.T, lines ...string) int64 {
	t.Helper()
	base := fmt.Sprintf("/api/v1/orgs/%s/sessions/%d/commands", o.slug, o.session)
	var started struct {
		CommandID int64 `json:"command_id"`
	}
	// A home of its own: the machine's own login files (a root .bashrc
	// running pyenv's hundred programs) are not what this test reads.
	callAPI(t, o.srv.url, http.MethodPost, base, o.member, map[string]any{"command": terminal.ShellCommand, "tty": true, "stdin": true,
		"rows": 30, "cols": 120, "env": map[string]string{"HOME": t.TempDir(), "SHELL": "/bin/bash"}}, http.StatusCreated, &started)
	cid := started.CommandID
	var out bytes.Buffer
	cursor := uint64(0)
	for i, l := range append(lines, "exit") {
		deadline := time.Now().Add(30 * time.Second)
		for bytes.Count(out.Bytes(), []byte("\x1b]133;B\x07")) <= i {
			if time.Now().After(deadline) {
				t.Fatalf("no prompt %d; output %q", i+1, out.String())
			}
			var page struct {
				NextCursor uint64 `json:"next_cursor"`
				Chunks     []struct{ Data []byte }
			}
			callAPI(t, o.srv.url, http.MethodGet, fmt.Sprintf("%s/%d/output?cursor=%d&wait_ms=2000", base, cid, cursor), o.member, nil, http.StatusOK, &page)
			for _, ch := range page.Chunks {
				out.Write(ch.Data)
			}
			cursor = max(cursor, page.NextCursor)
		}
		callAPI(t, o.srv.url, http.MethodPost, fmt.Sprintf("%s/%d/stdin", base, cid), o.member, map[string]string{"text": l + "\n"}, http.StatusNoContent, nil)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var list struct {
			Items []struct {
				ID    int64
				State string
			}
		}
		callAPI(t, o.srv.url, http.MethodGet, base, o.member, nil, http.StatusOK, &list)
		for _, c := range list.Items {
			if c.ID == cid && c.State != "running" {
				return cid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shell %d never ended", cid)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReplayJumpList: the replay of a terminal lists the lines typed at
// its prompts (from the shell's marks) and the programs the kernel saw it
// start; clicking a line moves the player to the moment it was typed.
func TestReplayJumpList(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	agentdURL, agentdToken := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	acme := newRecOrg(t, srv, login.Token, "acme", agentdURL, agentdToken)
	typed := []string{"cd /tmp", "sleep 1", "/bin/sleep 0.3"} // a program that lives a moment, so agentd reads its arguments
	cid := acme.typeIntoShell(t, typed...)

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the auditor", chromedp.Navigate(srv.url+"/o/acme/login"), signIn(acme.auditorEmail, acme.password), chromedp.WaitVisible(testid("my-roles")))
	do(t, ctx, "open the replay", chromedp.Navigate(fmt.Sprintf("%s/o/acme/sessions/%d/commands/%d/replay", srv.url, acme.session, cid)),
		chromedp.WaitVisible(testid("replay-jump-list")))
	lines := get(t, ctx, "typed lines", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('[data-testid="jump-line"]'), (b) => b.textContent.trim())`))
	if strings.Join(lines, "|") != strings.Join(append(typed, "exit"), "|") {
		t.Fatalf("the jump list shows %q; want %q", lines, append(typed, "exit"))
	}
	programs := text(t, ctx, testid("replay-programs"))
	mustContain(t, "programs started", programs, "$ sleep 1", "$ /bin/sleep 0.3")

	// Jump to the third line: the player moves to its moment.
	want := get(t, ctx, "the line's moment", chromedp.Evaluate[float64](`Number(document.querySelectorAll('[data-testid="jump-line"]')[2].dataset.t)`))
	if want <= 0 {
		t.Fatalf("the third line is at %v s", want)
	}
	evalJS[bool](t, ctx, "click the third line", `(() => { document.querySelectorAll('[data-testid="jump-line"]')[2].click(); return true; })()`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		at := evalJS[float64](t, ctx, "where the player jumped", `(() => { const r = window.gatehouseReplay;
			return r && r.jumpedTo !== undefined ? r.jumpedTo : -1; })()`)
		pos := evalJS[float64](t, ctx, "the player's position after the jump", `(() => { const r = window.gatehouseReplay;
			return r && r.positionAfterJump !== undefined ? r.positionAfterJump : -1; })()`)
		if at == want && math.Abs(pos-want) < 0.5 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the click the player jumped to %v and is at %v; want %v", at, pos, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBrowserShellReadsAsTerminal is issue 41 item 2 and item 10's closed
// shell, as the auditor: an interactive shell reads "Interactive terminal
// — shell #N" in the audit log, the recordings and the session page, its
// script one click away; a Replay link of the audit log starts at its
// event's moment; the replay page leads with the player, in the first
// screen at 1280 and 390 px; and a shell ended by its close reads
// "closed", not exit 137, where one that exited keeps its exit code.
func TestBrowserShellReadsAsTerminal(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	agentdURL, agentdToken := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	acme := newRecOrg(t, srv, login.Token, "acme", agentdURL, agentdToken)
	exited := acme.typeIntoShell(t, "/bin/sleep 0.3")
	// A second shell, closed: its opener kills it, as closing it does.
	cmds := fmt.Sprintf("/api/v1/orgs/%s/sessions/%d/commands", acme.slug, acme.session)
	var started struct {
		CommandID int64 `json:"command_id"`
	}
	callAPI(t, srv.url, http.MethodPost, cmds, acme.member, map[string]any{"command": terminal.ShellCommand, "tty": true, "stdin": true,
		"rows": 30, "cols": 120, "env": map[string]string{"HOME": t.TempDir(), "SHELL": "/bin/bash"}}, http.StatusCreated, &started)
	closed := started.CommandID
	callAPI(t, srv.url, http.MethodDelete, fmt.Sprintf("%s/%d", cmds, closed), acme.member, nil, http.StatusOK, nil)
	waitCommandEnd(t, srv.url, cmds, acme.member, closed)
	label := func(id int64) string { return fmt.Sprintf("Interactive terminal — shell #%d", id) }

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the auditor", chromedp.EmulateViewport(1280, 800), chromedp.Navigate(srv.url+"/o/acme/login"),
		signIn(acme.auditorEmail, acme.password), chromedp.WaitVisible(testid("my-roles")))

	t.Run("audit rows name the shells, script a click away", func(t *testing.T) {
		do(t, ctx, "search the shells' openings", chromedp.Navigate(srv.url+"/o/acme/audit?q="+url.QueryEscape("action:command.exec")),
			chromedp.WaitVisible(testid("audit-table")))
		labels := evalJS[[]string](t, ctx, "the rows' targets", `Array.from(document.querySelectorAll('[data-testid="audit-row"] [data-testid="shell-label"]'), (e) => e.textContent.trim())`)
		if strings.Join(labels, "|") != label(closed)+"|"+label(exited) {
			t.Fatalf("the command.exec rows name %q; want %q and %q", labels, label(closed), label(exited))
		}
		if h := evalJS[float64](t, ctx, "the tallest row", `Math.max(...Array.from(document.querySelectorAll('[data-testid="audit-row"]'), (r) => r.getBoundingClientRect().height))`); h > 160 {
			t.Errorf("an audit row is %v px tall at 1280 px; the script should be folded away", h)
		}
		if evalJS[bool](t, ctx, "the script shows", `document.querySelector('[data-testid="shell-script"]').checkVisibility()`) {
			t.Fatal("the script shows before it is asked for")
		}
		do(t, ctx, "open the script", chromedp.Click(css(`.audit-target details.shell-script summary`)), chromedp.WaitVisible(testid("shell-script")))
		if got := text(t, ctx, testid("shell-script")); !strings.HasPrefix(got, `case "${SHELL:-}"`) {
			t.Fatalf("the script reads %q; want the shell's script", got)
		}
	})

	t.Run("the closed shell's end reads closed in the audit log", func(t *testing.T) {
		do(t, ctx, "search the shells' ends", chromedp.Navigate(srv.url+"/o/acme/audit?q="+url.QueryEscape("action:command.end")),
			chromedp.WaitVisible(testid("audit-table")))
		ends := evalJS[[]string](t, ctx, "the rows' targets", `Array.from(document.querySelectorAll('[data-testid="audit-row"] td.audit-target'),
			(td) => td.querySelector('[data-testid="shell-label"]').textContent.trim() + (td.querySelector('[data-testid="audit-shell-closed"]') ? " closed" : ""))`)
		if want := []string{label(closed) + " closed", label(exited)}; strings.Join(ends, "|") != strings.Join(want, "|") {
			t.Fatalf("the command.end rows read %q; want %q", ends, want)
		}
	})

	t.Run("a Replay link starts at its event's moment", func(t *testing.T) {
		q := fmt.Sprintf("action:terminal.command target:%d", exited)
		do(t, ctx, "search the shell's programs", chromedp.Navigate(srv.url+"/o/acme/audit?q="+url.QueryEscape(q)), chromedp.WaitVisible(testid("audit-replay")))
		href := evalJS[string](t, ctx, "the program's Replay link", `document.querySelector('[data-testid="audit-replay"]').getAttribute("href")`)
		u, err := url.Parse(href)
		if err != nil {
			t.Fatal(err)
		}
		at, err := strconv.ParseFloat(u.Query().Get("t"), 64)
		if err != nil || at <= 0 {
			t.Fatalf("the Replay link of a program the shell started is %q; want one starting at its moment (t > 0)", href)
		}
		do(t, ctx, "follow it", submits(chromedp.Click(testid("audit-replay"))), chromedp.WaitVisible(testid("replay")))
		if start := evalJS[float64](t, ctx, "where the player starts", `Number(document.getElementById("replay").dataset.start)`); start != at {
			t.Fatalf("the replay starts at %v s; the link said %v s", start, at)
		}
	})

	t.Run("the replay leads with the player", func(t *testing.T) {
		do(t, ctx, "open the shell's replay", chromedp.Navigate(fmt.Sprintf("%s/o/acme/sessions/%d/commands/%d/replay", srv.url, acme.session, exited)),
			chromedp.WaitVisible(testid("replay")))
		mustContain(t, "the heading", text(t, ctx, css("h1")), "Interactive terminal — shell #"+strconv.FormatInt(exited, 10))
		mustContain(t, "the command", text(t, ctx, testid("replay-command")), label(exited))
		for _, size := range [][2]int64{{1280, 800}, {390, 844}} {
			do(t, ctx, "size the window", chromedp.EmulateViewport(size[0], size[1]))
			top := evalJS[float64](t, ctx, "where the player is", `document.querySelector('[data-testid="replay"]').getBoundingClientRect().top`)
			if inner := evalJS[float64](t, ctx, "the screen's height", `window.innerHeight`); top >= inner {
				t.Errorf("at %d px the player starts %v px down, below the first screen (%v px)", size[0], top, inner)
			}
		}
		do(t, ctx, "size the window back", chromedp.EmulateViewport(1280, 800))
	})

	exitOf := func(t *testing.T, sel string) string {
		t.Helper()
		return strings.TrimSpace(text(t, ctx, css(sel)))
	}
	t.Run("recordings name the shells; a closed one reads closed", func(t *testing.T) {
		do(t, ctx, "search the session's recordings", chromedp.Navigate(srv.url+"/o/acme/recordings?q="+url.QueryEscape(fmt.Sprintf("session:%d", acme.session))),
			chromedp.WaitVisible(testid("recordings-table")))
		for _, id := range []int64{exited, closed} {
			mustContain(t, "the recording", text(t, ctx, testid(fmt.Sprintf("recording-hit-%d", id))), label(id))
		}
		if got := exitOf(t, fmt.Sprintf(`[data-testid="recording-hit-%d"] [data-testid="hit-exit"]`, closed)); got != "closed" {
			t.Errorf("the closed shell's exit reads %q; want closed", got)
		}
		if got := exitOf(t, fmt.Sprintf(`[data-testid="recording-hit-%d"] [data-testid="hit-exit"]`, exited)); got != "0" {
			t.Errorf("the exited shell's exit reads %q; want 0", got)
		}
	})

	t.Run("the session page names the shells; a closed one reads closed", func(t *testing.T) {
		do(t, ctx, "open the session", chromedp.Navigate(fmt.Sprintf("%s/o/acme/sessions/%d", srv.url, acme.session)), chromedp.WaitVisible(testid("commands-table")))
		for _, id := range []int64{exited, closed} {
			mustContain(t, "the command row", text(t, ctx, testid(fmt.Sprintf("command-row-%d", id))), label(id))
		}
		if got := exitOf(t, fmt.Sprintf(`[data-testid="command-row-%d"] [data-testid="command-exit"]`, closed)); got != "closed" {
			t.Errorf("the closed shell's exit reads %q; want closed", got)
		}
		if got := exitOf(t, fmt.Sprintf(`[data-testid="command-row-%d"] [data-testid="command-exit"]`, exited)); got != "0" {
			t.Errorf("the exited shell's exit reads %q; want 0", got)
		}
	})
}
