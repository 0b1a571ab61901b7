package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserWhereOrgUsersSignIn is issue 13's first journey. A platform
// admin finds the organization's sign-in address on its page and copies
// it, adds a user and sees the address beside the one-time password. The
// new user, who only knows the console's address, tries /login, is told
// (without learning whether any account exists) that organization
// accounts sign in at their organization's address, names the
// organization, and signs in there.
func TestBrowserWhereOrgUsersSignIn(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	acmeOrg(t, srv)
	signInURL := srv.url + "/o/acme/login"

	// The admin: the address on the org's page, copied with one click.
	ctx := newBrowser(t)
	if _, err := chromedp.CallBrowser(ctx, browser.SetPermission, browser.SetPermissionParams{
		Permission: &browser.PermissionDescriptor{Name: "clipboard-read"}, Setting: browser.PermissionSettingGranted, Origin: srv.url}); err != nil {
		t.Fatalf("grant clipboard access: %v", err)
	}
	do(t, ctx, "open the org's platform page",
		chromedp.Navigate(srv.url+"/admin/orgs/acme"),
		signIn(adminEmail, adminPassword),
		chromedp.WaitVisible(testid("org-signin-url")),
	)
	if got := text(t, ctx, testid("org-signin-url")); got != signInURL {
		t.Errorf("the org page shows the sign-in address %q, want %q", got, signInURL)
	}
	copied := func(what, id string) {
		t.Helper()
		do(t, ctx, "copy the "+what,
			chromedp.Click(testid(id+"-copy")),
			chromedp.WaitVisible(css(`[data-testid="`+id+`-copied"]:not(:empty)`)),
		)
		mustContain(t, what+" copy status", text(t, ctx, testid(id+"-copied")), "Copied")
		clip := get(t, ctx, "read the clipboard", chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise))
		if clip != signInURL {
			t.Errorf("after copying the %s the clipboard holds %q, want %q", what, clip, signInURL)
		}
	}
	copied("org page's address", "org-signin-url")

	// A new user: the address beside their one-time password.
	do(t, ctx, "add a user",
		submits(chromedp.Click(testid("enter"))),
		chromedp.WaitVisible(testid("acting-banner")),
		chromedp.Navigate(srv.url+"/o/acme/users"),
		chromedp.WaitVisible(testid("create-user")),
		chromedp.SendKeys(css(`#email`), "new.user@acme.test"),
		chromedp.SendKeys(css(`#name`), "New User"),
		chromedp.SetValue(css(`#role`), "none"),
		submits(chromedp.Click(testid("create-user"))),
		chromedp.WaitVisible(testid("one-time-password")),
	)
	otp := text(t, ctx, testid("one-time-password"))
	if got := text(t, ctx, testid("user-signin-url")); got != signInURL {
		t.Errorf("the new user's page shows the sign-in address %q, want %q", got, signInURL)
	}
	mustContain(t, "what the address is for", text(t, ctx, css(`#user-signin-url-lead`)), "sign in")
	copied("new user's address", "user-signin-url")

	// The user, at the console's front door.
	uctx := newBrowser(t)
	do(t, uctx, "try the platform sign-in",
		chromedp.Navigate(srv.url+"/login"),
		signIn("new.user@acme.test", otp),
		chromedp.WaitVisible(testid("login-error")),
	)
	refusal := text(t, uctx, testid("login-error"))
	mustContain(t, "refusal of an org account at /login", refusal, "incorrect", "organization")
	// The same words for an address that exists nowhere: nothing says
	// which accounts exist.
	do(t, uctx, "sign in with an unknown email",
		chromedp.Navigate(srv.url+"/login"),
		signIn("nobody@nowhere.test", "some password here"),
		chromedp.WaitVisible(testid("login-error")),
	)
	if other := text(t, uctx, testid("login-error")); other != refusal {
		t.Errorf("an unknown email is refused with %q, an org account with %q: the difference tells which accounts exist", other, refusal)
	}
	mustContain(t, "the way to an organization", text(t, uctx, testid("org-finder")), "Sign in to an organization", "/o/<organization>/login")
	if *updateScreenshots {
		do(t, uctx, "size the viewport", chromedp.EmulateViewport(1200, 700))
		writeScreenshot(t, get(t, uctx, "screenshot", chromedp.CaptureScreenshot()), "login.png")
		do(t, uctx, "reset the viewport", chromedp.ResetViewport())
	}

	// Naming a wrong organization says so, and keeps what was typed.
	do(t, uctx, "name an unknown organization",
		chromedp.SendKeys(css(`#org`), "acme-typo"),
		submits(chromedp.Click(testid("org-continue"))),
		chromedp.WaitVisible(testid("org-error")),
	)
	mustContain(t, "unknown organization", text(t, uctx, testid("org-error")), `No organization is called "acme-typo"`)
	if v := get(t, uctx, "org field", chromedp.Value(css(`#org`))); v != "acme-typo" {
		t.Errorf("the organization field holds %q after the refusal, want what was typed", v)
	}
	// The page it leads to has a sign-in button too: wait for the address.
	atOrgLogin := waitPath("/o/acme/login")
	// The right one (typed with capitals) leads to its sign-in page.
	do(t, uctx, "name the organization",
		chromedp.Clear(css(`#org`)),
		chromedp.SendKeys(css(`#org`), "Acme"),
		submits(chromedp.Click(testid("org-continue"))),
		atOrgLogin,
	)
	if loc := get(t, uctx, "location", chromedp.Location()); loc != signInURL {
		t.Errorf("the organization form led to %s, want %s", loc, signInURL)
	}
	mustContain(t, "org sign-in heading", text(t, uctx, css(`main h1`)), "Sign in to Acme Corp")
	do(t, uctx, "sign in to the organization",
		signIn("new.user@acme.test", otp),
		chromedp.WaitVisible(css(`#new`)),
	)
	if loc := get(t, uctx, "location", chromedp.Location()); !strings.HasSuffix(loc, "/o/acme/password") {
		t.Errorf("after signing in at the org's address the browser is at %s, want /o/acme/password", loc)
	}

	// A pasted sign-in address works as well as the short name.
	do(t, uctx, "paste the whole address",
		chromedp.Navigate(srv.url+"/login"),
		chromedp.WaitVisible(css(`#org`)),
		chromedp.SendKeys(css(`#org`), signInURL),
		submits(chromedp.Click(testid("org-continue"))),
		atOrgLogin,
	)
	if loc := get(t, uctx, "location", chromedp.Location()); loc != signInURL {
		t.Errorf("a pasted address led to %s, want %s", loc, signInURL)
	}
}

// waitPath waits until the browser is at path (after a navigation the
// page started), then for the page's sign-in button.
func waitPath(path string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		for {
			// Evaluating while the old page goes away fails; try again.
			if p, err := chromedp.Evaluate[string](`location.pathname`)(ctx, tg); err == nil && p == path {
				return chromedp.WaitVisible(testid("login-submit"))(ctx, tg)
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("the browser never reached %s: %w", path, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
