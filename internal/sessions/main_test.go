package sessions_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// agentdBin is the agentd the fake sandbox backends run.
var agentdBin e2bfaketest.Binary

func TestMain(m *testing.M) {
	e2bfaketest.Main(m, func(b e2bfaketest.Binary) { agentdBin = b })
}

const testOrg = "acme"

// sys acts with every permission: tests of the lifecycle; who may use it
// is tested in access_test.go.
func sys() *authz.Actor { return authz.System("tester") }

// world is one migrated org database with the services over it, a fake
// sandbox backend with real agentd processes, a sandbox environment on it,
// a department and a per-session agent.
type world struct {
	db    *gorm.DB
	box   *sealed.Box
	envs  *envs.Service
	ags   *agents.Service
	log   *audit.Log
	rt    *sessions.Runtime
	fake  *e2bfake.Server
	clock *clock
	env   envs.Environment
	dept  int64
	agent agents.Agent
	n     int
}

// clock is the console's clock in tests: it follows the fake's, which
// Advance moves.
type clock struct{ fake *e2bfake.Server }

func (c *clock) Now() time.Time { return c.fake.Now() }

func newBox(t testing.TB) *sealed.Box {
	t.Helper()
	key := make([]byte, sealed.KeySize)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	box, err := sealed.New(key)
	if err != nil {
		t.Fatal(err)
	}
	return box
}

func ptr[T any](v T) *T { return &v }

// newWorld builds a world on dialect d; cfg configures the fake (a real
// agentd per sandbox unless cfg.Launcher says otherwise).
func newWorld(t testing.TB, d store.Dialect, cfg e2bfake.Config) *world {
	t.Helper()
	db := storetest.Open(t, d, store.OrgSet)
	return newWorldOn(t, db, newBox(t), cfg)
}

func newWorldOn(t testing.TB, db *gorm.DB, box *sealed.Box, cfg e2bfake.Config) *world {
	t.Helper()
	w := &world{db: db, box: box, fake: e2bfaketest.New(t, agentdBin, cfg)}
	w.clock = &clock{fake: w.fake}
	w.envs = &envs.Service{DB: db, Box: box, Org: testOrg, Now: w.clock.Now}
	w.ags = &agents.Service{DB: db, Envs: w.envs}
	w.log = audit.NewLog(db, audit.OrgTable, nil)
	w.rt = &sessions.Runtime{Now: w.clock.Now}
	ctx := context.Background()
	w.dept = newDepartment(t, db, "research")
	in := envs.Input{Name: ptr("sandboxes"), Kind: envs.KindSandbox, URL: ptr(w.fake.URL()), ProxyBaseURL: ptr(w.fake.ProxyURL()),
		SandboxScheme: ptr("http"), AgentdToken: ptr(e2bfaketest.Token), APIKey: ptr(e2bfaketest.APIKey), DepartmentID: &w.dept}
	var err error
	if w.env, err = w.envs.Create(ctx, sys(), in); err != nil {
		t.Fatalf("create environment: %v", err)
	}
	tpl, err := w.envs.ImportTemplate(ctx, sys(), w.env.ID, "base")
	if err != nil {
		t.Fatalf("import template: %v", err)
	}
	w.agent, err = w.ags.Create(ctx, sys(), agents.Input{DepartmentID: &w.dept, Name: ptr("coder"), Config: ptr(`{"model":"m"}`),
		SandboxMode: ptr(agents.SandboxPerSession), TemplateID: &tpl.ID, EnvironmentIDs: []int64{w.env.ID},
		IdleTimeout: ptr(5 * time.Minute), ReclaimAfter: ptr(60 * time.Minute)})
	if err != nil {
		t.Fatalf("create agent: %v", err)
	}
	return w
}

// svc is a session service as one console process would make it; rt is
// that process's runtime (nil: the world's).
func (w *world) svc(rt *sessions.Runtime) *sessions.Service {
	return w.svcOn(w.db, rt)
}

