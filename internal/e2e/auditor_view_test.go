package e2e_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// auditView is what an audit page shows: its count line and the actions
// of its rows.
type auditView struct {
	Count   string   `json:"count"`
	Empty   bool     `json:"empty"`
	Actions []string `json:"actions"`
	Omitted bool     `json:"omitted"`
}

func readAudit(t *testing.T, ctx context.Context, base, q string) auditView {
	t.Helper()
	do(t, ctx, "search "+q, chromedp.Navigate(base+"/o/acme/audit?q="+url.QueryEscape(q)), chromedp.WaitVisible(testid("audit-count")))
	return evalJS[auditView](t, ctx, "read the audit page", `(() => ({
		count: document.querySelector('[data-testid="audit-count"]').textContent.trim(),
		empty: !!document.querySelector('[data-testid="audit-empty"]'),
		actions: [...document.querySelectorAll('[data-testid="audit-row"] td.audit-action')].map(td => td.textContent.trim()),
		omitted: !!document.querySelector('[data-testid="audit-reads-omitted"]'),
	}))()`)
}

var countLine = regexp.MustCompile(`^([0-9,]+) events?( match(es)?)?\.$`)

// countOf is the number an audit count line states.
func countOf(t *testing.T, line string) int {
	t.Helper()
	m := countLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("count line %q", line)
	}
	n, _ := strconv.Atoi(strings.ReplaceAll(m[1], ",", ""))
	return n
}

// TestBrowserAuditorSees walks issue 26's items 13-15 as an org-wide
// auditor: the agents and environments whose sessions they read are on
// their home and pages (read-only, no secrets); an audit search's count
// and list agree, even when the search's own audit.view would match it;
// and a plain search leaves reads of the log out, saying so, while
// action:audit. finds them.
func TestBrowserAuditorSees(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	fw := &fitWorld{consoleWorld: w, auditorEmail: "audrey@acme.test"}
	fw.addUserIn(t, fw.auditorEmail, "Audrey Auditor", "auditor", "org")
	ctx := w.asOrgUser(t, fw.auditorEmail)

	t.Run("15: agents and environments the auditor's sessions stand on", func(t *testing.T) {
		do(t, ctx, "open home", chromedp.Navigate(w.srv.url+"/o/acme/"), chromedp.WaitVisible(testid("org-glance")))
		for _, box := range []string{"glance-agents", "glance-envs"} {
			if n := text(t, ctx, css(`[data-testid="`+box+`"] .count`)); n != "1" {
				t.Errorf("%s counts %s, want 1", box, n)
			}
		}
		mustContain(t, "agents box", text(t, ctx, testid("glance-agents")), "triage-bot")
		mustContain(t, "environments box", text(t, ctx, testid("glance-envs")), "build-01")
		if n := text(t, ctx, css(`[data-testid="glance-sessions-empty"], table`)); strings.Contains(n, "No sessions") {
			t.Errorf("the auditor sees no sessions: %q", n)
		}
		if n := evalJS[int](t, ctx, "checklist", `document.querySelectorAll('[data-testid="setup-checklist"]').length`); n != 0 {
			t.Error("an auditor is shown the setup checklist")
		}
		do(t, ctx, "open the agent", chromedp.Navigate(w.srv.url+"/o/acme/agents/"+idStr(w.agentID)), chromedp.WaitVisible(testid("agent-name")))
		// Trying a command against the rules is reading them: the one form
		// an auditor gets; it changes nothing.
		if n := evalJS[int](t, ctx, "agent actions", `document.querySelectorAll('[data-testid="new-session"], details.confirm, main form[method=post]:not([data-testid="exec-try-form"])').length`); n != 0 {
			t.Errorf("the agent page offers an auditor %d actions", n)
		}
		if n := evalJS[int](t, ctx, "try form", `document.querySelectorAll('[data-testid="exec-try-form"]').length`); n != 1 {
			t.Errorf("the agent page offers an auditor %d try-a-command forms, want 1", n)
		}
		do(t, ctx, "open the environment", chromedp.Navigate(w.srv.url+"/o/acme/environments/"+idStr(w.envID)), chromedp.WaitVisible(testid("env-name")))
		if got := text(t, ctx, testid("token-state")); got != "set" {
			t.Errorf("the agentd token reads %q to an auditor, want only that it is set", got)
		}
		if n := evalJS[int](t, ctx, "environment actions", `document.querySelectorAll('[data-testid="save-env"], [data-testid="test-connection"], details.confirm').length`); n != 0 {
			t.Errorf("the environment page offers an auditor %d actions", n)
		}
		var agents struct{ Items []struct{ Name string } }
		var login struct{ Token string }
		callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": fw.auditorEmail, "password": w.pwd}, http.StatusOK, &login)
		callAPI(t, w.srv.url, http.MethodGet, "/api/v1/orgs/acme/agents", login.Token, nil, http.StatusOK, &agents)
		if len(agents.Items) != 1 || agents.Items[0].Name != "triage-bot" {
			t.Errorf("the API lists %+v to the auditor", agents.Items)
		}
		callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/sessions", login.Token, map[string]any{"agent_id": w.agentID}, http.StatusForbidden, nil)
	})

	t.Run("13: the count and the list come from the same query", func(t *testing.T) {
		// Only this search's own record would match: it is in neither.
		v := readAudit(t, ctx, w.srv.url, "action:audit.view zebra-crossing-7")
		if v.Count != "0 events match." || !v.Empty || len(v.Actions) != 0 {
			t.Errorf("a search only its own audit.view matches shows %q over %d rows (empty message %v)", v.Count, len(v.Actions), v.Empty)
		}
		for _, q := range []string{"", "action:audit.", "action:session.", "decision:allow", "zebra-crossing-7"} {
			v := readAudit(t, ctx, w.srv.url, q)
			if n := countOf(t, v.Count); n != len(v.Actions) || (n == 0) != v.Empty {
				t.Errorf("search %q: %q above %d rows (empty message %v)", q, v.Count, len(v.Actions), v.Empty)
			}
		}
	})

	t.Run("14: reads of the log are left out unless asked for", func(t *testing.T) {
		v := readAudit(t, ctx, w.srv.url, "")
		if !v.Omitted || len(v.Actions) == 0 {
			t.Fatalf("the plain log shows %d rows, says reads are left out: %v", len(v.Actions), v.Omitted)
		}
		for _, a := range v.Actions {
			if a == "audit.view" || a == "audit.export" || a == "audit.verify" {
				t.Errorf("the plain log lists %s", a)
			}
		}
		mustContain(t, "the page says so", text(t, ctx, testid("audit-reads-omitted")), "left out", "action:audit.")
		do(t, ctx, "follow the link", submits(chromedp.Click(testid("audit-reads-link"))), chromedp.WaitVisible(testid("audit-table")))
		views := evalJS[int](t, ctx, "audit.view rows", `[...document.querySelectorAll('[data-testid="audit-row"] td.audit-action')].filter(td => td.textContent.trim() === "audit.view").length`)
		if views < 3 {
			t.Errorf("action:audit. lists %d audit.view events, want this walk's searches", views)
		}
		if n := evalJS[int](t, ctx, "note", `document.querySelectorAll('[data-testid="audit-reads-omitted"]').length`); n != 0 {
			t.Error("a search naming an action still says reads are left out")
		}
	})
}
