package agents_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func ptr[T any](v T) *T { return &v }

// configField runs ParseConfig and returns its message for "config" ("" when
// valid) and the normalized JSON.
func configField(raw string) (string, string) {
	v := apperr.Validation()
	_, norm := agents.ParseConfig(raw, v)
	return v.Fields["config"], norm
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		raw  string
		want string // substring of the error; "" means valid
		norm string // expected normalized form when valid
	}{
		{"minimal", `{"model":"claude-sonnet-4"}`, "", `{"model":"claude-sonnet-4"}`},
		{"trimmed model and html kept", ` { "model" : " m1 ", "system_prompt": "a < b & c" } `, "", `{"model":"m1","system_prompt":"a < b & c"}`},
		{"full", `{"model":"m","skills":[{"name":"git.tools","source":"https://skills.example.com/git","mount_path":"/skills/git"},{"name":"local_1","source":"/opt/skills/x"}]}`, "",
			`{"model":"m","skills":[{"name":"git.tools","source":"https://skills.example.com/git","mount_path":"/skills/git"},{"name":"local_1","source":"/opt/skills/x"}]}`},
		{"uploaded and pinned", `{"model":"m","skills":[{"name":"a","source":"upload:a-bundle","sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},{"name":"b","source":"https://x/b.tgz","sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}`, "",
			`{"model":"m","skills":[{"name":"a","source":"upload:a-bundle","sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},{"name":"b","source":"https://x/b.tgz","sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}`},
		{"upload without name", `{"model":"m","skills":[{"name":"a","source":"upload:"}]}`, "must name an uploaded bundle", ""},
		{"upload bad name", `{"model":"m","skills":[{"name":"a","source":"upload:../x"}]}`, "must name an uploaded bundle", ""},
		{"dotdot source", `{"model":"m","skills":[{"name":"a","source":"/opt/../etc"}]}`, `skills[0].source must be an absolute path without ".."`, ""},
		{"short pin", `{"model":"m","skills":[{"name":"a","source":"https://x/a","sha256":"abc"}]}`, "sha256 must be 64 lowercase", ""},
		{"uppercase pin", `{"model":"m","skills":[{"name":"a","source":"https://x/a","sha256":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}]}`, "sha256 must be 64 lowercase", ""},
		{"pinned path", `{"model":"m","skills":[{"name":"a","source":"/opt/a","sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}`, "cannot pin a path source", ""},
		{"empty", "  ", "is required", ""},
		{"not json", `model: m`, "not valid", ""},
		{"unknown field", `{"model":"m","temperature":0.2}`, `unknown field "temperature"`, ""},
		{"unknown skill field", `{"model":"m","skills":[{"name":"a","source":"/a","mode":"rw"}]}`, `unknown field "mode"`, ""},
		{"two objects", `{"model":"m"} {"model":"n"}`, "single JSON object", ""},
		{"missing model", `{"system_prompt":"hi"}`, "config.model is required", ""},
		{"blank model", `{"model":"   "}`, "config.model is required", ""},
		{"long model", `{"model":"` + strings.Repeat("m", 201) + `"}`, "at most 200", ""},
		{"long prompt", `{"model":"m","system_prompt":"` + strings.Repeat("p", 100_001) + `"}`, "100,000", ""},
		{"bad skill name", `{"model":"m","skills":[{"name":"Git Tools","source":"/a"}]}`, "skills[0].name must be", ""},
		{"skill name too long", `{"model":"m","skills":[{"name":"` + strings.Repeat("s", 65) + `","source":"/a"}]}`, "skills[0].name must be", ""},
		{"missing source", `{"model":"m","skills":[{"name":"a"}]}`, "skills[0].source is required", ""},
		{"relative source", `{"model":"m","skills":[{"name":"a","source":"skills/a"}]}`, "skills[0].source must be", ""},
		{"ftp source", `{"model":"m","skills":[{"name":"a","source":"ftp://x/a"}]}`, "skills[0].source must be", ""},
		{"relative mount", `{"model":"m","skills":[{"name":"a","source":"/a","mount_path":"skills/a"}]}`, "skills[0].mount_path must be", ""},
		{"dotdot mount", `{"model":"m","skills":[{"name":"a","source":"/a","mount_path":"/skills/../etc"}]}`, "skills[0].mount_path must be", ""},
		{"duplicate skill", `{"model":"m","skills":[{"name":"a","source":"/a"},{"name":"b","source":"/b"},{"name":"a","source":"/c"}]}`, `skills[2].name "a" appears twice`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msg, norm := configField(tc.raw)
			if tc.want == "" {
				if msg != "" {
					t.Fatalf("valid config refused: %s", msg)
				}
				if norm != tc.norm {
					t.Errorf("normalized = %s, want %s", norm, tc.norm)
				}
				return
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error = %q, want it to contain %q", msg, tc.want)
			}
		})
	}
}

