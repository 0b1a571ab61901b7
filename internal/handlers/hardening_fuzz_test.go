package handlers_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// hostileValues are the string payloads of the attack run: NUL, invalid
// UTF-8, 4,000 characters, and JSON nested far deeper than any request.
var hostileValues = []struct {
	name string
	json string // the value as it appears in a JSON body
	text string // the value in a query string or path
}{
	{"nul", `"a\u0000b"`, "a\x00b"},
	{"invalid-utf8", "\"a\xff\xfeb\"", "a\xff\xfeb"},
	{"long", `"` + strings.Repeat("x", 4000) + `"`, strings.Repeat("x", 4000)},
	{"long-email", `"` + strings.Repeat("y", 4000) + `@acme.test"`, strings.Repeat("y", 4000) + "@acme.test"},
	{"deep", strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200), strings.Repeat("[", 200)},
}

// bodyKeys are the field names the JSON API uses; each hostile value is
// sent under each, so it reaches the handler behind decodeJSON's
// unknown-field check wherever a route takes that field.
var bodyKeys = []string{"name", "email", "slug", "description", "url", "subject", "role", "domain", "object", "action", "effect",
	"password", "current_password", "new_password", "kind", "os", "deployment", "workspace_root", "sandbox_domain", "sandbox_scheme",
	"proxy_base_url", "api_key", "agentd_token", "backend_template_id", "image", "sandbox_mode", "config", "command_policy", "exec_policy",
	"database_url", "status", "prompt", "command", "agent_id", "environment_id"}

// queryKeys are the query parameters routes read.
var queryKeys = []string{"q", "limit", "after", "before", "format", "confirm", "subject", "role", "domain", "object", "action", "effect"}

// TestHardeningFuzzJSONRoutes drives every JSON route, as an admin and as
// a plain member, with hostile values in the body, the query and the path:
// no answer may be a 5xx (on Postgres as on SQLite), a refused change
// must leave the databases as they were, and every 403 is in the audit log.
func TestHardeningFuzzJSONRoutes(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		root := f.tokens["entered-admin"]
		_, agent := f.hostAndAgent(t, "fuzz")
		// The platform's org routes act on an org of their own, so that
		// suspending or deleting it leaves acme alone.
		e.createOrg(f.platform, "fuzzed", "Fuzzed")
		params := map[string]string{":id": fmt.Sprint(agent), ":dept": fmt.Sprint(f.dept1), ":uid": fmt.Sprint(f.ids["plain"]), ":tid": "1",
			":kind": "sqlite", ":name": "nothing"}

		catalog := e.c.Server.Catalog
		ten, err := e.c.Tenants.Open(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ten.Release)
		state := func() string { return fingerprint(t, "catalog.", catalog) + fingerprint(t, "org.", ten.DB) }
		denyFilter := mustParse(t, "decision:deny")
		lastDenial := func() int64 {
			evs, err := ten.Audit.Query(context.Background(), denyFilter, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == 0 {
				return 0
			}
			return evs[0].Seq
		}

		sent, fiveHundreds := 0, 0
		check := func(who string, req request, before string) string {
			t.Helper()
			lastDeny := int64(-1)
			if who == "plain" && strings.HasPrefix(req.path, "/api/v1/orgs/acme/") {
				lastDeny = lastDenial()
			}
			r := e.do(req)
			sent++
			label := fmt.Sprintf("%s %s as %s", req.method, truncateForLog(req.path), who)
			if r.status >= 500 {
				fiveHundreds++
				t.Errorf("%s: %d %.300s", label, r.status, r.body)
			}
			// Reads change nothing (checked once by hand); skipping their
			// fingerprint halves the run.
			after := before
			if req.method != http.MethodGet {
				after = state()
			}
			if r.status >= 400 && req.method != http.MethodGet && after != before {
				t.Errorf("%s: answered %d but changed %s (%.200s)", label, r.status, changedTables(before, after), r.body)
			}
			if r.status == http.StatusForbidden && lastDeny >= 0 && lastDenial() <= lastDeny {
				t.Errorf("%s: 403 without an audited denial (%.200s)", label, r.body)
			}
			return after
		}

		before := state()
		for _, rt := range e.c.Server.Routes() {
			if !strings.HasPrefix(rt.Path, "/api/") || strings.HasSuffix(rt.Path, "/auth/logout") || strings.Contains(rt.Path, "/terminal") {
				continue
			}
			org := "acme"
			if !strings.HasPrefix(rt.Path, "/api/v1/orgs/:org/") || strings.HasSuffix(rt.Path, "/enter") || rt.Path == "/api/v1/orgs/:org/suspend" ||
				rt.Path == "/api/v1/orgs/:org/resume" {
				org = "fuzzed"
			}
			if rt.Path == "/api/v1/orgs/:org" {
				org = "fuzzed"
			}
			whos := []string{"admin"}
			if strings.HasPrefix(rt.Path, "/api/v1/orgs/:org/") && org == "acme" {
				whos = append(whos, "plain")
			}
			for _, who := range whos {
				tok := root
				switch {
				case org == "fuzzed" || !strings.HasPrefix(rt.Path, "/api/v1/orgs/:org/"):
					tok = f.platform
				case who == "plain":
					tok = f.tokens["plain"]
				}
				if strings.HasSuffix(rt.Path, "/auth/login") {
					tok = ""
				}
				path := rt.Path
				for p, v := range params {
					path = strings.ReplaceAll(path, p, v)
				}
				path = strings.ReplaceAll(path, ":org", org)
				for _, hv := range hostileValues {
					// The body, under every field name.
					if rt.Method != http.MethodGet {
						for _, k := range bodyKeys {
							if strings.HasSuffix(rt.Path, "/auth/password") && strings.HasPrefix(hv.name, "long") {
								continue // a long new password is a valid one
							}
							body := `{"` + k + `":` + hv.json + `}`
							before = check(who, request{method: rt.Method, path: path, token: tok, contentType: "application/json",
								body: strings.NewReader(body)}, before)
							if hv.name != "long-email" || who != "admin" {
								// Refused at the edge whatever the field, or
								// covered by long-email; the plain member is
								// refused before the body matters.
								break
							}
						}
					}
					// The query string.
					q := url.Values{}
					for _, k := range queryKeys {
						q.Set(k, hv.text)
					}
					before = check(who, request{method: rt.Method, path: path + "?" + q.Encode(), token: tok}, before)
					// Each path parameter.
					for _, seg := range strings.Split(rt.Path, "/") {
						if !strings.HasPrefix(seg, ":") || (seg == ":org" && hv.name == "long") {
							continue
						}
						p := strings.Replace(rt.Path, seg, url.PathEscape(hv.text), 1)
						for k, v := range params {
							p = strings.ReplaceAll(p, k, v)
						}
						p = strings.ReplaceAll(p, ":org", org)
						before = check(who, request{method: rt.Method, path: p, token: tok}, before)
					}
				}
			}
		}
		if sent < 1000 {
			t.Fatalf("only %d requests sent", sent)
		}
		t.Logf("%d hostile requests, %d answered 5xx", sent, fiveHundreds)
	})
}

