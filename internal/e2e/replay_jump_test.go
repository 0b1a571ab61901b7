package e2e_test

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
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
