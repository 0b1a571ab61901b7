package e2e_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/sso/ssotest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// lockedBuffer collects the console's log lines from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ssoOrg creates org slug with a department "Research" and connects it
// to idp (group "eng" → member of Research, "auditors" → auditor),
// allowing e-mail in acme.test. It returns an org-admin token.
func ssoOrg(t *testing.T, srv *server, slug string, idp *ssotest.Provider, secret string) (string, int64) {
	t.Helper()
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs", login.Token, map[string]string{"slug": slug, "name": strings.ToUpper(slug)}, http.StatusCreated, nil)
	var entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/"+slug+"/enter", login.Token, nil, http.StatusOK, &entered)
	var dept struct{ ID int64 }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/"+slug+"/departments", entered.Token, map[string]string{"name": "Research"}, http.StatusCreated, &dept)
	putSSO(t, srv, slug, entered.Token, idp.URL, secret, dept.ID, false)
	return entered.Token, dept.ID
}

func putSSO(t *testing.T, srv *server, slug, token, issuer, secret string, dept int64, passwordOff bool) {
	t.Helper()
	body := map[string]any{"provider_name": "TestIdP", "issuer_url": issuer, "client_id": "gatehouse-" + slug,
		"allowed_domains": []string{"acme.test"}, "enabled": true, "password_login_disabled": passwordOff,
		"mappings": []map[string]any{{"group": "eng", "role": "member", "department_id": dept}, {"group": "auditors", "role": "auditor"}}}
	if secret != "" {
		body["client_secret"] = secret
	}
	callAPI(t, srv.url, http.MethodPut, "/api/v1/orgs/"+slug+"/sso", token, body, http.StatusOK, nil)
}

func startIdP(t *testing.T, srv *server, slug, secret string) *ssotest.Provider {
	return ssotest.Start(t, ssotest.Options{ClientID: "gatehouse-" + slug, ClientSecret: secret,
		RedirectURIs: []string{srv.url + "/o/" + slug + "/sso/callback"},
		Users: []ssotest.User{
			{Subject: "sub-alice", Username: "alice", Password: "alice-pw", Email: "alice@acme.test", EmailVerified: true, Name: "Alice", Groups: []string{"eng", "auditors"}},
			{Subject: "sub-bob", Username: "bob", Password: "bob-pw", Email: "bob@elsewhere.test", EmailVerified: true, Name: "Bob", Groups: []string{"eng"}},
		}})
}

// flow is one sign-in through the provider over plain HTTP: what the
// console answered at the end and the callback URL it was given.
type flow struct {
	status   int
	body     string
	callback string
}

