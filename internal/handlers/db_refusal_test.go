package handlers_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/netfault"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestDatabaseRefusalAnswers503 puts the databases in each refusing state
// and sends a request of every route family: sessions (create, exec,
// output, stdin, close), org pages, the org API, audit, and the platform
// (catalog). Each answers 503 database_unavailable with Retry-After (a
// live output poll may instead be answered from agentd, as
// docs/terminal-gateway.md says), never 500. The states: the real server
// with the org's or the catalog's database refusing connections (55000 at
// connect, its open connections ended with 57P01), and a proxy answering
// the startup with the ErrorResponse of states a shared server cannot be
// put in (57P03 starting up, 53300 too many connections, 08006). After
// each, the same console serves again.
func TestDatabaseRefusalAnswers503(t *testing.T) {
	t.Parallel()
	var proxy *dbCutter
	f := newTerminalFixture(t, store.Postgres, func(c *config.Config) { proxy = cutDatabase(t, c) })
	catalogDB, err := store.DatabaseName(f.e.cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	orgDB := f.e.cfg.OrgDBPrefix + "acme"

	// A TTY command for stdin and output to aim at, and a spare session to
	// close.
	r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "cat", "tty": true})
	wantStatus(t, "exec cat", r, http.StatusCreated)
	var tty outputJSON
	r.decode(t, &tty)
	r = f.call(http.MethodPost, "/sessions", "member", map[string]any{"agent_id": f.agentID})
	wantStatus(t, "create a session to close", r, http.StatusCreated)
	var spare struct{ ID int64 }
	r.decode(t, &spare)

	orgRoutes := []refusalCall{
		{name: "session create", call: func() response {
			return f.call(http.MethodPost, "/sessions", "member", map[string]any{"agent_id": f.agentID})
		}},
		{name: "exec", call: func() response {
			return f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo never"})
		}},
		{name: "output", fromAgentd: true, call: func() response {
			return f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=0&wait_ms=100", tty.CommandID), "member", nil)
		}},
		{name: "stdin", call: func() response {
			return f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", tty.CommandID), "member", map[string]any{"text": "never\n"})
		}},
		{name: "session close", call: func() response {
			return f.call(http.MethodDelete, fmt.Sprintf("/sessions/%d", spare.ID), "member", nil)
		}},
		{name: "org API", call: func() response { return f.call(http.MethodGet, "/agents", "entered-admin", nil) }},
		{name: "audit", call: func() response { return f.call(http.MethodGet, "/audit", "entered-admin", nil) }},
		{name: "org page", page: true, call: func() response {
			return f.e.do(request{method: http.MethodGet, path: "/o/acme/sessions", header: http.Header{"Accept": {"text/html"}},
				cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}})
		}},
	}
	platformRoutes := []refusalCall{
		{name: "platform API", call: func() response { return f.e.json(http.MethodGet, "/api/v1/orgs", f.platform, nil) }},
		{name: "platform page", page: true, call: func() response {
			return f.e.do(request{method: http.MethodGet, path: "/admin/orgs", token: f.platform, header: http.Header{"Accept": {"text/html"}}})
		}},
	}
	serving := func(t *testing.T) {
		t.Helper()
		eventually(t, "org API once the database is back", func() response { return f.call(http.MethodGet, "/agents", "entered-admin", nil) }, http.StatusOK)
		eventually(t, "platform API once the database is back", func() response {
			return f.e.json(http.MethodGet, "/api/v1/orgs", f.platform, nil)
		}, http.StatusOK)
	}

	t.Run("org database refuses connections", func(t *testing.T) {
		allow := storetest.RefuseConnections(t, orgDB)
		checkRefusals(t, orgRoutes)
		for _, c := range platformRoutes {
			wantStatus(t, c.name+" while only the org's database refuses", c.call(), http.StatusOK)
		}
		allow()
		serving(t)
	})
	t.Run("catalog refuses connections", func(t *testing.T) {
		allow := storetest.RefuseConnections(t, catalogDB)
		checkRefusals(t, platformRoutes)
		allow()
		serving(t)
	})
	for _, e := range []netfault.PGError{
		{Code: "57P03", Message: "the database system is starting up"},
		{Code: "53300", Message: "sorry, too many clients already"},
		{Code: "08006", Message: "connection failure"},
	} {
		t.Run("server answers "+e.Code, func(t *testing.T) {
			proxy.Refuse(e)
			checkRefusals(t, append(append([]refusalCall{}, orgRoutes...), platformRoutes...))
			proxy.Restore()
			serving(t)
		})
	}
}

// refusalCall is one request of a route family; page marks an HTML page,
// fromAgentd a read that may be answered from agentd while the replica
// still holds the caller's credential.
type refusalCall struct {
	name       string
	page       bool
	fromAgentd bool
	call       func() response
}

// checkRefusals wants every call answered as a database outage. A call
// that may be answered from agentd is sent after the credential cache's
// second has run out.
func checkRefusals(t *testing.T, calls []refusalCall) {
	t.Helper()
	for _, c := range calls {
		if c.fromAgentd {
			time.Sleep(1100 * time.Millisecond)
		}
		r := c.call()
		if r.status == http.StatusOK && c.fromAgentd {
			continue
		}
		if c.page {
			wantStatus(t, c.name, r, http.StatusServiceUnavailable)
			if r.header.Get("Retry-After") == "" {
				t.Errorf("%s: no Retry-After", c.name)
			}
			continue
		}
		wantOutage(t, c.name, r)
	}
}
