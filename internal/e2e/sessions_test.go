package e2e_test

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserSession is issue 9's walk: a member opens a per-session agent,
// creates a session (pending, no sandbox), starts it (a sandbox appears at
// the backend, running), and closes it (the sandbox is killed, the record
// stays).
func TestBrowserSession(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	fake := e2bfaketest.New(t, e2bfaketest.Binary{}, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}})
	const (
		email    = "mia@acme.test"
		password = "a long and private passphrase"
	)
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs", login.Token, map[string]string{"slug": "acme", "name": "Acme Corp"}, http.StatusCreated, nil)
	var entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", login.Token, nil, http.StatusOK, &entered)
	root := entered.Token
	var dept, env, tpl, agent struct{ ID int64 }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/departments", root, map[string]string{"name": "Research"}, http.StatusCreated, &dept)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/environments", root, map[string]any{"name": "local-sandboxes", "kind": "sandbox",
		"department_id": dept.ID, "url": fake.URL(), "proxy_base_url": fake.ProxyURL(), "sandbox_scheme": "http",
		"api_key": e2bfaketest.APIKey, "agentd_token": e2bfaketest.Token}, http.StatusCreated, &env)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/environments/"+strconv.FormatInt(env.ID, 10)+"/templates", root,
		map[string]any{"import": true, "backend_template_id": "base"}, http.StatusCreated, &tpl)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/agents", root, map[string]any{"name": "coder", "department_id": dept.ID,
		"config": map[string]string{"model": "claude-sonnet-4"}, "sandbox_mode": "per-session", "template_id": tpl.ID,
		"environment_ids": []int64{env.ID}}, http.StatusCreated, &agent)
	var user struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/users", root, map[string]string{"email": email, "name": "Mia Member"}, http.StatusCreated, &user)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/roles", root, map[string]string{"subject": "user:" + strconv.FormatInt(user.User.ID, 10),
		"role": "member", "domain": "dept:" + strconv.FormatInt(dept.ID, 10)}, http.StatusNoContent, nil)
	var otp struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": email, "password": user.OneTimePassword}, http.StatusOK, &otp)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/password", otp.Token,
		map[string]string{"current_password": user.OneTimePassword, "new_password": password}, http.StatusNoContent, nil)

	ctx := newBrowser(t)
	do(t, ctx, "sign in",
		chromedp.Navigate(srv.url+"/o/acme/login"),
		signIn(email, password),
		chromedp.WaitVisible(testid("my-roles")),
	)
	var sessionID string
	t.Run("create a session from the agent page: pending", func(t *testing.T) {
		do(t, ctx, "open the agent",
			chromedp.Navigate(srv.url+"/o/acme/agents/"+strconv.FormatInt(agent.ID, 10)),
			chromedp.WaitVisible(testid("sessions-empty")),
			submits(chromedp.Click(testid("new-session"))),
			chromedp.WaitVisible(testid("session-state")),
		)
		m := regexp.MustCompile(`/o/acme/sessions/(\d+)$`).FindStringSubmatch(get(t, ctx, "location", chromedp.Location()))
		if m == nil {
			t.Fatal("creating a session did not land on its page")
		}
		sessionID = m[1]
		if st := text(t, ctx, testid("session-state")); st != "pending" {
			t.Errorf("state %q, want pending", st)
		}
		mustContain(t, "sandbox before start", text(t, ctx, testid("session-sandbox")), "created on first use")
		if n := fake.Calls("POST /sandboxes"); n != 0 {
			t.Errorf("%d sandboxes created before first use", n)
		}
	})
	var sandboxID string
	t.Run("start it: a running sandbox", func(t *testing.T) {
		do(t, ctx, "start", submits(chromedp.Click(testid("session-start"))), chromedp.WaitVisible(testid("session-pause")))
		if st := text(t, ctx, testid("session-state")); st != "running" {
			t.Errorf("state %q, want running", st)
		}
		sandboxID = strings.TrimSpace(text(t, ctx, testid("session-sandbox")))
		snap, ok := fake.Inspect(sandboxID)
		if !ok || snap.State != sandbox.StateRunning || snap.Metadata["gatehouse.session"] != sessionID {
			t.Errorf("sandbox %q at the backend: %+v (exists %v)", sandboxID, snap, ok)
		}
		mustContain(t, "backend state", text(t, ctx, testid("session-backend-state")), "running")
	})
	t.Run("close it: the sandbox is gone, the record stays", func(t *testing.T) {
		do(t, ctx, "close, confirmed", chromedp.Click(testid("session-close-open")), submits(chromedp.Click(testid("session-close"))),
			// The old page has a state too: wait for the one after the close.
			waitText(testid("session-state"), "closed"))
		if st := text(t, ctx, testid("session-state")); st != "closed" {
			t.Errorf("state %q, want closed", st)
		}
		mustContain(t, "reason", text(t, ctx, testid("session-reason")), "closed by "+email)
		if _, ok := fake.Inspect(sandboxID); ok {
			t.Errorf("sandbox %s still exists", sandboxID)
		}
		do(t, ctx, "the agent page lists it",
			chromedp.Navigate(srv.url+"/o/acme/agents/"+strconv.FormatInt(agent.ID, 10)),
			chromedp.WaitVisible(testid("session-row-"+sessionID)),
		)
	})
}
