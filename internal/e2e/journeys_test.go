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

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// consoleWorld is an organization with something in it, built through the
// JSON API as its admins would: a department with an owner and a member,
// a host environment on a real agentd, an agent on it and a session.
type consoleWorld struct {
	srv                          *server
	platformToken, orgToken      string
	deptID, envID, agentID       int64
	sessionID                    int64
	ownerID, memberID            int64
	ownerEmail, memberEmail, pwd string
}

func newConsoleWorld(t *testing.T) *consoleWorld {
	t.Helper()
	w := &consoleWorld{srv: newServer(t, store.SQLite), ownerEmail: "olive@acme.test", memberEmail: "mia@acme.test",
		pwd: "a long and private passphrase"}
	base := w.srv.url
	var login, entered struct{ Token string }
	callAPI(t, base, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	w.platformToken = login.Token
	callAPI(t, base, http.MethodPost, "/api/v1/orgs", w.platformToken, map[string]string{"slug": "acme", "name": "Acme Corp"}, http.StatusCreated, nil)
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/enter", w.platformToken, nil, http.StatusOK, &entered)
	w.orgToken = entered.Token
	var dept, env, agent, sess struct{ ID int64 }
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/departments", w.orgToken, map[string]string{"name": "Research"}, http.StatusCreated, &dept)
	w.deptID = dept.ID
	agentdURL, agentdToken := agentdtest.Start(t)
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/environments", w.orgToken, map[string]any{"name": "build-01", "kind": "host",
		"url": agentdURL, "os": "linux", "deployment": "bare-metal", "agentd_token": agentdToken}, http.StatusCreated, &env)
	w.envID = env.ID
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/environments/"+idStr(env.ID)+"/test", w.orgToken, nil, http.StatusOK, nil)
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/agents", w.orgToken, map[string]any{"name": "triage-bot", "department_id": w.deptID,
		"config": map[string]string{"model": "claude-sonnet-4"}, "sandbox_mode": "off", "environment_ids": []int64{env.ID},
		"default_environment_id": env.ID}, http.StatusCreated, &agent)
	w.agentID = agent.ID
	w.ownerID = w.addUser(t, w.ownerEmail, "Olive Owner", "dept-owner")
	w.memberID = w.addUser(t, w.memberEmail, "Mia Member", "member")
	var memberLogin struct{ Token string }
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": w.memberEmail, "password": w.pwd}, http.StatusOK, &memberLogin)
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/sessions", memberLogin.Token, map[string]any{"agent_id": agent.ID}, http.StatusCreated, &sess)
	w.sessionID = sess.ID
	return w
}

// addUser creates a user with role in the department and sets their
// password, so they can sign in with w.pwd.
func (w *consoleWorld) addUser(t *testing.T, email, name, role string) int64 {
	t.Helper()
	return w.addUserIn(t, email, name, role, "dept:"+idStr(w.deptID))
}

// addUserIn creates a user holding role in domain ("org" or "dept:<id>"),
// with password w.pwd.
func (w *consoleWorld) addUserIn(t *testing.T, email, name, role, domain string) int64 {
	t.Helper()
	var u struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/users", w.orgToken, map[string]string{"email": email, "name": name}, http.StatusCreated, &u)
	callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/roles", w.orgToken, map[string]string{"subject": "user:" + idStr(u.User.ID),
		"role": role, "domain": domain}, http.StatusNoContent, nil)
	var otp struct{ Token string }
	callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": email, "password": u.OneTimePassword}, http.StatusOK, &otp)
	callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/password", otp.Token,
		map[string]string{"current_password": u.OneTimePassword, "new_password": w.pwd}, http.StatusNoContent, nil)
	return u.User.ID
}

