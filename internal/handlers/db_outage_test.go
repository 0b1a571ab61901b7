package handlers_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestDatabaseOutageAnswers stops "the database" (Postgres behind a
// cuttable loopback forwarder; the machine's server keeps running for
// everyone else) and checks the answers: an attached org database that
// cannot be reached takes only that org down; a lost catalog makes the
// API answer 503 database_unavailable with Retry-After and pages a plain
// unavailable page, while /healthz stays 200 and /readyz says 503. When the
// database returns, the same console works again without a restart.
func TestDatabaseOutageAnswers(t *testing.T) {
	t.Parallel()
	var cut *dbCutter
	e := newEnv(t, store.Postgres, func(c *config.Config) { cut = cutDatabase(t, c) })
	tok := e.adminToken()
	e.createOrg(tok, "alpha", "Alpha")
	name := e.cfg.OrgDBPrefix + "attached"
	storetest.CreatePostgresDB(t, name)
	attachedDSN, err := store.WithDatabase(storetest.AdminDSN(t), name)
	if err != nil {
		t.Fatal(err)
	}
	attachedCut, viaCutter := newDBCutter(t, attachedDSN)
	wantStatus(t, "create beta on an attached database", e.json(http.MethodPost, "/api/v1/orgs", tok,
		map[string]string{"slug": "beta", "name": "Beta", "database_url": viaCutter}), http.StatusCreated)
	orgLogin := func(slug string) response {
		return e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/auth/login", "", map[string]string{"email": "nobody@example.com", "password": "not the password"})
	}
	// Beta's pool is open when its database goes away.
	wantStatus(t, "beta login before the outage", orgLogin("beta"), http.StatusUnauthorized)

	attachedCut.Cut()
	wantOutage(t, "beta login, its database cut", orgLogin("beta"))
	wantStatus(t, "alpha login, beta's database cut", orgLogin("alpha"), http.StatusUnauthorized)
	wantStatus(t, "platform API, beta's database cut", e.json(http.MethodGet, "/api/v1/orgs", tok, nil), http.StatusOK)
	wantStatus(t, "platform page, beta's database cut", e.do(request{method: http.MethodGet, path: "/admin/orgs", token: tok}), http.StatusOK)
	if logs := e.logs.String(); !strings.Contains(logs, `database="org beta"`) {
		t.Errorf("the log does not name beta's database:\n%s", logs)
	}
	attachedCut.Restore()
	eventually(t, "beta after its database returned", func() response { return orgLogin("beta") }, http.StatusUnauthorized)

	cut.Cut()
	wantOutage(t, "platform API, catalog cut", e.json(http.MethodGet, "/api/v1/orgs", tok, nil))
	wantOutage(t, "org API, catalog cut", orgLogin("alpha"))
	page := e.do(request{method: http.MethodGet, path: "/admin/orgs", token: tok, header: http.Header{"Accept": {"text/html"}}})
	wantStatus(t, "platform page, catalog cut", page, http.StatusServiceUnavailable)
	if !strings.Contains(string(page.body), "database is unavailable") || strings.Contains(string(page.body), `href="/admin/audit"`) {
		t.Errorf("the page during the outage is not the plain unavailable page:\n%s", page.body)
	}
	wantStatus(t, "/healthz, catalog cut", e.do(request{method: http.MethodGet, path: "/healthz"}), http.StatusOK)
	wantStatus(t, "/readyz, catalog cut", e.do(request{method: http.MethodGet, path: "/readyz"}), http.StatusServiceUnavailable)
	if logs := e.logs.String(); !strings.Contains(logs, "database=catalog") {
		t.Errorf("the log does not name the catalog:\n%s", logs)
	}
	cut.Restore()
	eventually(t, "platform API after the catalog returned", func() response { return e.json(http.MethodGet, "/api/v1/orgs", tok, nil) }, http.StatusOK)
	wantStatus(t, "/readyz after the outage", e.do(request{method: http.MethodGet, path: "/readyz"}), http.StatusOK)
	e.createOrg(tok, "gamma", "Gamma")
	wantStatus(t, "alpha after the outage", orgLogin("alpha"), http.StatusUnauthorized)
}

// wantOutage checks a 503 database_unavailable answer with Retry-After.
func wantOutage(t *testing.T, what string, r response) {
	t.Helper()
	wantStatus(t, what, r, http.StatusServiceUnavailable)
	if code := r.envelope(t).Error.Code; code != "database_unavailable" {
		t.Errorf("%s: code %q, want database_unavailable", what, code)
	}
	if r.header.Get("Retry-After") == "" {
		t.Errorf("%s: no Retry-After", what)
	}
}

// eventually repeats call until it answers want: pools drop their dead
// connections on use, so the first call after an outage may still meet one
// and answer 503, as a client retrying after Retry-After would see.
func eventually(t *testing.T, what string, call func() response, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := call()
		if r.status == want {
			return
		}
		if r.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("%s: %d %s, want %d", what, r.status, r.body, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
