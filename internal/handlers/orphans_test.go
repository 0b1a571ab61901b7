package handlers_test

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestOrphanDatabasesPage: database files named like an org's that no org
// uses are listed on the organizations page and by the API, and go only
// when an admin removes them, each removal in the platform audit log.
func TestOrphanDatabasesPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	tok := e.adminToken()
	e.createOrg(tok, "acme", "Acme")
	dir := filepath.Join(e.cfg.DataDir, "orgs")
	for _, name := range []string{"ghost.db", "spook.db"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	page := e.do(request{method: http.MethodGet, path: "/admin/orgs", token: tok})
	wantStatus(t, "organizations page", page, http.StatusOK)
	for _, want := range []string{`data-testid="orphan-ghost.db"`, `data-testid="orphan-spook.db"`} {
		if !strings.Contains(string(page.body), want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(string(page.body), `data-testid="orphan-acme.db"`) {
		t.Error("an org's own database is offered for removal")
	}
	r := e.json(http.MethodGet, "/api/v1/orphan-databases", tok, nil)
	wantStatus(t, "list orphans", r, http.StatusOK)
	var list struct {
		Items []struct{ Kind, Name, Slug string }
	}
	r.decode(t, &list)
	if len(list.Items) != 2 || list.Items[0].Name != "ghost.db" || list.Items[0].Slug != "ghost" || list.Items[0].Kind != "sqlite" {
		t.Fatalf("orphans: %s", r.body)
	}

	form := url.Values{"kind": {"sqlite"}, "name": {"ghost.db"}}.Encode()
	r = e.do(request{method: http.MethodPost, path: "/admin/orphan-databases/remove", token: tok,
		contentType: "application/x-www-form-urlencoded", body: strings.NewReader(form)})
	wantStatus(t, "remove from the page", r, http.StatusSeeOther)
	wantStatus(t, "remove by API", e.json(http.MethodDelete, "/api/v1/orphan-databases/sqlite/spook.db", tok, nil), http.StatusNoContent)
	wantStatus(t, "remove an org's database", e.json(http.MethodDelete, "/api/v1/orphan-databases/sqlite/acme.db", tok, nil), http.StatusNotFound)
	for _, name := range []string{"ghost.db", "spook.db"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "acme.db")); err != nil {
		t.Errorf("acme's database: %v", err)
	}
	var n int64
	e.c.Catalog.Table(audit.PlatformTable).Where("action = ? AND actor_type = ?", "org.orphan_remove", audit.ActorPlatformAdmin).Count(&n)
	if n != 2 {
		t.Fatalf("%d audited removals, want 2", n)
	}
}