// asPlatformAdmin signs the browser in on the platform pages and enters
// acme through its page, as a platform admin does.
func (w *consoleWorld) asPlatformAdmin(t *testing.T) context.Context {
	t.Helper()
	ctx := newBrowser(t)
	do(t, ctx, "sign in as the platform admin and enter acme",
		chromedp.Navigate(w.srv.url+"/login"),
		signIn(adminEmail, adminPassword),
		chromedp.WaitVisible(testid("org-row-acme")),
		chromedp.Navigate(w.srv.url+"/admin/orgs/acme"),
		submits(chromedp.Click(testid("enter"))),
		chromedp.WaitVisible(testid("org-glance")),
	)
	return ctx
}

// asOrgUser signs the browser in at the org's sign-in page.
func (w *consoleWorld) asOrgUser(t *testing.T, email string) context.Context {
	t.Helper()
	ctx := newBrowser(t)
	do(t, ctx, "sign in as "+email,
		chromedp.Navigate(w.srv.url+"/o/acme/login"),
		signIn(email, w.pwd),
		chromedp.WaitVisible(testid("org-glance")),
	)
	return ctx
}

func idStr(n int64) string { return strconv.FormatInt(n, 10) }

// evalJS evaluates a JavaScript expression in the page.
func evalJS[T any](t *testing.T, ctx context.Context, what, js string) T {
	t.Helper()
	return get(t, ctx, what, chromedp.Evaluate[T](js))
}

// noOneClickDanger fails when the page has a danger button outside the
// confirmation disclosure.
func noOneClickDanger(t *testing.T, ctx context.Context, page string) {
	t.Helper()
	bare := evalJS[[]string](t, ctx, "danger buttons", `Array.from(document.querySelectorAll("button.danger, .button.danger"))
		.filter(b => !b.closest("details.confirm") && !b.matches("a")).map(b => b.textContent.trim())`)
	if len(bare) > 0 {
		t.Errorf("%s: one-click destructive buttons %q", page, bare)
	}
}