func truncateForLog(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// fingerprint hashes every row of every table of db that a refused
// request must leave alone: all but the audit logs (a refusal is recorded
// there) and sign-ins.
func fingerprint(t *testing.T, label string, db *gorm.DB) string {
	t.Helper()
	var tables []string
	q := "SELECT name FROM sqlite_master WHERE type = 'table'"
	if store.DialectOfDB(db) == store.Postgres {
		q = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
	}
	if err := db.Raw(q).Scan(&tables).Error; err != nil {
		t.Fatal(err)
	}
	sort.Strings(tables)
	var h strings.Builder
	for _, table := range tables {
		if strings.Contains(table, "audit") || strings.Contains(table, "login") ||
			strings.HasPrefix(table, "schema_") || strings.HasPrefix(table, "sqlite_") {
			continue
		}
		rows, err := db.Raw(`SELECT * FROM "` + table + `"`).Rows()
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		var lines []string
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				rows.Close()
				t.Fatal(err)
			}
			lines = append(lines, fmt.Sprintf("%v", vals))
		}
		rows.Close()
		sort.Strings(lines)
		sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
		fmt.Fprintf(&h, "%s%s:%s\n", label, table, hex.EncodeToString(sum[:6]))
	}
	return h.String()
}

// changedTables names the tables whose rows differ between two
// fingerprints.
func changedTables(before, after string) string {
	old := map[string]string{}
	for _, l := range strings.Split(before, "\n") {
		name, sum, _ := strings.Cut(l, ":")
		old[name] = sum
	}
	var out []string
	for _, l := range strings.Split(after, "\n") {
		name, sum, _ := strings.Cut(l, ":")
		if name != "" && old[name] != sum {
			out = append(out, name)
		}
	}
	return strings.Join(out, ", ")
}