// ssoSignIn starts a sign-in at the console, signs in at the provider's
// login page and follows the redirects back. rewrite may alter the
// authorization URL before the browser goes there.
func ssoSignIn(t *testing.T, srv *server, slug, user, pw string, rewrite func(url.Values)) flow {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	var f flow
	cl := &http.Client{Jar: jar, Timeout: 20 * time.Second, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if strings.HasSuffix(req.URL.Path, "/sso/callback") {
			f.callback = req.URL.String()
		}
		if rewrite != nil && req.URL.Path == "/authorize" {
			q := req.URL.Query()
			rewrite(q)
			req.URL.RawQuery = q.Encode()
		}
		return nil
	}}
	res, err := cl.Get(srv.url + "/o/" + slug + "/sso/login")
	if err != nil {
		t.Fatalf("start sign-in: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.HasSuffix(res.Request.URL.Path, "/login") || res.Request.URL.Query().Get("id") == "" {
		return flow{status: res.StatusCode, body: string(body)}
	}
	idpLogin := res.Request.URL
	res, err = cl.PostForm(idpLogin.Scheme+"://"+idpLogin.Host+"/login", url.Values{"id": {idpLogin.Query().Get("id")}, "username": {user}, "password": {pw}})
	if err != nil {
		t.Fatalf("sign in at the provider: %v", err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	f.status, f.body = res.StatusCode, string(body)
	return f
}

// refusals returns the details of the org's refused SSO sign-ins, newest
// first.
func refusals(t *testing.T, srv *server, slug string) []string {
	t.Helper()
	tn, err := srv.c.Tenants.Open(t.Context(), slug)
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Release()
	evs, err := tn.Audit.Query(t.Context(), audit.Filter{}, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		if ev.Action == "sso.login" && ev.Decision == audit.Deny {
			out = append(out, string(ev.Details))
		}
	}
	return out
}

func lastRefusal(t *testing.T, srv *server, slug, reason string) {
	t.Helper()
	rs := refusals(t, srv, slug)
	if len(rs) == 0 || !strings.Contains(rs[0], `"reason":"`+reason+`"`) {
		t.Fatalf("last audited refusal is %v, want reason %s", rs, reason)
	}
}

// TestBrowserSSOSignIn signs in through the provider's own login page in
// Chromium and lands on the org's home page with the roles the groups
// map to; the settings page shows the secret only as set.
func TestBrowserSSOSignIn(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-client-value-0123456789"
	srv := newServer(t, store.SQLite)
	idp := startIdP(t, srv, "acme", secret)
	ssoOrg(t, srv, "acme", idp, secret)

	ctx := newBrowser(t)
	do(t, ctx, "sign in through the provider",
		chromedp.Navigate(srv.url+"/o/acme/login"),
		chromedp.WaitVisible(testid("sso-login")),
		submits(chromedp.Click(testid("sso-login"))),
		chromedp.WaitVisible(testid("idp-submit")),
		chromedp.SendKeys(css(`#idp-username`), "alice"),
		chromedp.SendKeys(css(`#idp-password`), "alice-pw"),
		submits(chromedp.Click(testid("idp-submit"))),
		chromedp.WaitVisible(css(`form.logout button`)),
	)
	if loc := get(t, ctx, "location", chromedp.Location()); !strings.HasSuffix(loc, "/o/acme/") {
		t.Fatalf("after SSO the browser is at %s, want /o/acme/", loc)
	}
	page := get(t, ctx, "home page", chromedp.Text(css(`main`)))
	mustContain(t, "home page roles", page, "Member (Research)", "Auditor (whole organization)")
	if !strings.Contains(get(t, ctx, "header", chromedp.Text(css(`body`))), "alice@acme.test") {
		t.Error("the signed-in user is not shown as alice@acme.test")
	}
	html := get(t, ctx, "page", chromedp.OuterHTML(css(`html`)))
	if strings.Contains(html, secret) {
		t.Fatal("the client secret reached a page")
	}
}

// TestSSOFailures walks every refusal the issue names, each over real
// HTTP against a real provider, on both engines: each ends on the
// sign-in page with what to fix, is audited, and creates nothing.
func TestSSOFailures(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		const secret = "another-s3cret-value-9876543210"
		logs := &lockedBuffer{}
		srv := newServerLog(t, d, logs)
		idp := startIdP(t, srv, "acme", secret)
		token, dept := ssoOrg(t, srv, "acme", idp, secret)

		// Test configuration reports discovery and keys.
		var rep struct {
			OK   bool
			Keys []struct{ Kid string }
		}
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/sso/test", token, nil, http.StatusOK, &rep)
		if !rep.OK || len(rep.Keys) != 1 {
			t.Fatalf("test configuration: %+v", rep)
		}

		// Password sign-in cannot be turned off before SSO ever worked.
		body := callAPI(t, srv.url, http.MethodPut, "/api/v1/orgs/acme/sso", token, map[string]any{"issuer_url": idp.URL,
			"client_id": "gatehouse-acme", "enabled": true, "password_login_disabled": true}, http.StatusBadRequest, nil)
		mustContain(t, "password off refused", string(body), "password_login_disabled")

		// Success, then the same callback again: the state is spent.
		ok := ssoSignIn(t, srv, "acme", "alice", "alice-pw", nil)
		if ok.status != http.StatusOK || !strings.Contains(ok.body, "alice@acme.test") || ok.callback == "" {
			t.Fatalf("sign-in: %d %.300s", ok.status, ok.body)
		}
		res, err := http.Get(ok.callback)
		if err != nil {
			t.Fatal(err)
		}
		replay, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized || !strings.Contains(string(replay), "already used") {
			t.Fatalf("replayed callback: %d %.300s", res.StatusCode, replay)
		}
		lastRefusal(t, srv, "acme", "state_unknown")

		cases := []struct {
			name, user, pw, reason, says string
			before, after                func()
			rewrite                      func(url.Values)
		}{
			{name: "tampered ID token", user: "alice", pw: "alice-pw", reason: "invalid_token", says: "failed verification",
				before: func() { idp.Tamper(ssotest.FlipSignature) }, after: func() { idp.Tamper(nil) }},
			{name: "wrong nonce", user: "alice", pw: "alice-pw", reason: "wrong_nonce", says: "nonce",
				rewrite: func(q url.Values) { q.Set("nonce", "not-the-nonce") }},
			{name: "expired token", user: "alice", pw: "alice-pw", reason: "token_expired", says: "expired",
				before: func() { idp.SetIDTokenLifetime(-time.Minute) }, after: func() { idp.SetIDTokenLifetime(time.Hour) }},
			{name: "e-mail outside the allowed domains", user: "bob", pw: "bob-pw", reason: "domain_not_allowed", says: "not in a domain allowed"},
			{name: "wrong client secret", user: "alice", pw: "alice-pw", reason: "client_rejected", says: "client secret",
				before: func() { putSSO(t, srv, "acme", token, idp.URL, "not-the-secret", dept, false) },
				after:  func() { putSSO(t, srv, "acme", token, idp.URL, secret, dept, false) }},
		}
		for _, tc := range cases {
			if tc.before != nil {
				tc.before()
			}
			f := ssoSignIn(t, srv, "acme", tc.user, tc.pw, tc.rewrite)
			if tc.after != nil {
				tc.after()
			}
			if f.status != http.StatusUnauthorized || !strings.Contains(f.body, tc.says) || !strings.Contains(f.body, `data-testid="login-error"`) {
				t.Errorf("%s: %d, want 401 on the sign-in page saying %q: %.400s", tc.name, f.status, tc.says, f.body)
				continue
			}
			lastRefusal(t, srv, "acme", tc.reason)
		}

		// Nothing was created for the refused outsider.
		users := string(callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/users", token, nil, http.StatusOK, nil))
		if strings.Contains(users, "bob@elsewhere.test") {
			t.Error("a refused sign-in created a user")
		}

		// A disabled user is refused.
		var list struct {
			Items []struct {
				ID    int64
				Email string
			}
		}
		callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/users", token, nil, http.StatusOK, &list)
		var alice int64
		for _, u := range list.Items {
			if u.Email == "alice@acme.test" {
				alice = u.ID
			}
		}
		callAPI(t, srv.url, http.MethodPatch, "/api/v1/orgs/acme/users/"+strconv.FormatInt(alice, 10), token, map[string]string{"status": "disabled"}, http.StatusOK, nil)
		if f := ssoSignIn(t, srv, "acme", "alice", "alice-pw", nil); f.status != http.StatusUnauthorized || !strings.Contains(f.body, "disabled") {
			t.Errorf("disabled user: %d %.300s", f.status, f.body)
		}
		lastRefusal(t, srv, "acme", "user_disabled")
		callAPI(t, srv.url, http.MethodPatch, "/api/v1/orgs/acme/users/"+strconv.FormatInt(alice, 10), token, map[string]string{"status": "active"}, http.StatusOK, nil)

		// Password sign-in off: refused for users, audited; a platform
		// admin still enters.
		putSSO(t, srv, "acme", token, idp.URL, "", dept, true)
		body = callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": "alice@acme.test", "password": "x"}, http.StatusForbidden, nil)
		mustContain(t, "password sign-in off", string(body), "password_login_disabled")
		var login struct{ Token string }
		callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
		callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", login.Token, nil, http.StatusOK, nil)

		// An unreachable issuer.
		putSSO(t, srv, "acme", token, "http://127.0.0.1:1", "", dept, false)
		if f := ssoSignIn(t, srv, "acme", "alice", "alice-pw", nil); f.status != http.StatusBadGateway || !strings.Contains(f.body, "could not be reached") {
			t.Errorf("unreachable issuer: %d %.300s", f.status, f.body)
		}
		lastRefusal(t, srv, "acme", "issuer_unreachable")

		// The secret is in no response, page, export or log line.
		for _, path := range []string{"/api/v1/orgs/acme/sso", "/api/v1/orgs/acme/audit/export"} {
			if b := callAPI(t, srv.url, http.MethodGet, path, token, nil, http.StatusOK, nil); bytes.Contains(b, []byte(secret)) {
				t.Errorf("%s holds the client secret", path)
			}
		}
		if strings.Contains(logs.String(), secret) {
			t.Error("the log holds the client secret")
		}
	})
}

// TestSSOOrgsDoNotShareTokens runs two orgs with two providers: an ID
// token issued by the second org's provider, substituted into the first
// org's sign-in, is refused, and the other way round.
func TestSSOOrgsDoNotShareTokens(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	acmeIdP := startIdP(t, srv, "acme", "acme-secret-0123456789")
	globexIdP := startIdP(t, srv, "globex", "globex-secret-0123456789")
	ssoOrg(t, srv, "acme", acmeIdP, "acme-secret-0123456789")
	ssoOrg(t, srv, "globex", globexIdP, "globex-secret-0123456789")
	for _, slug := range []string{"acme", "globex"} {
		if f := ssoSignIn(t, srv, slug, "alice", "alice-pw", nil); f.status != http.StatusOK {
			t.Fatalf("%s sign-in: %d %.300s", slug, f.status, f.body)
		}
	}
	pairs := []struct {
		org        string
		own, other *ssotest.Provider
	}{{"acme", acmeIdP, globexIdP}, {"globex", globexIdP, acmeIdP}}
	for _, p := range pairs {
		foreign := p.other.IDTokens()[0]
		p.own.Tamper(func(string) string { return foreign })
		f := ssoSignIn(t, srv, p.org, "alice", "alice-pw", nil)
		p.own.Tamper(nil)
		if f.status != http.StatusUnauthorized || !strings.Contains(f.body, "another identity provider") {
			t.Errorf("%s accepted or misreported the other org's token: %d %.300s", p.org, f.status, f.body)
		}
		lastRefusal(t, srv, p.org, "wrong_issuer")
	}
}