// TestBrowserLeastPowerfulDefaults is issue 13's journey 5: every form
// starts on the least powerful choice the viewer may make and offers
// nothing the server would refuse.
func TestBrowserLeastPowerfulDefaults(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)

	t.Run("platform admin: service keys only, auditor first", func(t *testing.T) {
		ctx := w.asPlatformAdmin(t)
		do(t, ctx, "open API keys", chromedp.Navigate(w.srv.url+"/o/acme/api-keys"), chromedp.WaitVisible(testid("key-kind")))
		mustContain(t, "kind explanation", text(t, ctx, testid("service-only")), "service key", "platform admin")
		if n := evalJS[int](t, ctx, "personal choices", `document.querySelectorAll('input[name="kind"][value="personal"]').length`); n != 0 {
			t.Errorf("a platform admin is offered a personal key (%d choices)", n)
		}
		if role := get(t, ctx, "role", chromedp.Value(css(`select[name="role"]`))); role != "auditor" {
			t.Errorf("service key role starts at %q, want auditor", role)
		}
		// The preselected choice works, and after the redirect a reload
		// creates no second key; the key stays until dismissed (issue 26
		// item 8), then is gone for good.
		do(t, ctx, "create a key with the defaults",
			chromedp.SendKeys(css(`#name`), "ci"),
			submits(chromedp.Click(testid("create-key"))),
			chromedp.WaitVisible(testid("new-key-secret")),
		)
		if loc := get(t, ctx, "location", chromedp.Location()); !strings.HasSuffix(loc, "/o/acme/api-keys") {
			t.Errorf("after creating a key the browser is at %s", loc)
		}
		mustContain(t, "key row", text(t, ctx, testid("keys-table")), "ci", "service", "Auditor (whole organization)")
		do(t, ctx, "reload", chromedp.Reload(), chromedp.WaitVisible(testid("keys-table")))
		if n := evalJS[int](t, ctx, "secrets after reload", `document.querySelectorAll('[data-testid="new-key-secret"]').length`); n != 1 {
			t.Error("the key's secret is gone after a reload, before it was dismissed")
		}
		do(t, ctx, "dismiss the key", submits(chromedp.Click(testid("dismiss-key"))), chromedp.WaitNotPresent(testid("new-key-secret")),
			chromedp.Reload(), chromedp.WaitVisible(testid("keys-table")))
		if n := evalJS[int](t, ctx, "secrets after dismissing", `document.querySelectorAll('[data-testid="new-key-secret"]').length`); n != 0 {
			t.Error("the key's secret is shown again after it was dismissed")
		}
		if rows := evalJS[int](t, ctx, "key rows", `document.querySelectorAll('[data-testid="keys-table"] tbody tr').length`); rows != 1 {
			t.Errorf("%d keys after a reload, want 1 (the form was resubmitted)", rows)
		}
	})

	t.Run("department owner: the agent form starts on their department", func(t *testing.T) {
		ctx := w.asOrgUser(t, w.ownerEmail)
		do(t, ctx, "open agents", chromedp.Navigate(w.srv.url+"/o/acme/agents"), chromedp.WaitVisible(css(`#adept`)))
		if v := get(t, ctx, "department", chromedp.Value(css(`#adept`))); v != idStr(w.deptID) {
			t.Errorf("department starts at %q, want Research (%d)", v, w.deptID)
		}
		opts := evalJS[[]string](t, ctx, "department choices", `Array.from(document.querySelectorAll('#adept option')).map(o => o.textContent.trim())`)
		if len(opts) != 1 || opts[0] != "Research" {
			t.Errorf("a department owner is offered %q, want only Research", opts)
		}
	})

	t.Run("org admin: role assignment starts at no role, then least powerful first", func(t *testing.T) {
		ctx := w.asPlatformAdmin(t)
		do(t, ctx, "open a user", chromedp.Navigate(w.srv.url+"/o/acme/users/"+idStr(w.memberID)), chromedp.WaitVisible(css(`#role`)))
		if v := get(t, ctx, "role", chromedp.Value(css(`#role`))); v != "" {
			t.Errorf("role assignment starts at %q, want \"Choose a role…\"", v)
		}
		opts := evalJS[[]string](t, ctx, "role choices", `Array.from(document.querySelectorAll('#role option')).map(o => o.value)`)
		if strings.Join(opts, ",") != ",member,dept-owner,auditor,org-admin" {
			t.Errorf("roles offered in the order %q, want least powerful first", opts)
		}
	})
}

// TestBrowserEnvironmentFormKinds is journey 6: the environment form shows
// only the chosen kind's settings and says what each kind requires.
func TestBrowserEnvironmentFormKinds(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := w.asPlatformAdmin(t)
	visible := func(kind string) bool {
		return evalJS[bool](t, ctx, kind+" section", `(() => { const f = document.querySelector('fieldset[data-kind="`+kind+`"]');
			return !!f && getComputedStyle(f).display !== "none" && !f.disabled })()`)
	}
	do(t, ctx, "open environments", chromedp.Navigate(w.srv.url+"/o/acme/environments"), chromedp.WaitVisible(css(`#kind`)))
	mustContain(t, "required fields", text(t, ctx, testid("env-required")), "Required for a host", "agentd token", "sandbox domain or a proxy base URL")
	if !visible("host") || visible("sandbox") {
		t.Errorf("with host chosen: host section shown %v, sandbox section shown %v", visible("host"), visible("sandbox"))
	}
	evalJS[bool](t, ctx, "choose sandbox", `(() => { const s = document.querySelector('#kind'); s.value = "sandbox"; s.dispatchEvent(new Event("change")); return true })()`)
	if visible("host") || !visible("sandbox") {
		t.Errorf("with sandbox chosen: host section shown %v, sandbox section shown %v", visible("host"), visible("sandbox"))
	}
	do(t, ctx, "open the host environment", chromedp.Navigate(w.srv.url+"/o/acme/environments/"+idStr(w.envID)), chromedp.WaitVisible(testid("save-env")))
	if n := evalJS[int](t, ctx, "sandbox fields", `document.querySelectorAll('#sandbox_domain, #proxy_base_url, #api_key, fieldset[data-kind="sandbox"]').length`); n != 0 {
		t.Errorf("a host's edit form has %d sandbox fields", n)
	}
	mustContain(t, "edit form requirements", text(t, ctx, testid("env-required")), "Required for a host")
	if strings.Contains(text(t, ctx, testid("env-required")), "sandbox backend") {
		t.Error("a host's edit form lists what a sandbox backend requires")
	}
	// A field the server refuses is marked in the danger colour, not only
	// by its message (the 3:1 control border must not override it).
	do(t, ctx, "save a name the server refuses", chromedp.SetValue(css(`#name`), strings.Repeat("n", 101)), submits(chromedp.Click(testid("save-env"))),
		chromedp.WaitVisible(testid("name-error")))
	if got := evalJS[string](t, ctx, "name border", `getComputedStyle(document.querySelector('#name')).borderTopColor`); got != "rgb(180, 35, 24)" {
		t.Errorf("the refused name field's border is %s, want the danger colour rgb(180, 35, 24)", got)
	}
}

