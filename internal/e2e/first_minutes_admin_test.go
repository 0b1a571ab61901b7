package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/store"
)

// stepState is one checklist step as the page shows it.
type stepState struct {
	Done bool   `json:"done"`
	Next bool   `json:"next"`
	Href string `json:"href"`
}

// checklist reads the first-run checklist off the org home; nil when the
// page has none.
func checklist(t *testing.T, ctx context.Context, base string) map[string]stepState {
	t.Helper()
	do(t, ctx, "open the org home", chromedp.Navigate(base+"/o/acme/"), chromedp.WaitVisible(testid("org-glance")))
	return evalJS[map[string]stepState](t, ctx, "read the checklist", `(() => {
		const list = document.querySelector('[data-testid="setup-checklist"]');
		if (!list) return null;
		const out = {};
		for (const li of list.querySelectorAll("li[data-testid^=step-]")) {
			out[li.dataset.testid.slice(5)] = {done: li.dataset.done === "true", next: li.dataset.next === "true",
				href: li.querySelector("a").getAttribute("href")};
		}
		return out;
	})()`)
}

// wantSteps fails unless exactly the steps in done are ticked and next is
// the one marked next.
func wantSteps(t *testing.T, got map[string]stepState, next string, done ...string) {
	t.Helper()
	if got == nil {
		t.Fatalf("no checklist on the home page (want %v done, next %q)", done, next)
	}
	isDone := map[string]bool{}
	for _, d := range done {
		isDone[d] = true
	}
	for _, k := range []string{"people", "department", "environment", "agent", "session"} {
		s, ok := got[k]
		if !ok {
			t.Errorf("the checklist has no %q step: %v", k, got)
			continue
		}
		if s.Done != isDone[k] || s.Next != (k == next) {
			t.Errorf("step %s: done %v next %v; want done %v next %v", k, s.Done, s.Next, isDone[k], k == next)
		}
	}
}

