package handlers_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

type readyBody struct {
	Status     string            `json:"status"`
	Catalog    string            `json:"catalog"`
	Migrations map[string]string `json:"migrations"`
	Orgs       map[string]string `json:"orgs"`
	Problems   []string          `json:"problems"`
}

// /readyz says what it checked and what is wrong: ok with every open org
// pool reachable; degraded (200) naming the org whose database is cut,
// without quoting the driver's error; unavailable (503) when the catalog is
// cut; ok again once both are back.
func TestReadyzSaysWhatIsWrong(t *testing.T) {
	t.Parallel()
	var cut *dbCutter
	e := newEnv(t, store.Postgres, func(c *config.Config) { cut = cutDatabase(t, c) })
	tok := e.adminToken()
	e.createOrg(tok, "alpha", "Alpha")
	name := e.cfg.OrgDBPrefix + "ready"
	storetest.CreatePostgresDB(t, name)
	dsn, err := store.WithDatabase(storetest.AdminDSN(t), name)
	if err != nil {
		t.Fatal(err)
	}
	orgCut, viaCutter := newDBCutter(t, dsn)
	wantStatus(t, "create beta", e.json(http.MethodPost, "/api/v1/orgs", tok,
		map[string]string{"slug": "beta", "name": "Beta", "database_url": viaCutter}), http.StatusCreated)
	for _, slug := range []string{"alpha", "beta"} { // open both pools
		e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/auth/login", "", map[string]string{"email": "x@example.com", "password": "not it"})
	}
	ready := func(want int) readyBody {
		t.Helper()
		r := e.do(request{method: http.MethodGet, path: "/readyz"})
		wantStatus(t, "/readyz", r, want)
		var b readyBody
		r.decode(t, &b)
		return b
	}

	b := ready(http.StatusOK)
	if b.Status != "ok" || b.Catalog != "reachable" || b.Migrations["catalog"] != "current" ||
		b.Orgs["alpha"] != "reachable" || b.Orgs["beta"] != "reachable" || len(b.Problems) != 0 {
		t.Fatalf("healthy: %+v", b)
	}

	orgCut.Cut()
	b = ready(http.StatusOK)
	if b.Status != "degraded" || b.Orgs["beta"] != "unreachable" || b.Orgs["alpha"] != "reachable" ||
		len(b.Problems) != 1 || !strings.Contains(b.Problems[0], "org beta") {
		t.Fatalf("org database cut: %+v", b)
	}
	if strings.Contains(strings.Join(b.Problems, " "), "127.0.0.1") {
		t.Errorf("a problem quotes the driver's error: %v", b.Problems)
	}
	orgCut.Restore()

	cut.Cut()
	b = ready(http.StatusServiceUnavailable)
	if b.Status != "unavailable" || b.Catalog != "unreachable" || len(b.Problems) == 0 {
		t.Fatalf("catalog cut: %+v", b)
	}
	cut.Restore()
	eventually(t, "/readyz after the outage", func() response { return e.do(request{method: http.MethodGet, path: "/readyz"}) }, http.StatusOK)
	if b := ready(http.StatusOK); b.Status != "ok" {
		t.Fatalf("after the outage: %+v", b)
	}
}

// A catalog whose schema is behind the binary is not ready, and the answer
// says which migration is missing.
func TestReadyzPendingMigration(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	var last int
	if err := e.c.Catalog.Raw("SELECT MAX(version) FROM schema_migrations").Scan(&last).Error; err != nil {
		t.Fatal(err)
	}
	if err := e.c.Catalog.Exec("DELETE FROM schema_migrations WHERE version = ?", last).Error; err != nil {
		t.Fatal(err)
	}
	r := e.do(request{method: http.MethodGet, path: "/readyz"})
	wantStatus(t, "/readyz, a migration pending", r, http.StatusServiceUnavailable)
	var b readyBody
	r.decode(t, &b)
	if b.Status != "unavailable" || b.Migrations["catalog"] != "pending" || len(b.Problems) != 1 ||
		!strings.Contains(b.Problems[0], strconv.Itoa(last)) {
		t.Fatalf("pending migration: %+v", b)
	}
}