// TestBrowserOneConfirmationPattern is journey 7: everything that locks
// people out or removes access asks first, the same way, saying what
// will happen.
func TestBrowserOneConfirmationPattern(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := w.asPlatformAdmin(t)
	user := w.srv.url + "/o/acme/users/" + idStr(w.memberID)

	do(t, ctx, "open the member", chromedp.Navigate(user), chromedp.WaitVisible(testid("disable-user-open")))
	if evalJS[bool](t, ctx, "disable visible", `document.querySelector('[data-testid="disable-user"]').checkVisibility()`) {
		t.Error("Disable acts on the first click")
	}
	do(t, ctx, "open the confirmation", chromedp.Click(testid("disable-user-open")), chromedp.WaitVisible(testid("disable-user")))
	mustContain(t, "consequence", text(t, ctx, css(`[data-testid="disable-user-confirm"] [data-testid="consequence"]`)), w.memberEmail, "signed out", "cannot sign in")
	do(t, ctx, "disable", submits(chromedp.Click(testid("disable-user"))), chromedp.WaitVisible(testid("enable-user")))
	if st := text(t, ctx, css(`dl.facts [data-testid="status"]`)); st != "disabled" {
		t.Errorf("status after disabling %q", st)
	}

	role := "remove-role-member-dept:" + idStr(w.deptID)
	do(t, ctx, "open the role removal", chromedp.Click(testid(role+"-open")), chromedp.WaitVisible(testid(role)))
	mustContain(t, "role consequence", text(t, ctx, css(`[data-testid="`+role+`-confirm"] [data-testid="consequence"]`)), w.memberEmail, "Member (Research)")
	do(t, ctx, "remove the role", submits(chromedp.Click(testid(role))), chromedp.WaitNotPresent(testid(role+"-open")))
	if n := evalJS[int](t, ctx, "roles left", `document.querySelectorAll('[data-testid="role-name"]').length`); n != 0 {
		t.Errorf("%d roles left after removing the only one", n)
	}

	// Every page with a destructive action uses the same disclosure.
	callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/api-keys", w.orgToken, map[string]any{"name": "svc", "service": true,
		"roles": []map[string]string{{"role": "auditor", "domain": "org"}}}, http.StatusCreated, nil)
	for _, p := range []string{
		"/o/acme/users/" + idStr(w.ownerID), "/o/acme/departments/" + idStr(w.deptID), "/o/acme/environments/" + idStr(w.envID),
		"/o/acme/agents/" + idStr(w.agentID), "/o/acme/sessions/" + idStr(w.sessionID), "/o/acme/api-keys", "/admin/orgs/acme",
	} {
		do(t, ctx, "open "+p, chromedp.Navigate(w.srv.url+p), chromedp.WaitReady(css(`main`)))
		noOneClickDanger(t, ctx, p)
		if n := evalJS[int](t, ctx, "confirmations", `document.querySelectorAll('details.confirm [data-testid="consequence"]').length`); n == 0 {
			t.Errorf("%s: no confirmation with a consequence sentence", p)
		}
	}
	do(t, ctx, "the org page's suspend asks first", chromedp.Navigate(w.srv.url+"/admin/orgs/acme"), chromedp.Click(testid("suspend-open")), chromedp.WaitVisible(testid("suspend")))
	mustContain(t, "suspend consequence", text(t, ctx, css(`[data-testid="suspend-confirm"] [data-testid="consequence"]`)), "signed out", "until you resume")
}