// TestBrowserFirstMinutesOrgAdmin walks issue 26's items 7-10 and 18 as
// the platform admin who creates an organization and sets it up through
// its pages: the platform page leads in, not to Delete; an empty org's
// home gives the order of steps and ticks each one as it is done; a new
// user's one-time password stays, with Copy, until dismissed; the role
// form without a department offers what can be completed; the host form
// says http and https; and the generated agentd command, run as printed
// on a PATH without Go, downloads agentd from the console, listens where
// the environment says and keeps workspaces under its own --root.
func TestBrowserFirstMinutesOrgAdmin(t *testing.T) {
	t.Parallel()
	// Built before the browser starts, so a slow build on a loaded machine
	// does not eat into the browser's deadline.
	serveAgentd, _ := agentdBuilds(t)
	srv := newServer(t, store.SQLite, serveAgentd)
	platformToken := acmeOrg(t, srv)
	ctx := newBrowser(t)
	do(t, ctx, "size the window", chromedp.EmulateViewport(1280, 900))

	t.Run("18: the org page leads in; destructive actions sit apart and look secondary", func(t *testing.T) {
		do(t, ctx, "sign in and open acme", chromedp.Navigate(srv.url+"/login"), signIn(adminEmail, adminPassword),
			chromedp.WaitVisible(testid("org-row-acme")), chromedp.Navigate(srv.url+"/admin/orgs/acme"), chromedp.WaitVisible(testid("enter")))
		type look struct {
			First           string  `json:"first"`
			EnterBg         string  `json:"enterBg"`
			DeleteBg        string  `json:"deleteBg"`
			DeleteInZone    bool    `json:"deleteInZone"`
			EnterInZone     bool    `json:"enterInZone"`
			Gap             float64 `json:"gap"`
			DeleteBesideTop bool    `json:"deleteBesideTop"`
		}
		l := evalJS[look](t, ctx, "the org page's actions", `(() => {
			const main = document.querySelector("main");
			const first = [...main.querySelectorAll("button, a.button")].find(b => b.checkVisibility());
			const enter = document.querySelector('[data-testid="enter"]'), del = document.querySelector('[data-testid="delete"]');
			const zone = document.querySelector('[data-testid="danger-zone"]');
			return {first: first.textContent.trim(), enterBg: getComputedStyle(enter).backgroundColor, deleteBg: getComputedStyle(del).backgroundColor,
				deleteInZone: zone.contains(del), enterInZone: zone.contains(enter),
				gap: del.getBoundingClientRect().top - enter.getBoundingClientRect().bottom,
				deleteBesideTop: Math.abs(del.getBoundingClientRect().top - enter.getBoundingClientRect().top) < 4};
		})()`)
		if l.First != "Enter organization" {
			t.Errorf("the first action on the org page is %q, want Enter organization", l.First)
		}
		if l.EnterBg != "rgb(11, 92, 173)" {
			t.Errorf("Enter organization's background is %s, want the accent rgb(11, 92, 173) of a main action", l.EnterBg)
		}
		if l.DeleteBg == "rgb(180, 35, 24)" || !l.DeleteInZone || l.EnterInZone || l.DeleteBesideTop || l.Gap < 40 {
			t.Errorf("Delete… looks %s, in the danger zone %v (Enter there %v), %.0f px below Enter (beside it: %v); want secondary, apart and below",
				l.DeleteBg, l.DeleteInZone, l.EnterInZone, l.Gap, l.DeleteBesideTop)
		}
		mustContain(t, "danger zone", text(t, ctx, testid("danger-zone")), "Suspend or delete", "type its slug")
	})

	t.Run("7: an empty org's home lists the steps in order, the first one next", func(t *testing.T) {
		do(t, ctx, "enter acme", submits(chromedp.Click(testid("enter"))), chromedp.WaitVisible(testid("setup-checklist")))
		steps := checklist(t, ctx, srv.url)
		wantSteps(t, steps, "people")
		order := evalJS[[]string](t, ctx, "step order", `[...document.querySelectorAll('[data-testid="setup-checklist"] li')].map(li => li.dataset.testid)`)
		if strings.Join(order, ",") != "step-people,step-department,step-environment,step-agent,step-session" {
			t.Errorf("steps in the order %q", order)
		}
		for k, want := range map[string]string{"people": "/o/acme/users", "department": "/o/acme/departments", "environment": "/o/acme/environments", "agent": "/o/acme/agents"} {
			if steps[k].Href != want {
				t.Errorf("step %s links to %q, want %q", k, steps[k].Href, want)
			}
		}
		mustContain(t, "progress", text(t, ctx, testid("checklist-progress")), "0 of 5 done")
	})

	var otp string
	t.Run("8, 9: the add form asks for a role; the one-time password stays with Copy until dismissed", func(t *testing.T) {
		do(t, ctx, "add a user without choosing a role", chromedp.Navigate(srv.url+"/o/acme/users"), chromedp.WaitVisible(testid("create-user")),
			chromedp.SendKeys(css(`#email`), "ada@acme.test"), chromedp.SendKeys(css(`#name`), "Ada"), submits(chromedp.Click(testid("create-user"))),
			chromedp.WaitVisible(testid("role-error")))
		mustContain(t, "refusal", text(t, ctx, testid("role-error")), "Choose a role for the new user")
		if v := get(t, ctx, "email kept", chromedp.Value(css(`#email`))); v != "ada@acme.test" {
			t.Errorf("the refused form kept the email %q", v)
		}
		// No department yet: department roles are offered but cannot be picked.
		disabled := evalJS[[]string](t, ctx, "disabled roles", `[...document.querySelectorAll('#role option:disabled')].map(o => o.value)`)
		if strings.Join(disabled, ",") != "member,dept-owner" {
			t.Errorf("disabled role choices %q, want member and dept-owner", disabled)
		}
		if n := evalJS[int](t, ctx, "department selects", `document.querySelectorAll('#domain').length`); n != 0 {
			t.Error("an empty department list is offered")
		}
		mustContain(t, "department needed", text(t, ctx, testid("role-needs-department")), "there is none yet", "create a department")
		if href := get(t, ctx, "link", chromedp.AttributeValue(css(`[data-testid="role-needs-department"] a`), "href")); href.Value != "/o/acme/departments" {
			t.Errorf("the department link goes to %q", href.Value)
		}
		do(t, ctx, "add her as an auditor", choose(`#role`, "auditor"), submits(chromedp.Click(testid("create-user"))),
			chromedp.WaitVisible(testid("one-time-password")))
		otp = text(t, ctx, testid("one-time-password"))
		if len(otp) < 12 {
			t.Fatalf("one-time password %q", otp)
		}
		if got := text(t, ctx, testid("role-name")); got != "Auditor" {
			t.Errorf("the new user holds %q, want the Auditor role chosen in the add form", got)
		}
		if loc := get(t, ctx, "location", chromedp.Location()); strings.Contains(loc, otp) {
			t.Errorf("the password is in the address %s", loc)
		}
		do(t, ctx, "copy it", chromedp.Click(testid("one-time-password-copy")), waitNonEmpty(testid("one-time-password-copied")))
		// The user page's role form assumes nothing.
		if v := get(t, ctx, "role", chromedp.Value(css(`#role`))); v != "" {
			t.Errorf("the role form starts at %q, want \"Choose a role…\"", v)
		}
		do(t, ctx, "assign without choosing", submits(chromedp.Click(testid("assign-role"))), chromedp.WaitVisible(testid("role-error")))
		mustContain(t, "refusal", text(t, ctx, testid("role-error")), "Choose a role to give.")
		do(t, ctx, "make her an org admin too", choose(`#role`, "org-admin"), submits(chromedp.Click(testid("assign-role"))), chromedp.WaitVisible(testid("flash")))
		if got := strings.Join(evalJS[[]string](t, ctx, "roles", `[...document.querySelectorAll('[data-testid="role-name"]')].map(e => e.textContent.trim())`), ","); !strings.Contains(got, "Auditor") || !strings.Contains(got, "Org admin") {
			t.Errorf("roles after assigning %q", got)
		}
		if got := text(t, ctx, testid("one-time-password")); got != otp {
			t.Errorf("after assigning a role the password reads %q, want it still shown (%q)", got, otp)
		}
		do(t, ctx, "reload", chromedp.Reload(), chromedp.WaitVisible(testid("one-time-password")))
		do(t, ctx, "dismiss it", submits(chromedp.Click(testid("dismiss-password"))), chromedp.WaitVisible(testid("role-name")))
		do(t, ctx, "reload after dismissing", chromedp.Reload(), chromedp.WaitVisible(testid("role-name")))
		noSecretInPage(t, ctx, "the user page after dismissing", otp)
		// The password works as shown.
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": "ada@acme.test", "password": otp}, http.StatusOK, nil)
		wantSteps(t, checklist(t, ctx, srv.url), "department", "people")
	})

	t.Run("8: a new API key stays with a curl example that works", func(t *testing.T) {
		do(t, ctx, "create a key", chromedp.Navigate(srv.url+"/o/acme/api-keys"), chromedp.WaitVisible(testid("create-key")),
			chromedp.SendKeys(css(`#name`), "ci"), submits(chromedp.Click(testid("create-key"))), chromedp.WaitVisible(testid("new-key-secret")))
		secret := text(t, ctx, testid("new-key-secret"))
		mustContain(t, "usage", text(t, ctx, testid("key-usage")), "Authorization: Bearer")
		curl := text(t, ctx, testid("key-curl"))
		want := `curl -H "Authorization: Bearer $GATEHOUSE_API_KEY" ` + srv.url + "/api/v1/orgs/acme/me"
		if curl != want {
			t.Errorf("curl example %q, want %q", curl, want)
		}
		if strings.Contains(curl, secret) {
			t.Error("the curl example holds the key itself")
		}
		// Run it as printed.
		cmd := exec.Command("sh", "-c", curl+" -s -f")
		cmd.Env = append(os.Environ(), "GATEHOUSE_API_KEY="+secret)
		if out, err := cmd.CombinedOutput(); err != nil || !bytes.Contains(out, []byte(`"kind":"api_key"`)) {
			t.Errorf("the curl example answered %v: %s", err, out)
		}
		do(t, ctx, "reload the keys page", chromedp.Reload(), chromedp.WaitVisible(testid("new-key-secret")))
		do(t, ctx, "dismiss the key", submits(chromedp.Click(testid("dismiss-key"))), chromedp.WaitNotPresent(testid("new-key-secret")))
		noSecretInPage(t, ctx, "the keys page after dismissing", secret)
	})

	t.Run("7, 9: a department ticks its step and the add form asks for the department of a member", func(t *testing.T) {
		do(t, ctx, "create a department", chromedp.Navigate(srv.url+"/o/acme/departments"), chromedp.WaitVisible(testid("create-department")),
			chromedp.SendKeys(css(`#name`), "Research"), submits(chromedp.Click(testid("create-department"))), chromedp.WaitVisible(testid("flash")))
		wantSteps(t, checklist(t, ctx, srv.url), "environment", "people", "department")
		if *updateScreenshots {
			writeScreenshot(t, get(t, ctx, "screenshot", chromedp.CaptureScreenshot()), "org-first-run.png")
		}
		do(t, ctx, "open the users", chromedp.Navigate(srv.url+"/o/acme/users"), chromedp.WaitVisible(testid("create-user")))
		if n := evalJS[int](t, ctx, "hint", `document.querySelectorAll('[data-testid="role-needs-department"]').length`); n != 0 {
			t.Error("the department hint stays once a department exists")
		}
		if v := get(t, ctx, "role", chromedp.Value(css(`#role`))); v != "" {
			t.Errorf("with a department the add form starts at %q, want \"Choose a role…\"", v)
		}
		// The department is asked for only when the role needs one.
		do(t, ctx, "choose auditor", choose(`#role`, "auditor"), chromedp.WaitNotVisible(testid("role-department")))
		do(t, ctx, "choose member", choose(`#role`, "member"), chromedp.WaitVisible(css(`#domain`)))
		do(t, ctx, "add Bob as a member of Research", chromedp.SendKeys(css(`#email`), "bob@acme.test"),
			chromedp.SetValue(css(`#domain`), get(t, ctx, "Research", chromedp.AttributeValue(css(`#domain option:nth-child(2)`), "value")).Value),
			submits(chromedp.Click(testid("create-user"))), chromedp.WaitVisible(testid("one-time-password")))
		if got := text(t, ctx, testid("role-name")) + " in " + text(t, ctx, css(`[data-testid="role-name"] + td`)); got != "Member in department Research" {
			t.Errorf("Bob holds %q, want Member in department Research", got)
		}
		if v := get(t, ctx, "role", chromedp.Value(css(`#role`))); v != "" {
			t.Errorf("with a department the user page's role form starts at %q, want \"Choose a role…\"", v)
		}
		do(t, ctx, "dismiss Bob's password", submits(chromedp.Click(testid("dismiss-password"))), chromedp.WaitVisible(testid("role-name")))
	})

	t.Run("10: the host form says http and https; the command runs as printed", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		do(t, ctx, "open environments", chromedp.Navigate(srv.url+"/o/acme/environments"), chromedp.WaitVisible(testid("save-env")),
			chromedp.SetValue(css(`#kind`), "host"))
		mustContain(t, "URL help", text(t, ctx, css(`#url-help`)), "http://build-01:49984", "plain HTTP", "https://build-01", "TLS proxy")
		linuxID, platform := ownLinuxCommand()
		do(t, ctx, "add a host at 127.0.0.1", chromedp.SendKeys(css(`#name`), "laptop"), chromedp.SendKeys(css(`#url`), "http://"+addr),
			submits(chromedp.Click(testid("save-env"))), chromedp.WaitVisible(testid(linuxID)))
		line := text(t, ctx, testid(linuxID))
		for _, want := range []string{"curl -fsSLo agentd " + srv.url + "/downloads/agentd/" + platform + " && ", "| sha256sum -c && ",
			"--listen " + addr, "--root $HOME/gatehouse-agentd", "mkdir -p $HOME/gatehouse-agentd && "} {
			if !strings.Contains(line, want) {
				t.Errorf("the Linux command %q lacks %q", line, want)
			}
		}
		if strings.Contains(line, "0.0.0.0") {
			t.Errorf("the command for an environment at %s listens on every interface: %q", addr, line)
		}
		mustContain(t, "where", text(t, ctx, testid("connect-where")), "listens on "+addr, "--root")
		win := text(t, ctx, testid("cmd-windows"))
		mustContain(t, "Windows command", win, "--listen "+addr, `--root "$env:USERPROFILE\gatehouse-agentd"`, "New-Item")

		home := runOnHostWithoutGo(t, line)
		do(t, ctx, "the page sees agentd answer", chromedp.WaitVisible(css(`[data-testid="connect-status"][data-state="healthy"]`)))
		wantSteps(t, checklist(t, ctx, srv.url), "agent", "people", "department", "environment")

		// Workspaces land under agentd's own root, not where it started.
		var entered struct{ Token string }
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", platformToken, nil, http.StatusOK, &entered)
		var envs struct{ Items []struct{ ID int64 } }
		callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/environments", entered.Token, nil, http.StatusOK, &envs)
		var agent struct{ ID int64 }
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/agents", entered.Token, map[string]any{"name": "helper",
			"config": map[string]string{"model": "m"}, "environment_ids": []int64{envs.Items[0].ID}}, http.StatusCreated, &agent)
		steps := checklist(t, ctx, srv.url)
		wantSteps(t, steps, "session", "people", "department", "environment", "agent")
		do(t, ctx, "start the first session from the checklist", submits(chromedp.Click(css(`[data-testid="step-session"] a`))),
			submits(chromedp.Click(testid("new-session"))), chromedp.WaitVisible(testid("session-facts")))
		loc := get(t, ctx, "location", chromedp.Location())
		sid := loc[strings.LastIndex(loc, "/")+1:]
		var out struct {
			State  string
			Chunks []struct{ Data []byte }
		}
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/sessions/"+sid+"/commands", entered.Token,
			map[string]any{"command": "pwd", "wait_ms": 20000}, http.StatusCreated, &out)
		var pwd strings.Builder
		for _, c := range out.Chunks {
			pwd.Write(c.Data)
		}
		root, _ := filepath.EvalSymlinks(filepath.Join(home, "gatehouse-agentd"))
		if got := strings.TrimSpace(pwd.String()); !strings.HasPrefix(got, root+string(filepath.Separator)) {
			t.Errorf("the session's workspace is %q (state %s), want a directory under agentd's --root %s", got, out.State, root)
		}
		if steps := checklist(t, ctx, srv.url); steps != nil {
			t.Errorf("the checklist stays after every step is done: %v", steps)
		}
	})

	t.Run("6: at the E2B step an entered platform admin is told who can mint and how to become one", func(t *testing.T) {
		do(t, ctx, "open the E2B page", chromedp.Navigate(srv.url+"/o/acme/e2b"), chromedp.WaitVisible(testid("e2b-cannot-mint")))
		mustContain(t, "why not", text(t, ctx, testid("e2b-cannot-mint")), "acting here as platform admin", "cannot mint e2b keys", "personal API keys")
		mustContain(t, "who can", text(t, ctx, testid("e2b-who-can-mint")), "org admin", "member or department owner of the agent's department")
		if n := evalJS[int](t, ctx, "mint form", `document.querySelectorAll('[data-testid="mint-e2b-key"]').length`); n != 0 {
			t.Error("a platform admin is offered a mint form that would refuse them")
		}
		mustContain(t, "where to sign in", text(t, ctx, testid("e2b-signin-url")), srv.url+"/o/acme")
		do(t, ctx, "add yourself as a user", submits(chromedp.Click(testid("e2b-add-self"))), chromedp.WaitVisible(testid("create-user")))
		if v := get(t, ctx, "email", chromedp.Value(css(`#email`))); v != adminEmail {
			t.Errorf("the add form is filled in with %q, want the admin's own email %s", v, adminEmail)
		}
		do(t, ctx, "add yourself as an org admin", choose(`#role`, "org-admin"), submits(chromedp.Click(testid("create-user"))),
			chromedp.WaitVisible(testid("one-time-password")))
		if got := text(t, ctx, testid("role-name")); got != "Org admin" {
			t.Errorf("the new user holds %q, want Org admin", got)
		}
		// As that user the same step mints a key.
		otp := text(t, ctx, testid("one-time-password"))
		var own struct{ Token string }
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": adminEmail, "password": otp}, http.StatusOK, &own)
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/password", own.Token,
			map[string]string{"current_password": otp, "new_password": "another long and private passphrase"}, http.StatusNoContent, nil)
		uctx := newBrowser(t)
		do(t, uctx, "sign in as that user and open the E2B page", chromedp.Navigate(srv.url+"/o/acme/login"), signIn(adminEmail, "another long and private passphrase"),
			chromedp.WaitVisible(css(`nav[aria-label="Main"]`)), chromedp.Navigate(srv.url+"/o/acme/e2b"), chromedp.WaitVisible(testid("e2b-endpoint")))
		if n := evalJS[int](t, uctx, "refusal", `document.querySelectorAll('[data-testid="e2b-cannot-mint"]').length`); n != 0 {
			t.Errorf("as a user of the org the page still says they cannot mint: %s", text(t, uctx, testid("e2b-cannot-mint")))
		}
	})
}

// waitNonEmpty waits until the element has some text.
func waitNonEmpty(sel chromedp.CSS) chromedp.Action[chromedp.Void] {
	js := `(document.querySelector(` + fmt.Sprintf("%q", string(sel)) + `)?.textContent.trim() ?? "") !== ""`
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		for {
			if ok, err := chromedp.Evaluate[bool](js)(ctx, tg); err == nil && ok {
				return chromedp.Void{}, nil
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("%s stayed empty: %w", sel, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
