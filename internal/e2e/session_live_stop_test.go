package e2e_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserSessionPageStopsWhenRefused: a session page left open by a
// department owner who then loses the role stops following the session at
// its first refused read. Every refused read is an audited denial, so a
// tab that went on asking would write one every few seconds for as long
// as it stays open.
func TestBrowserSessionPageStopsWhenRefused(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := newJourneyBrowser(t)
	sessionURL := w.srv.url + "/o/acme/sessions/" + idStr(w.sessionID)
	do(t, ctx, "sign in as the department owner and open the member's session",
		chromedp.Navigate(w.srv.url+"/o/acme/login"),
		signIn(w.ownerEmail, w.pwd),
		chromedp.WaitVisible(testid("org-glance")),
		chromedp.Navigate(sessionURL),
		chromedp.WaitVisible(testid("session-state")),
	)
	if n := evalJS[int](t, ctx, "live script", `document.querySelectorAll('script[src="/static/session-live.js"]').length`); n != 1 {
		t.Fatalf("the owner's view of the session does not follow it (%d live scripts)", n)
	}
	callAPI(t, w.srv.url, http.MethodDelete, "/api/v1/orgs/acme/roles", w.orgToken, map[string]string{
		"subject": "user:" + idStr(w.ownerID), "role": "dept-owner", "domain": "dept:" + idStr(w.deptID)}, http.StatusNoContent, nil)
	// The page refreshes every 3 s: it must have met the refusal and
	// stopped well within 30.
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	do(t, wait, "the page stops following the session", waitJS(`document.body.dataset.live === "stopped"`))
	var page struct {
		Items []struct {
			Actor struct{ Name string }
		}
	}
	callAPI(t, w.srv.url, http.MethodGet, "/api/v1/orgs/acme/audit?q="+url.QueryEscape("decision:deny actor:"+w.ownerEmail), w.orgToken, nil, http.StatusOK, &page)
	if len(page.Items) != 1 {
		t.Fatalf("%d audited denials of the owner's refreshes, want the one that stopped the page", len(page.Items))
	}
}