func (w *world) svcOn(db *gorm.DB, rt *sessions.Runtime) *sessions.Service {
	if rt == nil {
		rt = w.rt
	}
	e := &envs.Service{DB: db, Box: w.box, Org: testOrg, Now: w.clock.Now}
	return &sessions.Service{DB: db, Envs: e, Agents: &agents.Service{DB: db, Envs: e}, Org: testOrg,
		Audit: audit.NewLog(db, audit.OrgTable, nil), RT: rt}
}

// person makes a user holding roles ("role@domain"; "D" is the world's
// department, "O" another one).
func (w *world) person(t testing.TB, en *rbac.Enforcer, other int64, roles ...string) *authz.Actor {
	t.Helper()
	w.n++
	u, _, err := (&directory.Directory{DB: w.db}).CreateUser(context.Background(), fmt.Sprintf("p%d@example.com", w.n), "P")
	if err != nil {
		t.Fatal(err)
	}
	sub := rbac.UserSubject(u.ID)
	for _, r := range roles {
		role, dom, _ := strings.Cut(r, "@")
		dom = strings.NewReplacer("D", rbac.DeptDomain(w.dept), "O", rbac.DeptDomain(other)).Replace(dom)
		if _, err := en.Assign(context.Background(), rbac.Assignment{Subject: sub, Role: role, Domain: dom}); err != nil {
			t.Fatal(err)
		}
	}
	return authz.New(authz.Principal{Kind: "user", ID: fmt.Sprint(u.ID), Name: u.Email, Subject: sub, UserID: u.ID}, en, nil)
}

func newDepartment(t testing.TB, db *gorm.DB, name string) int64 {
	t.Helper()
	now := time.Now().UTC()
	if err := db.Exec("INSERT INTO departments (name, description, created_at, updated_at) VALUES (?, '', ?, ?)", name, now, now).Error; err != nil {
		t.Fatalf("insert department: %v", err)
	}
	var id int64
	if err := db.Raw("SELECT id FROM departments WHERE name = ?", name).Scan(&id).Error; err != nil || id == 0 {
		t.Fatalf("read department id: %v", err)
	}
	return id
}

// newSession creates a pending session of the world's agent as a.
func (w *world) newSession(t testing.TB, svc *sessions.Service, a *authz.Actor) sessions.Session {
	t.Helper()
	s, err := svc.Create(context.Background(), a, sessions.CreateInput{AgentID: w.agent.ID})
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	return s
}

// agentdOf is a client for the session's agentd, as the gateway reaches
// it.
func agentdOf(tg sessions.Target) *agentd.Client {
	return agentd.NewClient(tg.AgentdURL, tg.AgentdToken, &http.Client{Timeout: 30 * time.Second})
}

// run runs a shell command in the session's workspace and returns stdout.
func run(t testing.TB, tg sessions.Target, cmd string) string {
	t.Helper()
	res, err := agentdOf(tg).Run(context.Background(), agentd.CreateSessionRequest{Command: cmd, Cwd: tg.Workspace, WaitMS: 10_000})
	if err != nil {
		t.Fatalf("run %q: %v", cmd, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("run %q: exit %d: %s", cmd, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// tagged lists the fake's sandboxes tagged with a session id.
func (w *world) tagged(t testing.TB, id int64) []string {
	t.Helper()
	b, err := w.envs.Backend(w.env)
	if err != nil {
		t.Fatal(err)
	}
	list, err := b.List(context.Background(), listFilter(id))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range list {
		out = append(out, in.ID)
	}
	return out
}

// auditActions returns the actions recorded for a session, oldest first.
func (w *world) auditActions(t testing.TB, id int64) []string {
	t.Helper()
	var out []string
	if err := w.db.Table(audit.OrgTable).Where("target_type = ? AND target_id = ?", "session", fmt.Sprint(id)).Order("seq").Pluck("action", &out).Error; err != nil {
		t.Fatal(err)
	}
	return out
}
