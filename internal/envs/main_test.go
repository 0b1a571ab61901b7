package envs_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// agentdBin is the agentd the fake sandbox backends run.
var agentdBin e2bfaketest.Binary

// sys acts with every permission: these tests are about the domain rules;
// who may use them is tested in access_test.go.
var sys = authz.System("tester")

func TestMain(m *testing.M) {
	e2bfaketest.Main(m, func(b e2bfaketest.Binary) { agentdBin = b })
}

// testOrg is the org slug every fixture seals its secrets under.
const testOrg = "acme"

// fixture is one migrated org database with the services over it.
type fixture struct {
	db     *gorm.DB
	box    *sealed.Box
	envs   *envs.Service
	agents *agents.Service
}

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

func setup(t testing.TB, d store.Dialect) fixture {
	t.Helper()
	return over(t, storetest.Open(t, d, store.OrgSet), newBox(t))
}

func over(t testing.TB, db *gorm.DB, box *sealed.Box) fixture {
	t.Helper()
	svc := &envs.Service{DB: db, Box: box, Org: testOrg}
	return fixture{db: db, box: box, envs: svc, agents: &agents.Service{DB: db, Envs: svc}}
}

func ptr[T any](v T) *T { return &v }

// token returns a valid agentd token of at least envs.MinTokenLength.
func token(tag string) string { return "tok-" + tag + "-" + strings.Repeat("x", envs.MinTokenLength) }

func hostInput(name, url, tok string) envs.Input {
	return envs.Input{Name: ptr(name), Kind: envs.KindHost, URL: ptr(url), OS: ptr("linux"),
		Deployment: ptr("bare-metal"), AgentdToken: ptr(tok)}
}

func sandboxInput(name, apiURL, domain, tok, apiKey string) envs.Input {
	in := envs.Input{Name: ptr(name), Kind: envs.KindSandbox, URL: ptr(apiURL), SandboxDomain: ptr(domain),
		SandboxScheme: ptr("http"), AgentdToken: ptr(tok)}
	if apiKey != "" {
		in.APIKey = ptr(apiKey)
	}
	return in
}

func (f fixture) mustCreate(t testing.TB, in envs.Input) envs.Environment {
	t.Helper()
	e, err := f.envs.Create(context.Background(), sys, in)
	if err != nil {
		t.Fatalf("create environment %q: %v", *in.Name, err)
	}
	return e
}

// newDepartment inserts a department directly: the directory package is
// not what is under test here.
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

// fields returns the field errors of a validation failure, failing the test
// on any other outcome.
func fields(t testing.TB, err error) map[string]string {
	t.Helper()
	var v *apperr.ValidationError
	if !errors.As(err, &v) {
		t.Fatalf("want a validation error, got %v", err)
	}
	return v.Fields
}

// wantField asserts err is a validation error naming field with a message
// containing want.
func wantField(t testing.TB, err error, field, want string) {
	t.Helper()
	fs := fields(t, err)
	msg, ok := fs[field]
	if !ok {
		t.Fatalf("want an error on %q, got %v", field, fs)
	}
	if !strings.Contains(msg, want) {
		t.Errorf("error on %q = %q, want it to contain %q", field, msg, want)
	}
	if !strings.HasSuffix(msg, ".") {
		t.Errorf("error on %q = %q is not a full sentence", field, msg)
	}
}

// wantKind asserts err is an *apperr.Error of kind with code.
func wantKind(t testing.TB, err error, kind error, code string) {
	t.Helper()
	var ae *apperr.Error
	if !errors.Is(err, kind) || !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("want %v with code %q, got %#v (%v)", kind, code, err, err)
	}
}
