package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// pageAs is a page request with the org sign-in cookie of tok and a CSRF
// pair, plus extra cookies.
func pageAs(method, path, tok, form string, extra ...*http.Cookie) request {
	csrf := "first-minutes-csrf-0123456789"
	r := request{method: method, path: path,
		cookies: append([]*http.Cookie{{Name: "gh_org_acme", Value: tok}, {Name: "gh_csrf", Value: csrf}}, extra...),
		header:  http.Header{"X-Csrf-Token": {csrf}}}
	if form != "" {
		r.body, r.contentType = strings.NewReader(form), "application/x-www-form-urlencoded"
	}
	return r
}

var (
	auditRowRe   = regexp.MustCompile(`data-testid="audit-row"`)
	auditCountRe = regexp.MustCompile(`data-testid="audit-count">([0-9,]+) events?`)
)

// TestAuditPageCountsWhatItLists is issue 26 items 13 and 14 through the
// page handler, on SQLite and Postgres: a search only its own audit.view
// would match says 0 and lists nothing; a plain search leaves reads of
// the log out and says so; action:audit. lists them; the JSON API still
// returns every match.
func TestAuditPageCountsWhatItLists(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e, tok := f.e, f.tokens["auditor"]
		page := func(q string) (rows int, count string, body string) {
			t.Helper()
			r := e.do(pageAs(http.MethodGet, "/o/acme/audit?q="+url.QueryEscape(q), tok, ""))
			wantStatus(t, "audit page "+q, r, http.StatusOK)
			m := auditCountRe.FindSubmatch(r.body)
			if m == nil {
				t.Fatalf("search %q: no count on the page", q)
			}
			return len(auditRowRe.FindAll(r.body, -1)), string(m[1]), string(r.body)
		}
		for range 3 {
			page("") // reads of the log to leave out
		}
		rows, count, body := page("action:audit.view zebra-crossing-7")
		if rows != 0 || count != "0" || !strings.Contains(body, "No events match this filter.") {
			t.Errorf("a search only its own audit.view matches: %d rows, count %s", rows, count)
		}
		rows, count, body = page("")
		if count != strconv.Itoa(rows) || rows == 0 {
			t.Errorf("plain log: %d rows under a count of %s", rows, count)
		}
		if strings.Contains(body, `<code>audit.<wbr>view</code>`) || !strings.Contains(body, `data-testid="audit-reads-omitted"`) {
			t.Error("the plain log lists audit.view, or does not say reads are left out")
		}
		rows, count, body = page("action:audit.")
		if count != strconv.Itoa(rows) || rows < 4 || !strings.Contains(body, `<code>audit.<wbr>view</code>`) {
			t.Errorf("action:audit.: %d rows under a count of %s", rows, count)
		}
		var api struct{ Items []struct{ Action string } }
		e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:audit.view", tok, nil).decode(t, &api)
		if len(api.Items) < 4 {
			t.Errorf("the JSON API returns %d audit.view events, want every read", len(api.Items))
		}
		// The page's export link (no action named) holds the reads too.
		exp := e.do(pageAs(http.MethodGet, "/o/acme/audit/export?format=jsonl&q=", tok, ""))
		wantStatus(t, "export", exp, http.StatusOK)
		if n := strings.Count(string(exp.body), `"action":"audit.view"`); n < 4 {
			t.Errorf("the export holds %d audit.view events, want every read", n)
		}
	})
}

// TestSecretsKeptUntilDismissed is issue 26 item 8 through the handlers,
// on SQLite and Postgres: a new user's one-time password is shown on
// every visit of their page (a role given in between) until dismissed,
// travels in no address, and is in no log line or audit record.
func TestSecretsKeptUntilDismissed(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e, tok := f.e, f.tokens["admin"]
		r := e.do(pageAs(http.MethodPost, "/o/acme/users", tok, "email=kept%40acme.test&name=Kept&role=none"))
		wantStatus(t, "create user", r, http.StatusSeeOther)
		loc := r.header.Get("Location")
		var reveal *http.Cookie
		for _, ck := range (&http.Response{Header: r.header}).Cookies() {
			if ck.Name == "gh_reveal" {
				reveal = ck
			}
		}
		// "It stays here until you dismiss it (or for 15 minutes)."
		if reveal == nil || reveal.Path != loc || !reveal.HttpOnly || reveal.MaxAge != 15*60 || reveal.SameSite != http.SameSiteStrictMode {
			t.Fatalf("reveal cookie %+v for %s", reveal, loc)
		}
		otpRe := regexp.MustCompile(`data-testid="one-time-password">([^<]+)<`)
		show := func(what string) string {
			t.Helper()
			r := e.do(pageAs(http.MethodGet, loc, tok, "", reveal))
			wantStatus(t, what, r, http.StatusOK)
			if m := otpRe.FindSubmatch(r.body); m != nil {
				return string(m[1])
			}
			return ""
		}
		otp := show("first visit")
		if len(otp) < 12 {
			t.Fatalf("no one-time password on the user page (%q)", otp)
		}
		wantStatus(t, "give a role", e.do(pageAs(http.MethodPost, loc+"/roles", tok, "role=auditor", reveal)), http.StatusSeeOther)
		if got := show("after giving a role"); got != otp {
			t.Errorf("after giving a role the page shows %q, want the password still", got)
		}
		r = e.do(pageAs(http.MethodPost, loc+"/dismiss-secret", tok, "", reveal))
		wantStatus(t, "dismiss", r, http.StatusSeeOther)
		cleared := false
		for _, ck := range (&http.Response{Header: r.header}).Cookies() {
			cleared = cleared || ck.Name == "gh_reveal" && ck.MaxAge < 0 && ck.Path == loc
		}
		if !cleared || r.header.Get("Location") != loc {
			t.Errorf("dismissing answered %v to %s without clearing the cookie", r.header, r.header.Get("Location"))
		}
		// The cookie sealed to the admin shows nothing to anyone else.
		if got := (func() string {
			r := e.do(pageAs(http.MethodGet, loc, f.tokens["entered-admin"], "", reveal))
			return string(otpRe.Find(r.body))
		})(); got != "" {
			t.Error("another principal's request opened the sealed password")
		}
		if strings.Contains(e.logs.String(), otp) || strings.Contains(loc, otp) {
			t.Error("the one-time password is in a log line or an address")
		}
		evs, err := openAudit(t, f).Query(context.Background(), mustParse(t, ""), 0, 500)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if strings.Contains(string(ev.Details), otp) {
				t.Errorf("audit event %s holds the one-time password", ev.Action)
			}
		}
	})
}