// TestBrowserPeoplesWords is journey 8: no Go types, casbin role names or
// diverging action names reach a page.
func TestBrowserPeoplesWords(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := w.asPlatformAdmin(t)

	do(t, ctx, "submit an agent whose configuration is a string",
		chromedp.Navigate(w.srv.url+"/o/acme/agents"),
		chromedp.WaitVisible(css(`#aname`)),
		chromedp.SendKeys(css(`#aname`), "stringly"),
		chromedp.SetValue(css(`#config`), `"claude-sonnet-4"`),
		chromedp.Click(css(`input[name="environment_ids"][value="`+idStr(w.envID)+`"]`)),
		chromedp.Click(css(`input[name="default_environment_id"][value="`+idStr(w.envID)+`"]`)),
		submits(chromedp.Click(testid("save-agent"))),
		chromedp.WaitVisible(css(`#config-error`)),
	)
	msg := text(t, ctx, css(`#config-error`))
	mustContain(t, "config error", msg, "must be an object", "not text")
	for _, internal := range []string{"Go value", "unmarshal", "agents.Config"} {
		if strings.Contains(msg, internal) {
			t.Errorf("the config error shows %q: %s", internal, msg)
		}
	}

	do(t, ctx, "open users", chromedp.Navigate(w.srv.url+"/o/acme/users"), chromedp.WaitVisible(testid("users-table")))
	mustContain(t, "roles column", text(t, ctx, testid("user-row-"+w.ownerEmail)), "Department owner (Research)")
	if strings.Contains(text(t, ctx, testid("users-table")), "@") && strings.Contains(text(t, ctx, testid("users-table")), "dept-owner") {
		t.Error("the users page shows casbin role names")
	}

	// The audit filter's own example finds the org's creation and the
	// admin's entry, named the same as in the platform log.
	do(t, ctx, "follow the audit example", chromedp.Navigate(w.srv.url+"/o/acme/audit"), submits(chromedp.Click(testid("audit-example"))), chromedp.WaitVisible(testid("audit-table")))
	actions := text(t, ctx, testid("audit-table"))
	mustContain(t, "org log under action:org.", actions, "org.create", "org.enter")
	do(t, ctx, "the platform log", chromedp.Navigate(w.srv.url+"/admin/audit?q="+url.QueryEscape("action:org.")), chromedp.WaitVisible(testid("audit-table")))
	mustContain(t, "platform log under action:org.", text(t, ctx, testid("audit-table")), "org.create", "org.enter")
}