func TestTimings(t *testing.T) {
	for _, tt := range []struct {
		a             agents.Agent
		idle, reclaim time.Duration
	}{
		{agents.Agent{}, agents.DefaultIdleTimeout, agents.DefaultReclaimAfter},
		{agents.Agent{IdleTimeoutSeconds: -1, ReclaimAfterSeconds: -1}, agents.DefaultIdleTimeout, agents.DefaultReclaimAfter},
		{agents.Agent{IdleTimeoutSeconds: 90, ReclaimAfterSeconds: 7200}, 90 * time.Second, 2 * time.Hour},
	} {
		if got := tt.a.IdleTimeout(); got != tt.idle {
			t.Errorf("IdleTimeout(%d s) = %s, want %s", tt.a.IdleTimeoutSeconds, got, tt.idle)
		}
		if got := tt.a.ReclaimAfter(); got != tt.reclaim {
			t.Errorf("ReclaimAfter(%d s) = %s, want %s", tt.a.ReclaimAfterSeconds, got, tt.reclaim)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		patterns []string
		want     string // error substring; "" means valid
		norm     string
	}{
		{"nil", nil, "", "[]"},
		{"blanks dropped and trimmed", []string{" ^rm -rf ", "", "  ", `shutdown\b`}, "", `["^rm -rf","shutdown\\b"]`},
		{"bad regex numbered", []string{"ok", "([a-z"}, `Pattern 2 ("([a-z") is not a valid regular expression`, ""},
		{"perl lookahead is not RE2", []string{"(?=x)"}, "Pattern 1", ""},
		{"too long", []string{strings.Repeat("a", 501)}, "Pattern 1 is longer than 500", ""},
		{"too many", make([]string, 201), "At most 200 patterns", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := apperr.Validation()
			norm := agents.ParsePolicy(tc.patterns, v)
			msg := v.Fields["command_policy"]
			if tc.want == "" {
				if msg != "" || norm != tc.norm {
					t.Errorf("ParsePolicy = %s, %q; want %s", norm, msg, tc.norm)
				}
				return
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error = %q, want it to contain %q", msg, tc.want)
			}
		})
	}
}

func TestDeniedBy(t *testing.T) {
	t.Parallel()
	a := agents.Agent{CommandPolicy: `["^rm\\s+-rf\\s+/","(?i)shutdown","curl .*\\| *sh"]`}
	cases := []struct{ command, want string }{
		{"rm -rf /", `^rm\s+-rf\s+/`},
		{"rm  -rf /var", `^rm\s+-rf\s+/`},
		{"echo rm -rf /", ""},
		{"sudo SHUTDOWN -h now", "(?i)shutdown"},
		{"curl https://x.sh | sh", `curl .*\| *sh`},
		{"ls -la", ""},
	}
	for _, tc := range cases {
		if got := a.DeniedBy(tc.command); got != tc.want {
			t.Errorf("DeniedBy(%q) = %q, want %q", tc.command, got, tc.want)
		}
	}
	if got := (agents.Agent{}).DeniedBy("rm -rf /"); got != "" {
		t.Errorf("an agent without policy denied: %q", got)
	}
	if got := (agents.Agent{CommandPolicy: "[]"}).Policy(); len(got) != 0 {
		t.Errorf("Policy of [] = %v", got)
	}
}

