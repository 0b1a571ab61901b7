package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// TestSessionPageLiveAndReattach (issue 26, items 3 and 4, the server's
// half; the browser tests walk the rest): a session's page follows the
// session live for whoever may read its commands; with the viewer's own
// interactive shell running it goes back to it (the newest, never someone
// else's) and offers a new shell; ?terminal=new opens one. A viewer a rule
// refuses terminal reads gets neither: the page would read again, and
// audit the refusal again, every few seconds.
func TestSessionPageLiveAndReattach(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	page := func(who, query string) string {
		t.Helper()
		p := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d%s", f.session, query),
			cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[who]}}})
		wantStatus(t, "session page", p, http.StatusOK)
		return string(p.body)
	}
	shell := func(who string) int64 {
		t.Helper()
		r := f.call(http.MethodPost, f.sessionPath("/commands"), who, map[string]any{"command": terminal.ShellCommand, "tty": true, "stdin": true})
		wantStatus(t, "shell", r, http.StatusCreated)
		var o struct {
			CommandID int64 `json:"command_id"`
		}
		r.decode(t, &o)
		return o.CommandID
	}
	attachedTo := func(body string) string {
		i := strings.Index(body, `data-command="`)
		if i < 0 {
			return ""
		}
		rest := body[i+len(`data-command="`):]
		return rest[:strings.IndexByte(rest, '"')]
	}

	p := page("member", "")
	if !strings.Contains(p, "/static/session-live.js") {
		t.Error("the session page does not follow the session")
	}
	if !strings.Contains(p, `data-testid="terminal-open"`) || attachedTo(p) != "0" {
		t.Errorf("with no shell running the page attaches to %q and offers no open button", attachedTo(p))
	}

	// Someone else's shell is not the viewer's to go back to.
	shell("admin")
	if p := page("member", ""); attachedTo(p) != "0" {
		t.Errorf("the member's page went to command %s, the admin's shell", attachedTo(p))
	}
	mine, newer := shell("member"), shell("member")
	p = page("member", "")
	if attachedTo(p) != fmt.Sprint(newer) || !strings.Contains(p, "Reattaching to your shell #"+fmt.Sprint(newer)) ||
		!strings.Contains(p, `data-reattach="1"`) || strings.Contains(p, `data-testid="terminal-open"`) {
		t.Errorf("with shells %d and %d running the page attaches to %q; want the newest, at once", mine, newer, attachedTo(p))
	}
	if !strings.Contains(p, `href="/o/acme/sessions/`+fmt.Sprint(f.session)+`?terminal=new"`) {
		t.Error("the page going back to a shell offers no new one")
	}
	for _, id := range []int64{mine, newer} {
		_, row, _ := strings.Cut(p, fmt.Sprintf(`data-testid="command-row-%d"`, id))
		row, _, _ = strings.Cut(row, "</tr>")
		if !strings.Contains(row, fmt.Sprintf("Interactive terminal — shell #%d", id)) || !strings.Contains(row, "opened by member@acme.test at ") {
			t.Errorf("shell %d is not listed as an interactive terminal with who opened it", id)
		}
	}
	if p := page("member", "?terminal=new"); attachedTo(p) != "0" || strings.Contains(p, `data-testid="terminal-open"`) {
		t.Errorf("?terminal=new attaches to %q (or waits for a click), want a new shell at once", attachedTo(p))
	}

	wantStatus(t, "deny rule", f.call(http.MethodPost, "/policies", "admin", rbac.Rule{Subject: fmt.Sprintf("user:%d", f.ids["member"]),
		Domain: rbac.DeptDomain(f.dept1), Object: "sessions/*", Action: "read", Effect: "deny"}), http.StatusNoContent)
	lg := openAudit(t, f.orgFixture)
	denials := func() int {
		t.Helper()
		evs, err := lg.Query(context.Background(), mustParse(t, "action:authz.deny"), 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	before := denials()
	p = page("member", "")
	if strings.Contains(p, "/static/session-live.js") {
		t.Error("the page of a viewer refused terminal reads follows the session (reading, and auditing the refusal, every few seconds)")
	}
	if attachedTo(p) == fmt.Sprint(newer) {
		t.Error("the page of a viewer refused terminal reads went back to their shell")
	}
	if n := denials() - before; n != 1 {
		t.Errorf("one view of the page audited %d refusals, want 1", n)
	}
}