// TestBrowserAuditSearch is journey 9: actor by any-case prefix, dates
// from date inputs, a count, and a table that fits 1280 px.
func TestBrowserAuditSearch(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := w.asPlatformAdmin(t)
	do(t, ctx, "size the window", chromedp.EmulateViewport(1280, 900))
	do(t, ctx, "search by the start of a name in capitals",
		chromedp.Navigate(w.srv.url+"/o/acme/audit"),
		chromedp.WaitVisible(css(`#q`)),
		chromedp.SendKeys(css(`#q`), "actor:OLIVE@"),
		submits(chromedp.Click(testid("audit-search"))),
		chromedp.WaitVisible(testid("audit-count")),
	)
	count := text(t, ctx, testid("audit-count"))
	if !regexp.MustCompile(`^\d+ events? match`).MatchString(count) || strings.HasPrefix(count, "0 ") {
		t.Errorf("count for actor:OLIVE@ is %q", count)
	}
	rows := evalJS[[]string](t, ctx, "actors", `Array.from(document.querySelectorAll('[data-testid="audit-row"] td:nth-child(3)')).map(td => td.textContent)`)
	for _, r := range rows {
		if !strings.Contains(r, w.ownerEmail) {
			t.Errorf("actor:OLIVE@ listed an event by %q", r)
		}
	}
	if n, _ := strconv.Atoi(strings.Fields(count)[0]); n != len(rows) {
		t.Errorf("the count says %q but the page lists %d events", count, len(rows))
	}
	if typ := evalJS[string](t, ctx, "date input", `document.querySelector('#from').type`); typ != "date" {
		t.Errorf("the from field is a %q input, want date", typ)
	}
	do(t, ctx, "pick a range in the future",
		chromedp.SetValue(css(`#from`), "2099-01-01"),
		submits(chromedp.Click(testid("audit-search"))),
		chromedp.WaitVisible(testid("audit-empty")),
	)
	mustContain(t, "future count", text(t, ctx, testid("audit-count")), "0 events match")
	if v := get(t, ctx, "from kept", chromedp.Value(css(`#from`))); v != "2099-01-01" {
		t.Errorf("the date input shows %q after the search", v)
	}
	if v := get(t, ctx, "query kept", chromedp.Value(css(`#q`))); v != "actor:OLIVE@" {
		t.Errorf("the search box shows %q, want the filter without the dates", v)
	}
	do(t, ctx, "verify the chain", chromedp.Navigate(w.srv.url+"/o/acme/audit"), submits(chromedp.Click(testid("verify-chain"))), chromedp.WaitVisible(testid("flash")))
	mustContain(t, "verification", text(t, ctx, testid("flash")), "Chain intact")
	if nav := evalJS[string](t, ctx, "navigation", `performance.getEntriesByType("navigation")[0].type`); nav != "navigate" {
		t.Errorf("after verifying, the page was reached by %q, not a redirect to a GET", nav)
	}
	do(t, ctx, "reload after verifying", chromedp.Reload(), chromedp.WaitVisible(testid("audit-table")))
	if n := evalJS[int](t, ctx, "flash after reload", `document.querySelectorAll('[data-testid="flash"]').length`); n != 0 {
		t.Error("a reload after verifying shows the result again (the POST was repeated)")
	}
	do(t, ctx, "the whole log", chromedp.Navigate(w.srv.url+"/o/acme/audit"), chromedp.WaitVisible(testid("audit-table")))
	if wide := evalJS[int](t, ctx, "page width", `document.documentElement.scrollWidth`); wide > 1280 {
		t.Errorf("the audit page is %d px wide at a 1280 px window", wide)
	}
	if brk := evalJS[string](t, ctx, "details wrapping", `(() => { const c = getComputedStyle(document.querySelector(".details")); return c.wordBreak + "/" + c.overflowWrap })()`); brk != "normal/normal" {
		t.Errorf("JSON details wrap with %s, want normal/normal (no mid-word breaks)", brk)
	}
}

