package envs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestCreateValidation proves every rule of apply() answers with a field
// error and a message that says what is expected, and that a refused
// environment is not stored.
func TestCreateValidation(t *testing.T) {
	t.Parallel()
	host := func(mod func(*envs.Input)) envs.Input {
		in := hostInput("h", "https://build-01.example.com:49984", token("h"))
		mod(&in)
		return in
	}
	sbx := func(mod func(*envs.Input)) envs.Input {
		in := sandboxInput("s", "https://api.e2b.app", "e2b.app", token("s"), "key")
		mod(&in)
		return in
	}
	cases := []struct {
		name  string
		in    envs.Input
		field string
		want  string // "" means the input is valid
	}{
		{"valid host", host(func(*envs.Input) {}), "", ""},
		{"valid windows host", host(func(in *envs.Input) {
			in.OS, in.WorkspaceRoot = ptr("windows"), ptr(`C:\work`)
		}), "", ""},
		{"valid sandbox with path proxy only", sbx(func(in *envs.Input) {
			in.SandboxDomain, in.ProxyBaseURL = nil, ptr("http://cube-proxy:8080/")
		}), "", ""},
		{"empty name", host(func(in *envs.Input) { in.Name = ptr("  ") }), "name", "1 to 100 characters"},
		{"long name", host(func(in *envs.Input) { in.Name = ptr(strings.Repeat("n", 101)) }), "name", "1 to 100 characters"},
		{"bad kind", host(func(in *envs.Input) { in.Kind = "vm" }), "kind", "host or sandbox"},
		{"host url missing", host(func(in *envs.Input) { in.URL = nil }), "url", "http:// or https:// URL"},
		{"host url scheme", host(func(in *envs.Input) { in.URL = ptr("ftp://build-01:49984") }), "url", "http:// or https:// URL"},
		{"host url no host", host(func(in *envs.Input) { in.URL = ptr("http://") }), "url", "with a host"},
		{"host url credentials", host(func(in *envs.Input) { in.URL = ptr("https://u:p@build-01:49984") }), "url", "no credentials"},
		{"host url query", host(func(in *envs.Input) { in.URL = ptr("https://build-01:49984/?token=x") }), "url", "http:// or https:// URL"},
		{"host os", host(func(in *envs.Input) { in.OS = ptr("solaris") }), "os", "linux, windows or macos"},
		{"host os missing", host(func(in *envs.Input) { in.OS = nil }), "os", "linux, windows or macos"},
		{"host deployment", host(func(in *envs.Input) { in.Deployment = ptr("vm") }), "deployment", "bare-metal, cloud-vm or kubernetes"},
		{"host relative workspace", host(func(in *envs.Input) { in.WorkspaceRoot = ptr("work") }), "workspace_root", "absolute path"},
		{"host api key", host(func(in *envs.Input) { in.APIKey = ptr("e2b_123") }), "api_key", "no backend API key"},
		{"token too short", host(func(in *envs.Input) { in.AgentdToken = ptr("short") }), "agentd_token",
			fmt.Sprintf("at least %d characters", envs.MinTokenLength)},
		{"token only spaces", host(func(in *envs.Input) { in.AgentdToken = ptr(strings.Repeat(" ", 20)) }), "agentd_token", "at least"},
		{"token required on create", host(func(in *envs.Input) { in.AgentdToken = nil }), "agentd_token", "required"},
		{"sandbox token required", sbx(func(in *envs.Input) { in.AgentdToken = nil }), "agentd_token", "required"},
		{"sandbox url", sbx(func(in *envs.Input) { in.URL = ptr("api.e2b.app") }), "url", "backend API URL"},
		{"sandbox scheme", sbx(func(in *envs.Input) { in.SandboxScheme = ptr("ftp") }), "sandbox_scheme", "http or https"},
		{"sandbox domain with scheme", sbx(func(in *envs.Input) { in.SandboxDomain = ptr("https://e2b.app") }), "sandbox_domain", "without a scheme"},
		{"sandbox domain bad chars", sbx(func(in *envs.Input) { in.SandboxDomain = ptr("e2b_app/x") }), "sandbox_domain", "host name"},
		{"sandbox neither domain nor proxy", sbx(func(in *envs.Input) { in.SandboxDomain = nil }), "sandbox_domain", "path-based proxy base URL"},
		{"sandbox proxy url", sbx(func(in *envs.Input) { in.ProxyBaseURL = ptr("cube-proxy:8080") }), "proxy_base_url", "http:// or https://"},
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				in := tc.in
				name := fmt.Sprintf("env-%d", i)
				if tc.field != "name" {
					in.Name = &name
				}
				e, err := f.envs.Create(context.Background(), sys, in)
				if tc.want == "" {
					if err != nil {
						t.Fatalf("valid input refused: %v", err)
					}
					if e.ID == 0 || e.HealthStatus != envs.HealthUnknown || !e.HasAgentdToken() {
						t.Errorf("stored %+v", e)
					}
					return
				}
				wantField(t, err, tc.field, tc.want)
				if !errors.Is(err, apperr.ErrInvalid) {
					t.Errorf("errors.Is(err, ErrInvalid) = false for %v", err)
				}
				var n int64
				f.db.Table("environments").Where("name = ?", name).Count(&n)
				if n != 0 {
					t.Errorf("refused environment was stored")
				}
			})
		}
	})
}

