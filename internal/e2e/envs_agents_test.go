package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserEnvironmentAndAgent is issue 5's walk through the forms: a
// department owner signs in with a one-time password, registers a real
// agentd as a department environment, tests the connection, and creates an
// agent that runs there. Bad input is refused inline and creates nothing;
// the agentd token never reaches a page or the audit log.
func TestBrowserEnvironmentAndAgent(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	agentdURL, agentdToken := agentdtest.Start(t)
	const (
		ownerEmail    = "owner@acme.test"
		ownerPassword = "a long and private passphrase"
		agentConfig   = `{"model":"claude-sonnet-4","system_prompt":"be brief"}`
	)

	// The organization, its department and a department owner, through
	// the JSON API as a platform admin would set them up.
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "",
		map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs", login.Token,
		map[string]string{"slug": "acme", "name": "Acme Corp"}, http.StatusCreated, nil)
	var entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", login.Token, nil, http.StatusOK, &entered)
	orgToken := entered.Token
	var dept struct{ ID int64 }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/departments", orgToken,
		map[string]string{"name": "Research"}, http.StatusCreated, &dept)
	var owner struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/users", orgToken,
		map[string]string{"email": ownerEmail, "name": "Olive Owner"}, http.StatusCreated, &owner)
	if owner.OneTimePassword == "" {
		t.Fatal("creating a user returned no one-time password")
	}
	deptID := strconv.FormatInt(dept.ID, 10)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/roles", orgToken,
		map[string]string{"subject": "user:" + strconv.FormatInt(owner.User.ID, 10), "role": "dept-owner", "domain": "dept:" + deptID},
		http.StatusNoContent, nil)

	ctx := newBrowser(t)

	// The one-time password only opens the change-password page.
	do(t, ctx, "sign in with the one-time password",
		chromedp.Navigate(srv.url+"/o/acme/login"),
		signIn(ownerEmail, owner.OneTimePassword),
		chromedp.WaitVisible(css(`#new`)),
	)
	if loc := get(t, ctx, "location", chromedp.Location()); !strings.HasSuffix(loc, "/o/acme/password") {
		t.Fatalf("after a one-time sign-in the browser is at %s, want /o/acme/password", loc)
	}
	do(t, ctx, "change the password",
		chromedp.SendKeys(css(`#current`), owner.OneTimePassword),
		chromedp.SendKeys(css(`#new`), ownerPassword),
		chromedp.Submit(css(`#new`)),
		chromedp.WaitVisible(testid("my-roles")),
	)
	mustContain(t, "flash after the change", text(t, ctx, testid("flash")), "password was changed")
	mustContain(t, "home page roles", text(t, ctx, testid("my-roles")), "Department owner", "Research")

	// A department owner may add shared environments, so "private" starts
	// unchecked.
	do(t, ctx, "open environments",
		chromedp.Navigate(srv.url+"/o/acme/environments"),
		chromedp.WaitVisible(testid("envs-empty")),
	)
	// A console without a local sandbox backend says how to get one.
	mustContain(t, "local sandboxes hint", text(t, ctx, testid("local-sandboxes-hint")), "--local-sandboxes", "not isolated")
	if get(t, ctx, "private checkbox", chromedp.Evaluate[bool](`document.querySelector('input[name="private"]').checked`)) {
		t.Error("the private checkbox is pre-checked for a user who may add department environments")
	}

	// A URL without a scheme and a short token are refused field by field.
	do(t, ctx, "submit an invalid environment",
		chromedp.SetValue(css(`#kind`), "host"),
		chromedp.SendKeys(css(`#name`), "build-01"),
		chromedp.SetValue(css(`#department_id`), deptID),
		chromedp.SendKeys(css(`#url`), "build-01:49984"),
		chromedp.SetValue(css(`#os`), "linux"),
		chromedp.SetValue(css(`#deployment`), "bare-metal"),
		chromedp.SendKeys(css(`#agentd_token`), "tooshort"),
		submits(chromedp.Click(testid("save-env"))),
		chromedp.WaitVisible(css(`#url-error`)),
	)
	mustContain(t, "url error", text(t, ctx, css(`#url-error`)), "http")
	mustContain(t, "agentd token error", text(t, ctx, css(`#agentd_token-error`)), "16")
	do(t, ctx, "nothing was created", chromedp.WaitVisible(testid("envs-empty")))
	if v := get(t, ctx, "name after refusal", chromedp.Value(css(`#name`))); v != "build-01" {
		t.Errorf("the refused form lost the name: %q", v)
	}
	if v := get(t, ctx, "department after refusal", chromedp.Value(css(`#department_id`))); v != deptID {
		t.Errorf("the refused form lost the department: %q, want %s", v, deptID)
	}
	if v := get(t, ctx, "token after refusal", chromedp.Value(css(`#agentd_token`))); v != "" {
		t.Errorf("the refused form echoes the agentd token back: %q", v)
	}

	// Corrected, it is created and lands on its page.
	do(t, ctx, "create the environment",
		chromedp.Clear(css(`#url`)),
		chromedp.SendKeys(css(`#url`), agentdURL),
		chromedp.SendKeys(css(`#agentd_token`), agentdToken),
		submits(chromedp.Click(testid("save-env"))),
		chromedp.WaitVisible(testid("env-name")),
	)
	loc := get(t, ctx, "location", chromedp.Location())
	m := regexp.MustCompile(`/o/acme/environments/(\d+)$`).FindStringSubmatch(loc)
	if m == nil {
		t.Fatalf("after creating an environment the browser is at %s, want its page", loc)
	}
	envID := m[1]
	if name := text(t, ctx, testid("env-name")); name != "build-01" {
		t.Errorf("environment page shows name %q", name)
	}
	mustContain(t, "flash after create", text(t, ctx, testid("flash")), "build-01", "added")
	if state := text(t, ctx, testid("token-state")); state != "set" {
		t.Errorf("token state %q, want set", state)
	}
	mustContain(t, "environment facts", text(t, ctx, css(`dl.facts`)), "department Research", agentdURL, "bare-metal")
	noSecretInPage(t, ctx, "environment page", agentdToken)

	// Test connection reaches the real agentd.
	do(t, ctx, "test the connection",
		chromedp.Click(testid("test-connection")),
		// The page may already have seen the host answer (it asks until
		// agentd first does): wait for the test's own outcome.
		chromedp.WaitVisible(css(`[data-testid="test-result"][data-state]:not([data-state="pending"])`)),
	)
	if status := text(t, ctx, css(`dl.facts [data-testid="status"]`)); status != "healthy" {
		t.Errorf("health after Test connection is %q, want healthy", status)
	}
	// The outcome shows in place (web/static/env-connect.js), coloured.
	mustContain(t, "outcome of the test", text(t, ctx, testid("test-result")), "Connected", "build-01", "ms")
	if n := get(t, ctx, "health error", chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="health-error"]').length`)); n != 0 {
		t.Errorf("a healthy environment shows a health error: %s", text(t, ctx, testid("health-error")))
	}
	noSecretInPage(t, ctx, "environment page after the test", agentdToken)
	if *updateScreenshots {
		// Just the facts and the Test connection button.
		do(t, ctx, "size the viewport", chromedp.EmulateViewport(1200, 630))
		writeScreenshot(t, get(t, ctx, "screenshot", chromedp.CaptureScreenshot()), "environment.png")
		do(t, ctx, "reset the viewport", chromedp.ResetViewport())
	}
	do(t, ctx, "list environments", chromedp.Navigate(srv.url+"/o/acme/environments"))
	mustContain(t, "environment row", text(t, ctx, css(`[data-testid="envs-table"] [data-testid="env-row-build-01"]`)),
		"build-01", "host", "department Research", "healthy")

	// An agent whose configuration names an unknown field is refused inline.
	envBox := css(`input[name="environment_ids"][value="` + envID + `"]`)
	do(t, ctx, "submit an agent with a bad configuration",
		chromedp.Navigate(srv.url+"/o/acme/agents"),
		chromedp.WaitVisible(testid("agents-empty")),
		chromedp.SendKeys(css(`#aname`), "triage-bot"),
		chromedp.SetValue(css(`#adept`), deptID),
		chromedp.Clear(css(`#config`)),
		chromedp.SendKeys(css(`#config`), `{"modle":"x"}`),
		chromedp.Click(envBox),
		chromedp.Click(css(`input[name="default_environment_id"][value="`+envID+`"]`)),
		chromedp.Click(css(`input[name="sandbox_mode"][value="off"]`)),
		submits(chromedp.Click(testid("save-agent"))),
		chromedp.WaitVisible(css(`#config-error`)),
	)
	mustContain(t, "config error", text(t, ctx, css(`#config-error`)), "modle")
	// The execution rules say what they check and what they do not.
	mustContain(t, "execution rules help", text(t, ctx, testid("exec-help")), "Typed terminal input is not checked by these rules")
	do(t, ctx, "no agent was created", chromedp.WaitVisible(testid("agents-empty")))
	if !get(t, ctx, "environment kept", chromedp.Evaluate[bool](`document.querySelector('input[name="environment_ids"][value="`+envID+`"]').checked`)) {
		t.Error("the refused agent form lost the chosen environment")
	}

	// Corrected, the agent is created and shows its effective configuration.
	do(t, ctx, "create the agent",
		chromedp.Clear(css(`#config`)),
		chromedp.SendKeys(css(`#config`), agentConfig),
		submits(chromedp.Click(testid("save-agent"))),
		chromedp.WaitVisible(testid("agent-name")),
	)
	if name := text(t, ctx, testid("agent-name")); name != "triage-bot" {
		t.Errorf("agent page shows name %q", name)
	}
	mustContain(t, "flash after agent create", text(t, ctx, testid("flash")), "triage-bot", "created")
	mustContain(t, "effective configuration", text(t, ctx, testid("agent-effective")),
		"department Research", "claude-sonnet-4", "off", "build-01 (host, healthy)")
	mustContain(t, "configuration JSON", text(t, ctx, css(`main pre code`)), `"system_prompt":"be brief"`)
	noSecretInPage(t, ctx, "agent page", agentdToken)
	do(t, ctx, "list agents", chromedp.Navigate(srv.url+"/o/acme/agents"))
	mustContain(t, "agent row", text(t, ctx, css(`[data-testid="agents-table"] [data-testid="agent-row-triage-bot"]`)),
		"triage-bot", "department Research", "claude-sonnet-4", "off", "build-01")

	// Both creations are audited as the owner, and no event carries the token.
	for _, c := range []struct{ action, target string }{
		{"environment.create", "build-01"},
		{"agent.create", "triage-bot"},
	} {
		var page struct {
			Items []struct {
				Action   string
				Decision string
				Actor    struct{ Name string }
				Target   struct{ Name string }
				Details  json.RawMessage
			}
		}
		body := callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/audit?q="+url.QueryEscape("action:"+c.action), orgToken, nil, http.StatusOK, &page)
		if len(page.Items) != 1 {
			t.Errorf("%s: %d audit events, want 1: %s", c.action, len(page.Items), body)
			continue
		}
		ev := page.Items[0]
		if ev.Action != c.action || ev.Decision != "allow" || ev.Actor.Name != ownerEmail || ev.Target.Name != c.target {
			t.Errorf("%s: audited as %s/%s by %q on %q, want allow by %s on %s",
				c.action, ev.Action, ev.Decision, ev.Actor.Name, ev.Target.Name, ownerEmail, c.target)
		}
		if strings.Contains(string(body), agentdToken) {
			t.Errorf("%s: the audit log holds the agentd token: %s", c.action, body)
		}
	}
	var envCreate struct {
		Items []struct {
			Details struct {
				After map[string]any
			}
		}
	}
	callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/audit?q="+url.QueryEscape("action:environment.create"), orgToken, nil, http.StatusOK, &envCreate)
	if len(envCreate.Items) == 1 && envCreate.Items[0].Details.After["agentd_token"] != "[redacted]" {
		t.Errorf("environment.create records agentd_token as %v, want [redacted]", envCreate.Items[0].Details.After["agentd_token"])
	}
	if all := callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/audit?limit=100", orgToken, nil, http.StatusOK, nil); strings.Contains(string(all), agentdToken) {
		t.Errorf("the org audit log holds the agentd token: %s", all)
	}
	if envs := callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/environments/"+envID, orgToken, nil, http.StatusOK, nil); strings.Contains(string(envs), agentdToken) {
		t.Errorf("the environments API returns the agentd token: %s", envs)
	}
}

