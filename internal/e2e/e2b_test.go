package e2e_test

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserE2BEndpoint: an org admin finds the E2B-compatible endpoint
// in the navigation, sees the URLs and environment variables a runtime
// sets, mints an e2b key for an agent (shown once, until dismissed, then
// only masked), the key opens the org's control plane, and revoking it
// with confirmation shuts it out.
func TestBrowserE2BEndpoint(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	var entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", acmeOrg(t, srv), nil, http.StatusOK, &entered)
	email, password := "admin@acme.test", "a long and private passphrase"
	var admin struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/users", entered.Token, map[string]string{"email": email}, http.StatusCreated, &admin)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/roles", entered.Token,
		map[string]string{"subject": "user:" + strconv.FormatInt(admin.User.ID, 10), "role": "org-admin", "domain": "org"}, http.StatusNoContent, nil)
	var own struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": email, "password": admin.OneTimePassword}, http.StatusOK, &own)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/password", own.Token,
		map[string]string{"current_password": admin.OneTimePassword, "new_password": password}, http.StatusNoContent, nil)
	var env, agent struct{ ID int64 }
	// A host that never answers (TEST-NET-1): minting a key needs an
	// agent, not a reachable environment.
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/environments", entered.Token, map[string]any{"name": "build-01", "kind": "host",
		"url": "http://192.0.2.10:49984", "os": "linux", "deployment": "bare-metal", "agentd_token": "host-token-0123456789"}, http.StatusCreated, &env)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/agents", entered.Token, map[string]any{"name": "coder", "config": map[string]string{"model": "m"},
		"environment_ids": []int64{env.ID}}, http.StatusCreated, &agent)

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the org admin", chromedp.Navigate(srv.url+"/o/acme/login"), signIn(email, password), chromedp.WaitVisible(css(`nav[aria-label="Main"]`)))
	do(t, ctx, "open the endpoint page from the navigation", submits(chromedp.Click(css(`nav[aria-label="Main"] a[href="/o/acme/e2b"]`))),
		chromedp.WaitVisible(testid("e2b-endpoint")))
	if got := text(t, ctx, testid("e2b-api-url")); got != srv.url+"/e2b/orgs/acme" {
		t.Errorf("API URL %q", got)
	}
	if got := text(t, ctx, testid("e2b-sandbox-url")); got != srv.url {
		t.Errorf("sandbox URL %q", got)
	}
	mustContain(t, "no domain", text(t, ctx, testid("e2b-no-domain")), "E2B_SANDBOX_URL")
	mustContain(t, "variables", text(t, ctx, testid("e2b-env")), "E2B_API_URL="+srv.url+"/e2b/orgs/acme", "E2B_SANDBOX_URL="+srv.url, "E2B_API_KEY=")
	text(t, ctx, testid("e2b-keys-empty"))
	// Issue 41 item 10: a five-line SDK example for JS and Python, shown
	// line by line (the text as rendered keeps its line breaks).
	for id, want := range map[string][]string{
		"e2b-example-js":     {"import { Sandbox } from 'e2b'", "await Sandbox.create()", "sbx.commands.run(", "console.log(result.stdout)", "await sbx.kill()"},
		"e2b-example-python": {"from e2b import Sandbox", "Sandbox.create()", "sbx.commands.run(", "print(result.stdout)", "sbx.kill()"},
	} {
		lines := strings.Split(text(t, ctx, testid(id)), "\n")
		if len(lines) != len(want) {
			t.Errorf("%s has %d lines, want %d: %q", id, len(lines), len(want), lines)
			continue
		}
		for i, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("%s line %d is %q, want it to hold %q", id, i+1, lines[i], w)
			}
		}
	}
	mustContain(t, "install", text(t, ctx, testid("e2b-example-help")), "npm install e2b", "pip install e2b")

	do(t, ctx, "mint a key", chromedp.SendKeys(testid("e2b-key-name"), "ci runtime"), submits(chromedp.Click(testid("mint-e2b-key"))),
		chromedp.WaitVisible(testid("new-e2b-key-box")))
	key := text(t, ctx, testid("new-e2b-key"))
	if !regexp.MustCompile(`^e2b_[0-9a-f]{64}$`).MatchString(key) {
		t.Fatalf("minted key %q does not have the SDKs' shape", key)
	}
	mustContain(t, "variables with the key", text(t, ctx, testid("e2b-env-with-key")), "E2B_API_KEY="+key)
	table := text(t, ctx, testid("e2b-keys-table"))
	mustContain(t, "keys table", table, "ci runtime", "coder", key[:16])
	if strings.Contains(table, key[16:]) {
		t.Error("the keys table shows the secret")
	}
	callAPI(t, srv.url, http.MethodGet, "/e2b/orgs/acme/v2/sandboxes", key, nil, http.StatusOK, nil)

	do(t, ctx, "dismiss the key", submits(chromedp.Click(testid("dismiss-e2b-key"))), chromedp.WaitNotPresent(testid("new-e2b-key")),
		chromedp.WaitVisible(testid("e2b-keys-table")))
	html := get(t, ctx, "page markup", chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if strings.Contains(html, key[16:]) {
		t.Error("the page still shows the key after it was dismissed")
	}

	do(t, ctx, "revoke, confirmed", chromedp.Click(testid("revoke-e2b-key-open")), chromedp.WaitVisible(testid("revoke-e2b-key")),
		submits(chromedp.Click(testid("revoke-e2b-key"))), chromedp.WaitVisible(testid("flash")))
	mustContain(t, "flash", text(t, ctx, testid("flash")), "ci runtime", "revoked")
	callAPI(t, srv.url, http.MethodGet, "/e2b/orgs/acme/v2/sandboxes", key, nil, http.StatusUnauthorized, nil)
}