// world is an org database with environments and templates for agents.
type world struct {
	db                 *gorm.DB
	envs               *envs.Service
	svc                *agents.Service
	deptA, deptB       int64
	host1, host2       envs.Environment
	hostA, hostB       envs.Environment // in departments A and B
	sbx, sbx2          envs.Environment
	tplReady, tplBuild envs.Template    // of sbx
	tplOther           envs.Template    // of sbx2
	hidden             envs.Environment // private to another user, not shared
	en                 *rbac.Enforcer
	admin              *authz.Actor // user 1, org-admin
	n                  int
}

// actor is user id holding roles, each "role@domain".
func (w *world) actor(t *testing.T, id int64, roles ...string) *authz.Actor {
	t.Helper()
	sub := rbac.UserSubject(id)
	for _, r := range roles {
		role, dom, _ := strings.Cut(r, "@")
		if _, err := w.en.Assign(context.Background(), rbac.Assignment{Subject: sub, Role: role, Domain: dom}); err != nil {
			t.Fatal(err)
		}
	}
	return authz.New(authz.Principal{Kind: "user", ID: fmt.Sprint(id), Name: sub, Subject: sub, UserID: id}, w.en, nil)
}

func newWorld(t *testing.T, d store.Dialect) *world {
	t.Helper()
	ctx := context.Background()
	db := storetest.Open(t, d, store.OrgSet)
	key := make([]byte, sealed.KeySize)
	_, _ = rand.Read(key)
	box, err := sealed.New(key)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{db: db, envs: &envs.Service{DB: db, Box: box, Org: "acme"}}
	w.svc = &agents.Service{DB: db, Envs: w.envs}
	if w.en, err = rbac.NewEnforcer(ctx, db); err != nil {
		t.Fatal(err)
	}
	w.admin = w.actor(t, 1, rbac.RoleOrgAdmin+"@"+rbac.DomainOrg)
	w.deptA, w.deptB = department(t, db, "a"), department(t, db, "b")
	tok := strings.Repeat("t", envs.MinTokenLength)
	host := func(name string, dept *int64) envs.Environment {
		e, err := w.envs.Create(ctx, w.admin, envs.Input{Name: ptr(name), Kind: envs.KindHost, DepartmentID: dept, URL: ptr("https://" + name + ":49984"),
			OS: ptr("linux"), Deployment: ptr("cloud-vm"), AgentdToken: ptr(tok)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	sbx := func(name string) envs.Environment {
		e, err := w.envs.Create(ctx, w.admin, envs.Input{Name: ptr(name), Kind: envs.KindSandbox, URL: ptr("https://api.e2b.app"),
			SandboxDomain: ptr("e2b.app"), AgentdToken: ptr(tok)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	tpl := func(env envs.Environment, id, status string) envs.Template {
		tp, err := w.envs.AddTemplate(ctx, w.admin, env.ID, envs.TemplateInput{BackendTemplateID: id, VCPU: 1, MemoryMB: 512, BackendStatus: status})
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	w.host1, w.host2, w.hostA, w.hostB = host("host1", nil), host("host2", nil), host("hosta", &w.deptA), host("hostb", &w.deptB)
	other, _, err := (&directory.Directory{DB: db}).CreateUser(ctx, "other@example.com", "Other")
	if err != nil {
		t.Fatal(err)
	}
	hidden, err := w.envs.Create(ctx, w.actor(t, other.ID), envs.Input{Name: ptr("hidden"), Kind: envs.KindHost, URL: ptr("https://hidden:49984"),
		OS: ptr("linux"), Deployment: ptr("cloud-vm"), AgentdToken: ptr(tok), Private: true})
	if err != nil {
		t.Fatal(err)
	}
	w.hidden = hidden
	w.sbx, w.sbx2 = sbx("sbx"), sbx("sbx2")
	w.tplReady, w.tplBuild, w.tplOther = tpl(w.sbx, "base", "ready"), tpl(w.sbx, "building", "building"), tpl(w.sbx2, "other", "ready")
	return w
}

func department(t *testing.T, db *gorm.DB, name string) int64 {
	t.Helper()
	now := time.Now().UTC()
	if err := db.Exec("INSERT INTO departments (name, description, created_at, updated_at) VALUES (?, '', ?, ?)", name, now, now).Error; err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := db.Raw("SELECT id FROM departments WHERE name = ?", name).Scan(&id).Error; err != nil || id == 0 {
		t.Fatalf("department id: %v", err)
	}
	return id
}

func base(envIDs ...int64) agents.Input {
	return agents.Input{Name: ptr("agent"), Config: ptr(`{"model":"m"}`), EnvironmentIDs: envIDs}
}

// TestValidationRules proves every rule of validate() refuses with a field
// error that says which rule failed, on both dialects.
func TestValidationRules(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d)
		ctx := context.Background()
		perSession := func(tpl int64, envIDs ...int64) agents.Input {
			in := base(envIDs...)
			in.SandboxMode = ptr(agents.SandboxPerSession)
			if tpl != 0 {
				in.TemplateID = &tpl
			}
			return in
		}
		with := func(in agents.Input, fn func(*agents.Input)) agents.Input { fn(&in); return in }
		cases := []struct {
			name  string
			in    agents.Input
			field string
			want  string // "" means valid
		}{
			{"valid host agent", base(w.host1.ID), "", ""},
			{"valid per-session", perSession(w.tplReady.ID, w.sbx.ID), "", ""},
			{"valid per-session with host default", with(perSession(w.tplReady.ID, w.sbx.ID, w.host1.ID), func(in *agents.Input) {
				in.DefaultEnvironmentID = &w.host1.ID
			}), "", ""},
			{"valid department match", with(base(w.hostB.ID), func(in *agents.Input) { in.DepartmentID = &w.deptB }), "", ""},
			{"bad name", with(base(w.host1.ID), func(in *agents.Input) { in.Name = ptr("-bad") }), "name", "starting with a letter or digit"},
			{"empty name", with(base(w.host1.ID), func(in *agents.Input) { in.Name = ptr(" ") }), "name", "1–100"},
			{"long description", with(base(w.host1.ID), func(in *agents.Input) { in.Description = ptr(strings.Repeat("d", 2001)) }), "description", "2000"},
			{"missing config", with(base(w.host1.ID), func(in *agents.Input) { in.Config = nil }), "config", "is required"},
			{"config unknown field", with(base(w.host1.ID), func(in *agents.Input) { in.Config = ptr(`{"model":"m","x":1}`) }), "config", "unknown field"},
			{"bad sandbox mode", with(base(w.host1.ID), func(in *agents.Input) { in.SandboxMode = ptr("always") }), "sandbox_mode", `"off"`},
			{"idle too short", with(base(w.host1.ID), func(in *agents.Input) { in.IdleTimeout = ptr(30 * time.Second) }), "idle_timeout", "1 minute to 7 days"},
			{"reclaim too long", with(base(w.host1.ID), func(in *agents.Input) { in.ReclaimAfter = ptr(91 * 24 * time.Hour) }), "reclaim_after", "1 minute to 90 days"},
			{"bad policy", with(base(w.host1.ID), func(in *agents.Input) { in.CommandPolicy = []string{"ok", "(", "fine"} }), "command_policy", "Pattern 2"},
			{"missing department", with(base(w.host1.ID), func(in *agents.Input) { in.DepartmentID = ptr(int64(999_999)) }), "department_id", "does not exist"},
			{"no environments", base(), "environment_ids", "at least one"},
			{"unknown environment", base(999_999), "environment_ids", "Environment 999999 does not exist or you may not use it"},
			{"environment not usable", base(w.hidden.ID), "environment_ids", fmt.Sprintf("Environment %d does not exist or you may not use it", w.hidden.ID)},
			{"environment of another department", with(base(w.hostB.ID), func(in *agents.Input) { in.DepartmentID = &w.deptA }), "environment_ids", "another department"},
			{"default not allowed", with(base(w.host1.ID), func(in *agents.Input) { in.DefaultEnvironmentID = &w.host2.ID }), "default_environment_id", "one of the allowed"},
			{"default missing among several", base(w.host1.ID, w.host2.ID), "default_environment_id", "Choose which"},
			{"off needs a host default", base(w.sbx.ID), "default_environment_id", "must be a host"},
			{"off with sandbox default among several", with(base(w.host1.ID, w.sbx.ID), func(in *agents.Input) { in.DefaultEnvironmentID = &w.sbx.ID }), "default_environment_id", "must be a host"},
			{"per-session needs a sandbox env", perSession(w.tplReady.ID, w.host1.ID), "sandbox_mode", "need a sandbox environment"},
			{"per-session needs a template", perSession(0, w.sbx.ID), "template_id", "need a template"},
			{"per-session unknown template", perSession(999_999, w.sbx.ID), "template_id", "Template 999999 is not one of the agent's sandbox environments"},
			{"per-session template of another env", perSession(w.tplOther.ID, w.sbx.ID), "template_id", "one of the agent's sandbox environments"},
			{"per-session template not ready", perSession(w.tplBuild.ID, w.sbx.ID), "template_id", "is not ready at the backend (status building)"},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				in := tc.in
				if tc.field != "name" {
					in.Name = ptr(fmt.Sprintf("agent-%d", i))
				}
				a, err := w.svc.Create(ctx, w.admin, in)
				if tc.want == "" {
					if err != nil {
						t.Fatalf("valid input refused: %v", err)
					}
					got, err := w.svc.Get(ctx, w.admin, a.ID)
					if err != nil || len(got.EnvironmentIDs) != len(tc.in.EnvironmentIDs) {
						t.Errorf("Get = %+v, %v", got, err)
					}
					return
				}
				var v *apperr.ValidationError
				if !errors.As(err, &v) {
					t.Fatalf("want a validation error, got %v", err)
				}
				msg, ok := v.Fields[tc.field]
				if !ok {
					t.Fatalf("want an error on %q, got %v", tc.field, v.Fields)
				}
				if !strings.Contains(msg, tc.want) {
					t.Errorf("error on %q = %q, want it to contain %q", tc.field, msg, tc.want)
				}
				var n int64
				w.db.Table("agents").Where("name = ?", *in.Name).Count(&n)
				if n != 0 {
					t.Error("refused agent was stored")
				}
			})
		}
	})
}

// TestCRUD covers defaults, normalization, environment links, updates,
// duplicates, the department filter and deletion.
func TestCRUD(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d)
		ctx := context.Background()
		clock := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		w.svc.Now = func() time.Time { return clock }

		in := base(w.host2.ID, w.host1.ID, w.host1.ID, 0)
		in.Name, in.Description = ptr(" coder "), ptr(" writes code ")
		in.Config = ptr(`{ "model": "claude-sonnet-4" }`)
		in.DefaultEnvironmentID = &w.host2.ID
		in.TemplateID = &w.tplReady.ID // ignored with sandbox mode off
		a, err := w.svc.Create(ctx, w.admin, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.svc.Get(ctx, w.admin, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "coder" || got.Description != "writes code" || got.Config != `{"model":"claude-sonnet-4"}` ||
			got.SandboxMode != agents.SandboxOff || got.TemplateID != nil || got.DefaultEnvironmentID != w.host2.ID ||
			got.CommandPolicy != "[]" || got.CreatedBy != "user:1" || got.DepartmentID != nil || !got.CreatedAt.Equal(clock) {
			t.Errorf("stored %+v", got)
		}
		if got.IdleTimeoutSeconds != int(agents.DefaultIdleTimeout.Seconds()) || got.IdleTimeoutSeconds != 15*60 ||
			got.ReclaimAfterSeconds != int(agents.DefaultReclaimAfter.Seconds()) || got.ReclaimAfterSeconds != 60*60 {
			t.Errorf("defaults: idle %d s, reclaim %d s; want 900 and 3600", got.IdleTimeoutSeconds, got.ReclaimAfterSeconds)
		}
		if fmt.Sprint(got.EnvironmentIDs) != fmt.Sprint([]int64{w.host1.ID, w.host2.ID}) {
			t.Errorf("environments = %v, want deduplicated and sorted [%d %d]", got.EnvironmentIDs, w.host1.ID, w.host2.ID)
		}

		t.Run("duplicate name", func(t *testing.T) {
			_, err := w.svc.Create(ctx, w.admin, base(w.host1.ID))
			if err != nil {
				t.Fatal(err)
			}
			_, err = w.svc.Create(ctx, w.admin, base(w.host1.ID))
			var v *apperr.ValidationError
			if !errors.As(err, &v) || !strings.Contains(v.Fields["name"], "already exists") {
				t.Fatalf("duplicate = %v", err)
			}
			_, _, err = w.svc.Update(ctx, w.admin, a.ID, agents.Input{Name: ptr("agent")})
			if !errors.As(err, &v) || !strings.Contains(v.Fields["name"], "already exists") {
				t.Fatalf("rename onto a duplicate = %v", err)
			}
		})

		t.Run("update", func(t *testing.T) {
			clock = clock.Add(time.Hour)
			before, after, err := w.svc.Update(ctx, w.admin, a.ID, agents.Input{
				SandboxMode: ptr(agents.SandboxPerSession), TemplateID: &w.tplReady.ID,
				EnvironmentIDs: []int64{w.sbx.ID, w.host1.ID}, DefaultEnvironmentID: &w.sbx.ID,
				IdleTimeout: ptr(5 * time.Minute), ReclaimAfter: ptr(2 * time.Hour), CommandPolicy: []string{"^rm -rf"},
			})
			if err != nil {
				t.Fatal(err)
			}
			if before.SandboxMode != agents.SandboxOff || after.SandboxMode != agents.SandboxPerSession {
				t.Errorf("before/after modes %q/%q", before.SandboxMode, after.SandboxMode)
			}
			if fmt.Sprint(before.EnvironmentIDs) != fmt.Sprint([]int64{w.host1.ID, w.host2.ID}) {
				t.Errorf("before.EnvironmentIDs = %v aliased the update", before.EnvironmentIDs)
			}
			got, _ := w.svc.Get(ctx, w.admin, a.ID)
			if got.TemplateID == nil || *got.TemplateID != w.tplReady.ID || got.DefaultEnvironmentID != w.sbx.ID ||
				got.IdleTimeoutSeconds != 300 || got.ReclaimAfterSeconds != 7200 || got.DeniedBy("rm -rf /") != "^rm -rf" ||
				fmt.Sprint(got.EnvironmentIDs) != fmt.Sprint([]int64{w.host1.ID, w.sbx.ID}) ||
				got.Config != `{"model":"claude-sonnet-4"}` || got.Name != "coder" || !got.UpdatedAt.Equal(clock) {
				t.Errorf("after update %+v", got)
			}
			// A refused update changes nothing.
			_, _, err = w.svc.Update(ctx, w.admin, a.ID, agents.Input{TemplateID: &w.tplBuild.ID})
			var v *apperr.ValidationError
			if !errors.As(err, &v) || v.Fields["template_id"] == "" {
				t.Fatalf("not-ready template accepted: %v", err)
			}
			if again, _ := w.svc.Get(ctx, w.admin, a.ID); *again.TemplateID != w.tplReady.ID {
				t.Error("a refused update was stored")
			}
			// Back to off: the template goes, the default must be a host.
			_, _, err = w.svc.Update(ctx, w.admin, a.ID, agents.Input{SandboxMode: ptr(agents.SandboxOff)})
			if !errors.As(err, &v) || !strings.Contains(v.Fields["default_environment_id"], "must be a host") {
				t.Fatalf("off with a sandbox default = %v", err)
			}
			_, after, err = w.svc.Update(ctx, w.admin, a.ID, agents.Input{SandboxMode: ptr(agents.SandboxOff), DefaultEnvironmentID: &w.host1.ID})
			if err != nil || after.TemplateID != nil {
				t.Fatalf("back to off: %+v, %v", after.TemplateID, err)
			}
			if got, _ := w.svc.Get(ctx, w.admin, a.ID); got.TemplateID != nil || got.SandboxMode != agents.SandboxOff {
				t.Errorf("stored %+v", got)
			}
			_, _, err = w.svc.Update(ctx, w.admin, 999_999, agents.Input{})
			if !errors.Is(err, apperr.ErrNotFound) {
				t.Errorf("update of a missing agent = %v", err)
			}
		})

		t.Run("list by department", func(t *testing.T) {
			ia := base(w.host1.ID)
			ia.Name, ia.DepartmentID = ptr("in-a"), &w.deptA
			ib := base(w.hostB.ID)
			ib.Name, ib.DepartmentID = ptr("in-b"), &w.deptB
			for _, in := range []agents.Input{ia, ib} {
				if _, err := w.svc.Create(ctx, w.admin, in); err != nil {
					t.Fatal(err)
				}
			}
			names := func(a *authz.Actor) string {
				list, err := w.svc.List(ctx, a)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, a := range list {
					if len(a.EnvironmentIDs) == 0 {
						t.Errorf("agent %s listed without environments", a.Name)
					}
					out = append(out, a.Name)
				}
				return strings.Join(out, ",")
			}
			// Org-wide agents are everyone's; a department's its members'.
			if got := names(w.admin); got != "agent,coder,in-a,in-b" {
				t.Errorf("org admin sees %s", got)
			}
			if got := names(w.actor(t, 10, rbac.RoleMember+"@"+rbac.DeptDomain(w.deptA))); got != "agent,coder,in-a" {
				t.Errorf("member of A sees %s", got)
			}
			if got := names(w.actor(t, 11, rbac.RoleMember+"@"+rbac.DeptDomain(w.deptA), rbac.RoleMember+"@"+rbac.DeptDomain(w.deptB))); got != "agent,coder,in-a,in-b" {
				t.Errorf("member of A and B sees %s", got)
			}
			if got := names(w.actor(t, 12)); got != "agent,coder" {
				t.Errorf("member of nothing sees %s", got)
			}
		})

		t.Run("delete", func(t *testing.T) {
			del, err := w.svc.Delete(ctx, w.admin, a.ID)
			if err != nil || del.Name != "coder" || len(del.EnvironmentIDs) == 0 {
				t.Fatalf("Delete = %+v, %v", del, err)
			}
			if _, err := w.svc.Get(ctx, w.admin, a.ID); !errors.Is(err, apperr.ErrNotFound) {
				t.Errorf("Get after delete = %v", err)
			}
			var links int64
			w.db.Table("agent_environments").Where("agent_id = ?", a.ID).Count(&links)
			if links != 0 {
				t.Errorf("%d environment links left", links)
			}
			if _, err := w.svc.Delete(ctx, w.admin, a.ID); !errors.Is(err, apperr.ErrNotFound) {
				t.Errorf("second delete = %v", err)
			}
		})
	})
}