// TestBrowserConceptsAndNavigation is journey 10: the org home shows the
// org at a glance, pages explain their words with a link to the docs,
// lists sort and page, the template list says where templates come from,
// and the small-screen and contrast details hold.
func TestBrowserConceptsAndNavigation(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := w.asPlatformAdmin(t)
	do(t, ctx, "home", chromedp.Navigate(w.srv.url+"/o/acme/"), chromedp.WaitVisible(testid("org-glance")))
	mustContain(t, "agents at a glance", text(t, ctx, testid("glance-agents")), "1", "triage-bot")
	mustContain(t, "environments at a glance", text(t, ctx, testid("glance-envs")), "build-01")
	if h := text(t, ctx, css(`[data-testid="glance-envs"] [data-testid="status"]`)); h != "healthy" {
		t.Errorf("the home page shows build-01 as %q, want healthy", h)
	}
	mustContain(t, "roles at a glance", text(t, ctx, testid("my-roles")), "Org admin", "as platform admin")
	mustContain(t, "sessions at a glance", text(t, ctx, testid("sessions-table")), "triage-bot", w.memberEmail)
	mustContain(t, "recent activity", text(t, ctx, testid("glance-activity")), "session.create")

	for _, p := range []string{"/o/acme/", "/o/acme/agents", "/o/acme/agents/" + idStr(w.agentID), "/o/acme/environments",
		"/o/acme/environments/" + idStr(w.envID), "/o/acme/sessions"} {
		do(t, ctx, "open "+p, chromedp.Navigate(w.srv.url+p), chromedp.WaitVisible(testid("concepts")))
		mustContain(t, p+" concepts", text(t, ctx, testid("concepts")), "Agent", "Execution environment", "Template", "Sandbox mode")
	}
	do(t, ctx, "follow the docs link", submits(chromedp.Click(testid("concepts-doc"))), chromedp.WaitVisible(testid("doc")))
	mustContain(t, "docs page", text(t, ctx, css(`[data-testid="doc"] h1`)), "Agents, execution environments and templates")

	do(t, ctx, "agent form without templates", chromedp.Navigate(w.srv.url+"/o/acme/agents"), chromedp.WaitVisible(testid("templates-none")))
	mustContain(t, "template hint", text(t, ctx, testid("templates-none")), "import one", "Environments")
	if href := evalJS[string](t, ctx, "hint link", `document.querySelector('[data-testid="templates-none"] a').getAttribute("href")`); href != "/o/acme/environments" {
		t.Errorf("the template hint links to %q", href)
	}

	// Sorting: a second agent, then the name column both ways.
	callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/agents", w.orgToken, map[string]any{"name": "alpha-bot",
		"config": map[string]string{"model": "m"}, "sandbox_mode": "off", "environment_ids": []int64{w.envID}, "default_environment_id": w.envID}, http.StatusCreated, nil)
	names := func() string {
		return strings.Join(evalJS[[]string](t, ctx, "agent names", `Array.from(document.querySelectorAll('[data-testid="agents-table"] tbody td:first-child')).map(td => td.textContent.trim())`), ",")
	}
	do(t, ctx, "agents by name", chromedp.Navigate(w.srv.url+"/o/acme/agents"), chromedp.WaitVisible(testid("agents-table")))
	if got := names(); got != "alpha-bot,triage-bot" {
		t.Errorf("agents by name: %s", got)
	}
	do(t, ctx, "reverse", submits(chromedp.Click(testid("sort-name"))), chromedp.WaitVisible(css(`th[aria-sort="descending"]`)))
	if got := names(); got != "triage-bot,alpha-bot" {
		t.Errorf("agents by name, descending: %s", got)
	}
	mustContain(t, "list count", text(t, ctx, testid("list-count")), "2 agents")

	// Input borders at 3:1 against the white page.
	border := evalJS[string](t, ctx, "input border", `getComputedStyle(document.querySelector('#aname')).borderTopColor`)
	white := [3]float64{255, 255, 255}
	if r := contrast(rgb(t, border), white); r < 3 {
		t.Errorf("input border %s has contrast %.2f:1 with white, want at least 3:1", border, r)
	}

	// At 390 px the "New organization" button fits.
	do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(w.srv.url+"/admin/orgs"), chromedp.WaitVisible(testid("new-org")))
	right := evalJS[float64](t, ctx, "button edge", `document.querySelector('[data-testid="new-org"]').getBoundingClientRect().right`)
	if wide := evalJS[int](t, ctx, "page width", `document.documentElement.scrollWidth`); right > 390 || wide > 390 {
		t.Errorf("at 390 px the New organization button ends at %.0f px and the page is %d px wide", right, wide)
	}
}