// callAPI sends a JSON request with an optional bearer token, fails the
// test unless the answer has status want, decodes it into out when given
// and returns the body.
func callAPI(t *testing.T, base, method, path, token string, body any, want int, out any) []byte {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
	return b
}

// noSecretInPage fails when secret appears anywhere in the current page's
// markup, including form field values.
func noSecretInPage(t *testing.T, ctx context.Context, what, secret string) {
	t.Helper()
	html := get(t, ctx, what+" markup", chromedp.Evaluate[string](`document.documentElement.outerHTML + "\n" +
		Array.from(document.querySelectorAll("input, textarea")).map(e => e.value).join("\n")`))
	if strings.Contains(html, secret) {
		t.Errorf("%s shows the agentd token", what)
	}
}

// writeScreenshot checks img is a usable PNG and stores it under
// docs/screenshots.
func writeScreenshot(t *testing.T, img []byte, name string) {
	t.Helper()
	cfg, err := png.DecodeConfig(bytes.NewReader(img))
	if err != nil || cfg.Width < 800 || cfg.Height < 300 {
		t.Fatalf("screenshot is not a usable PNG: %dx%d, %v", cfg.Width, cfg.Height, err)
	}
	out := filepath.Join("..", "..", "docs", "screenshots", name)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, img, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%dx%d)", out, cfg.Width, cfg.Height)
}
