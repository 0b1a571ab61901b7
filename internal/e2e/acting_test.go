package e2e_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserPlatformAdminActingInOrg is issue 13's third journey: a
// platform admin enters an organization and knows where they are and in
// which capacity on every page (a banner), sees what an org admin sees,
// leaves back to the platform pages, and "Sign out" inside the org ends
// the org sign-in and lands on the platform pages, which are still theirs.
func TestBrowserPlatformAdminActingInOrg(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	acmeOrg(t, srv)

	ctx := newBrowser(t)
	enter := func(what string) {
		t.Helper()
		do(t, ctx, what,
			chromedp.Navigate(srv.url+"/admin/orgs/acme"),
			chromedp.WaitVisible(testid("enter")),
			submits(chromedp.Click(testid("enter"))),
			chromedp.WaitVisible(testid("acting-banner")),
		)
	}
	banner := func() bool {
		return get(t, ctx, "banner present", chromedp.Evaluate[bool](`!!document.querySelector('[data-testid="acting-banner"]')`))
	}
	do(t, ctx, "sign in to the platform", chromedp.Navigate(srv.url+"/login"), signIn(adminEmail, adminPassword), chromedp.WaitVisible(testid("new-org")))
	if banner() {
		t.Error("the platform pages show the acting banner before entering an org")
	}
	enter("enter the org")

	// Home: where, as what, and the org admin's view.
	mustContain(t, "banner", text(t, ctx, testid("acting-banner")), "Acting in Acme Corp as platform admin", "Leave")
	mustContain(t, "home roles", text(t, ctx, testid("my-roles")), "Org admin", "whole organization, as platform admin")
	if *updateScreenshots {
		do(t, ctx, "size the viewport", chromedp.EmulateViewport(1200, 700))
		writeScreenshot(t, get(t, ctx, "screenshot", chromedp.CaptureScreenshot()), "org-acting.png")
		do(t, ctx, "reset the viewport", chromedp.ResetViewport())
	}
	if get(t, ctx, "no-roles notice", chromedp.Evaluate[bool](`!!document.querySelector('[data-testid="no-roles"]')`)) {
		t.Error(`the home page says "You hold no roles yet" to an entered platform admin`)
	}
	nav := text(t, ctx, css(`nav[aria-label="Main"]`))
	for _, item := range []string{"Users", "Departments", "Environments", "Audit log", "Single sign-on"} {
		mustContain(t, "org admin navigation", nav, item)
	}
	// The banner follows every org page.
	for _, page := range []string{"/o/acme/users", "/o/acme/environments", "/o/acme/audit", "/o/acme/no-such-page"} {
		do(t, ctx, "open "+page, chromedp.Navigate(srv.url+page), chromedp.WaitVisible(css(`main h1`)))
		if !banner() || text(t, ctx, testid("acting-org")) != "Acme Corp" {
			t.Errorf("%s does not say the admin is acting in Acme Corp", page)
		}
	}

	// Leave: back on the org's platform page, the org sign-in over.
	do(t, ctx, "leave", submits(chromedp.Click(testid("leave-org"))), chromedp.WaitVisible(testid("org-name")))
	if loc := get(t, ctx, "location", chromedp.Location()); !strings.HasSuffix(loc, "/admin/orgs/acme") {
		t.Errorf("Leave landed on %s, want /admin/orgs/acme", loc)
	}
	mustContain(t, "flash after leaving", text(t, ctx, testid("flash")), "You left Acme Corp")
	if banner() {
		t.Error("the banner is still shown after leaving")
	}
	do(t, ctx, "the org is closed again", chromedp.Navigate(srv.url+"/o/acme/users"), chromedp.WaitVisible(testid("login-submit")))
	if loc := get(t, ctx, "location", chromedp.Location()); !strings.Contains(loc, "/o/acme/login") {
		t.Errorf("after leaving, an org page sent the browser to %s, want the org's sign-in", loc)
	}

	// Sign out inside the org: the org sign-in ends, the platform one
	// stays, and the page says so.
	enter("enter again")
	do(t, ctx, "sign out inside the org", submits(chromedp.Click(css(`form.logout button`))), chromedp.WaitVisible(testid("org-name")))
	if loc := get(t, ctx, "location", chromedp.Location()); !strings.HasSuffix(loc, "/admin/orgs/acme") {
		t.Errorf("Sign out in the org landed on %s, want /admin/orgs/acme", loc)
	}
	mustContain(t, "flash after signing out", text(t, ctx, testid("flash")), "signed out of Acme Corp", "still signed in to the platform pages")
	if banner() {
		t.Error("the banner is still shown after signing out of the org")
	}
	// And signing out of the platform ends that too.
	do(t, ctx, "sign out of the platform", submits(chromedp.Click(css(`form.logout button`))), chromedp.WaitVisible(testid("login-submit")))

	events, err := srv.c.Audit.Query(t.Context(), audit.Filter{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var acts []string
	for _, e := range events {
		// By suffix: the platform log's names for entering may change.
		for _, a := range []string{"enter", "leave"} {
			if e.Target.ID == "acme" && strings.HasSuffix(e.Action, "."+a) {
				acts = append([]string{a}, acts...)
			}
		}
	}
	if strings.Join(acts, " ") != "enter leave enter" {
		t.Errorf("platform log records %v, want enter, leave, enter", acts)
	}
}