// TestCreateNormalizes checks what Create stores beyond the input: trimmed
// URLs, kind-specific fields cleared, sandbox defaults.
func TestCreateNormalizes(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		ctx := context.Background()
		in := hostInput(" h1 ", " https://build-01:49984/ ", token("a"))
		in.SandboxDomain = ptr("e2b.app") // ignored on a host
		h, err := f.envs.Create(ctx, sys, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.envs.Get(ctx, sys, h.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "h1" || got.URL != "https://build-01:49984" || got.SandboxDomain != "" || got.CreatedBy != "tester" || got.Private() {
			t.Errorf("host stored as %+v", got)
		}
		sin := sandboxInput("s1", "https://api.e2b.app/", "e2b.app", token("b"), "")
		sin.SandboxScheme = nil
		sin.OS, sin.Deployment, sin.WorkspaceRoot = ptr("windows"), ptr("kubernetes"), ptr("/srv")
		s, err := f.envs.Create(ctx, sys, sin)
		if err != nil {
			t.Fatal(err)
		}
		if s.SandboxScheme != "https" || s.OS != "linux" || s.Deployment != "" || s.WorkspaceRoot != "" || s.HasAPIKey() {
			t.Errorf("sandbox stored as %+v", s)
		}
	})
}

// TestCRUD covers duplicates, secret replacement on update, the department
// foreign key and deletion guarded by agents.
func TestCRUD(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		ctx := context.Background()
		tokA, tokB := token("a"), token("b")

		h := f.mustCreate(t, hostInput("build", "https://build-01:49984", tokA))
		s := f.mustCreate(t, sandboxInput("cloud", "https://api.e2b.app", "e2b.app", tokA, "key-one"))

		t.Run("duplicate name", func(t *testing.T) {
			_, err := f.envs.Create(ctx, sys, hostInput("build", "https://build-02:49984", tokA))
			wantField(t, err, "name", "already exists")
			_, _, err = f.envs.Update(ctx, sys, s.ID, envs.Input{Name: ptr("build")})
			wantField(t, err, "name", "already exists")
		})

		t.Run("get missing", func(t *testing.T) {
			_, err := f.envs.Get(ctx, sys, 999_999)
			wantKind(t, err, apperr.ErrNotFound, "environment_not_found")
			_, _, err = f.envs.Update(ctx, sys, 999_999, envs.Input{})
			wantKind(t, err, apperr.ErrNotFound, "environment_not_found")
			_, err = f.envs.Delete(ctx, sys, 999_999)
			wantKind(t, err, apperr.ErrNotFound, "environment_not_found")
		})

		t.Run("list ordered by name", func(t *testing.T) {
			list, err := f.envs.List(ctx, sys)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 2 || list[0].Name != "build" || list[1].Name != "cloud" {
				t.Errorf("List = %+v", list)
			}
		})

		t.Run("update leaves secrets when nil", func(t *testing.T) {
			before, after, err := f.envs.Update(ctx, sys, h.ID, envs.Input{Name: ptr("build-renamed"), OS: ptr("macos")})
			if err != nil {
				t.Fatal(err)
			}
			if before.Name != "build" || after.Name != "build-renamed" || after.OS != "macos" {
				t.Errorf("before %q after %q/%q", before.Name, after.Name, after.OS)
			}
			got, _ := f.envs.Get(ctx, sys, h.ID)
			if got.SealedAgentdToken != h.SealedAgentdToken {
				t.Errorf("a nil token pointer changed the sealed token")
			}
			if tok, err := f.envs.AgentdToken(got); err != nil || tok != tokA {
				t.Errorf("AgentdToken = %q, %v; want the original", tok, err)
			}
			if _, _, err := f.envs.Update(ctx, sys, h.ID, envs.Input{Deployment: ptr("mainframe")}); err == nil {
				t.Error("update accepted an invalid deployment")
			} else {
				wantField(t, err, "deployment", "bare-metal")
			}
			if _, _, err := f.envs.Update(ctx, sys, h.ID, envs.Input{AgentdToken: ptr("short")}); err == nil {
				t.Error("update accepted a short token")
			} else {
				wantField(t, err, "agentd_token", "at least")
			}
		})

		t.Run("update replaces secrets", func(t *testing.T) {
			_, after, err := f.envs.Update(ctx, sys, h.ID, envs.Input{AgentdToken: ptr(tokB)})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := f.envs.Get(ctx, sys, h.ID)
			if got.SealedAgentdToken == h.SealedAgentdToken || got.SealedAgentdToken != after.SealedAgentdToken {
				t.Errorf("sealed token not replaced")
			}
			if tok, err := f.envs.AgentdToken(got); err != nil || tok != tokB {
				t.Errorf("AgentdToken = %q, %v; want the new one", tok, err)
			}
			// The sandbox's API key: nil leaves it, a value replaces it, ""
			// clears it.
			// A stored secret never follows a changed address.
			_, _, err = f.envs.Update(ctx, sys, h.ID, envs.Input{URL: ptr("https://attacker.example:49984")})
			var ve *apperr.ValidationError
			if !errors.As(err, &ve) || ve.Fields["agentd_token"] == "" {
				t.Fatalf("moving a host without re-entering its token: %v", err)
			}
			if got, _ := f.envs.Get(ctx, sys, h.ID); got.URL == "https://attacker.example:49984" {
				t.Fatal("the refused move was stored")
			}
			if _, _, err := f.envs.Update(ctx, sys, s.ID, envs.Input{SandboxDomain: ptr("cube.app"), AgentdToken: ptr(tokA)}); err != nil {
				t.Fatal(err)
			}
			if got, _ := f.envs.Get(ctx, sys, s.ID); got.SealedAPIKey != s.SealedAPIKey || got.SandboxDomain != "cube.app" {
				t.Errorf("api key changed by an update without one")
			}
			if _, _, err := f.envs.Update(ctx, sys, s.ID, envs.Input{APIKey: ptr("key-two")}); err != nil {
				t.Fatal(err)
			}
			if got, _ := f.envs.Get(ctx, sys, s.ID); got.SealedAPIKey == s.SealedAPIKey || !got.HasAPIKey() {
				t.Errorf("api key not replaced")
			}
			if _, _, err := f.envs.Update(ctx, sys, s.ID, envs.Input{APIKey: ptr("")}); err != nil {
				t.Fatal(err)
			}
			if got, _ := f.envs.Get(ctx, sys, s.ID); got.HasAPIKey() {
				t.Errorf("an empty api key did not clear it")
			}
		})

		t.Run("department", func(t *testing.T) {
			dept := newDepartment(t, f.db, "eng")
			in := hostInput("dept-host", "https://dept:49984", tokA)
			in.DepartmentID = &dept
			e, err := f.envs.Create(ctx, sys, in)
			if err != nil {
				t.Fatal(err)
			}
			if e.DepartmentID == nil || *e.DepartmentID != dept {
				t.Errorf("department = %v", e.DepartmentID)
			}
			// A department with environments cannot be deleted.
			if err := f.db.Exec("DELETE FROM departments WHERE id = ?", dept).Error; err == nil {
				t.Error("deleted a department an environment belongs to")
			}
			// A department that does not exist is refused, not stored.
			in = hostInput("ghost-dept", "https://ghost:49984", tokA)
			in.DepartmentID = ptr(int64(999_999))
			_, err = f.envs.Create(ctx, sys, in)
			wantField(t, err, "department_id", "does not exist")
			var n int64
			f.db.Table("environments").Where("name = ?", "ghost-dept").Count(&n)
			if n != 0 {
				t.Error("environment with a missing department stored")
			}
			_, _, err = f.envs.Update(ctx, sys, e.ID, envs.Input{DepartmentID: ptr(int64(999_999))})
			wantField(t, err, "department_id", "does not exist")
			// 0 means the org, on create as on update.
			in = hostInput("org-wide", "https://org:49984", tokA)
			in.DepartmentID = ptr(int64(0))
			ow, err := f.envs.Create(ctx, sys, in)
			if err != nil || ow.DepartmentID != nil {
				t.Fatalf("department 0 on create: %v, %v", ow.DepartmentID, err)
			}
			_, after, err := f.envs.Update(ctx, sys, e.ID, envs.Input{DepartmentID: ptr(int64(0))})
			if err != nil || after.DepartmentID != nil {
				t.Fatalf("department 0 on update: %v, %v", after.DepartmentID, err)
			}
			if err := f.db.Exec("DELETE FROM departments WHERE id = ?", dept).Error; err != nil {
				t.Errorf("department still referenced after moving its environment: %v", err)
			}
		})

		t.Run("delete refused while an agent uses it", func(t *testing.T) {
			a, err := f.agents.Create(ctx, sys, agents.Input{Name: ptr("coder"), Config: ptr(`{"model":"m"}`),
				EnvironmentIDs: []int64{h.ID}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.envs.Delete(ctx, sys, h.ID)
			wantKind(t, err, apperr.ErrConflict, "environment_in_use")
			if _, err := f.envs.Get(ctx, sys, h.ID); err != nil {
				t.Fatalf("refused delete removed the environment: %v", err)
			}
			if _, err := f.agents.Delete(ctx, sys, a.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := f.envs.Delete(ctx, sys, h.ID); err != nil {
				t.Fatalf("delete after the agent went: %v", err)
			}
			_, err = f.envs.Get(ctx, sys, h.ID)
			wantKind(t, err, apperr.ErrNotFound, "environment_not_found")
		})
	})
}

// TestSecretsAtRest creates environments with known secrets, exercises
// every path that writes (update, health check, audit) and then reads every
// column of every row of every table: no secret may appear in plain text.
// The sealed values are bound to the org and the environment.
func TestSecretsAtRest(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		ctx := context.Background()
		root := t.TempDir()
		if err := os.WriteFile(filepath.Join(root, "marker.txt"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		url, agentdTok := agentdtest.Start(t, agentdtest.WithRoot(root))
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{})
		updatedTok := "updated-secret-token-" + strings.Repeat("u", 16)
		secrets := []string{agentdTok, e2bfaketest.Token, e2bfaketest.APIKey, updatedTok}

		h := f.mustCreate(t, hostInput("host", url, agentdTok))
		s := f.mustCreate(t, sandboxInput("sbx", fake.URL(), fake.Domain(), e2bfaketest.Token, e2bfaketest.APIKey))
		other := f.mustCreate(t, hostInput("other", url, token("other")))
		if _, _, err := f.envs.Update(ctx, sys, other.ID, envs.Input{AgentdToken: ptr(updatedTok)}); err != nil {
			t.Fatal(err)
		}
		log := audit.NewLog(f.db, audit.OrgTable, nil)
		for _, e := range []envs.Environment{h, s} {
			if hl, err := f.envs.CheckAndRecord(ctx, e, log, 10*time.Second); err != nil || hl.Status != envs.HealthHealthy {
				t.Fatalf("check %s: %+v, %v", e.Name, hl, err)
			}
		}

		scanned := 0
		for _, table := range tables(t, f, d) {
			rows, err := f.db.Raw("SELECT * FROM " + store.QuoteIdent(table)).Rows()
			if err != nil {
				t.Fatalf("read %s: %v", table, err)
			}
			cols, _ := rows.Columns()
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatalf("scan %s: %v", table, err)
				}
				for i, v := range vals {
					text := fmt.Sprint(v)
					if b, ok := v.([]byte); ok {
						text = string(b)
					}
					scanned++
					for _, secret := range secrets {
						if strings.Contains(text, secret) {
							t.Errorf("%s.%s holds a secret in plain text: %q", table, cols[i], text)
						}
					}
				}
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if scanned == 0 {
			t.Fatal("scanned nothing")
		}

		// The sealed values open with the right org and environment only.
		if tok, err := f.envs.AgentdToken(h); err != nil || tok != agentdTok {
			t.Fatalf("AgentdToken = %q, %v", tok, err)
		}
		wrongOrg := &envs.Service{DB: f.db, Box: f.box, Org: "other-org"}
		if _, err := wrongOrg.AgentdToken(h); err == nil {
			t.Error("a token sealed for acme opened for other-org")
		}
		if _, err := wrongOrg.Backend(s); err == nil {
			t.Error("an api key sealed for acme opened for other-org")
		}
		if err := f.db.Exec("UPDATE environments SET sealed_agentd_token = ? WHERE id = ?", h.SealedAgentdToken, other.ID).Error; err != nil {
			t.Fatal(err)
		}
		moved, _ := f.envs.Get(ctx, sys, other.ID)
		if tok, err := f.envs.AgentdToken(moved); err == nil {
			t.Errorf("a token copied from environment %d opened in environment %d: %q", h.ID, other.ID, tok)
		} else if strings.Contains(err.Error(), agentdTok) {
			t.Errorf("the error shows the secret: %v", err)
		}
		if hl := f.envs.Check(ctx, moved, 5*time.Second); hl.Status != envs.HealthUnreachable {
			t.Errorf("check with an unopenable token = %+v", hl)
		}

		// The clients built from the sealed secrets work.
		c, err := f.envs.Agentd(h)
		if err != nil {
			t.Fatal(err)
		}
		// Stat is authenticated (unlike /healthz) and needs no process.
		st, err := c.Stat(ctx, "marker.txt")
		if err != nil || len(st) != 1 || !st[0].Exists {
			t.Fatalf("agentd client (authenticated stat): %+v, %v", st, err)
		}
		if _, err := agentd.NewClient(url, "wrong-token-wrong-token", nil).Stat(ctx, "marker.txt"); err == nil {
			t.Fatal("agentd accepted a wrong token: the check above proves nothing")
		}
		b, err := f.envs.Backend(s)
		if err != nil {
			t.Fatal(err)
		}
		if ts, err := b.ListTemplates(ctx); err != nil || len(ts) == 0 {
			t.Fatalf("backend client (authenticated list): %v, %v", ts, err)
		}
		if _, err := f.envs.Agentd(s); err == nil {
			t.Error("Agentd accepted a sandbox environment")
		}
		if _, err := f.envs.Backend(h); err == nil {
			t.Error("Backend accepted a host environment")
		}
	})
}

// tables lists every table of the org database.
func tables(t *testing.T, f fixture, d store.Dialect) []string {
	t.Helper()
	var names []string
	q := "SELECT name FROM sqlite_master WHERE type = 'table'"
	if d == store.Postgres {
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
	}
	if err := f.db.Raw(q).Scan(&names).Error; err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"environments", "templates", "agents", "audit_events"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Fatalf("table %s not listed in %v", want, names)
		}
	}
	return names
}
