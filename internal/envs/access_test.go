package envs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/authz/authztest"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// accessWorld is an org with two departments and people in each role.
type accessWorld struct {
	fixture
	en           *rbac.Enforcer
	deptA, deptB int64
	n            int
}

func newAccessWorld(t *testing.T, d store.Dialect) *accessWorld {
	t.Helper()
	f := setup(t, d)
	en, err := rbac.NewEnforcer(context.Background(), f.db)
	if err != nil {
		t.Fatal(err)
	}
	return &accessWorld{fixture: f, en: en, deptA: newDepartment(t, f.db, "a"), deptB: newDepartment(t, f.db, "b")}
}

// person makes a user holding roles ("role@domain"); "A" and "B" stand for
// the departments' domains.
func (w *accessWorld) person(t *testing.T, roles ...string) *authz.Actor {
	t.Helper()
	w.n++
	u, _, err := (&directory.Directory{DB: w.db}).CreateUser(context.Background(), fmt.Sprintf("p%d@example.com", w.n), "P")
	if err != nil {
		t.Fatal(err)
	}
	sub := rbac.UserSubject(u.ID)
	for _, r := range roles {
		role, dom, _ := strings.Cut(r, "@")
		dom = strings.NewReplacer("A", rbac.DeptDomain(w.deptA), "B", rbac.DeptDomain(w.deptB)).Replace(dom)
		if _, err := w.en.Assign(context.Background(), rbac.Assignment{Subject: sub, Role: role, Domain: dom}); err != nil {
			t.Fatal(err)
		}
	}
	return authz.New(authz.Principal{Kind: "user", ID: fmt.Sprint(u.ID), Name: u.Email, Subject: sub, UserID: u.ID}, w.en, nil)
}

// hostIn creates a shared host in dept (nil: org-wide) as the system.
func (w *accessWorld) hostIn(t *testing.T, dept *int64) envs.Environment {
	t.Helper()
	w.n++
	in := hostInput(fmt.Sprintf("host-%d", w.n), "http://127.0.0.1:1", token("h"))
	in.DepartmentID = dept
	return w.mustCreate(t, in)
}

// sandboxIn creates a sandbox backend environment in dept with one
// template. Its backend is not there: allowed calls that reach it fail with
// a backend error, which is not an authorization answer.
func (w *accessWorld) sandboxIn(t *testing.T, dept *int64) (envs.Environment, envs.Template) {
	t.Helper()
	w.n++
	in := sandboxInput(fmt.Sprintf("sbx-%d", w.n), "http://127.0.0.1:1", "e2b.app", token("s"), "")
	in.DepartmentID = dept
	e := w.mustCreate(t, in)
	tpl, err := w.envs.AddTemplate(context.Background(), sys, e.ID, envs.TemplateInput{BackendTemplateID: "base", VCPU: 1, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	return e, tpl
}

// accessCase runs one method as actor against fresh objects in department
// A and reports the call's error.
type accessCase func(t *testing.T, w *accessWorld, a *authz.Actor) error

// envCases has an entry for every method of envs.Service that takes an
// actor; TestEveryEnvMethodIsAuthorized fails when one is missing.
func envCases() map[string]accessCase {
	ctx := context.Background()
	return map[string]accessCase{
		"Get": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.envs.Get(ctx, a, w.hostIn(t, &w.deptA).ID)
			return err
		},
		"Manageable": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.envs.Manageable(ctx, a, w.hostIn(t, &w.deptA).ID)
			return err
		},
		"Update": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, _, err := w.envs.Update(ctx, a, w.hostIn(t, &w.deptA).ID, envs.Input{OS: ptr("macos")})
			return err
		},
		"Delete": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.envs.Delete(ctx, a, w.hostIn(t, &w.deptA).ID)
			return err
		},
		"Test": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, _, err := w.envs.Test(ctx, a, w.hostIn(t, &w.deptA).ID, nil, time.Second)
			return err
		},
		"Create": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			w.n++
			in := hostInput(fmt.Sprintf("new-%d", w.n), "http://127.0.0.1:1", token("n"))
			in.DepartmentID = &w.deptA
			_, err := w.envs.Create(ctx, a, in)
			return err
		},
		"Templates": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			e, _ := w.sandboxIn(t, &w.deptA)
			_, err := w.envs.Templates(ctx, a, e.ID)
			return err
		},
		"GetTemplate": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, tpl := w.sandboxIn(t, &w.deptA)
			_, err := w.envs.GetTemplate(ctx, a, tpl.ID)
			return err
		},
		"AddTemplate": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			e, _ := w.sandboxIn(t, &w.deptA)
			_, err := w.envs.AddTemplate(ctx, a, e.ID, envs.TemplateInput{BackendTemplateID: "gpu", VCPU: 1, MemoryMB: 256})
			return err
		},
		"DeleteTemplate": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			e, tpl := w.sandboxIn(t, &w.deptA)
			_, err := w.envs.DeleteTemplate(ctx, a, e.ID, tpl.ID)
			return err
		},
		"ImportInput": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			e, _ := w.sandboxIn(t, &w.deptA)
			_, err := w.envs.ImportInput(ctx, a, e.ID, "base")
			return err
		},
		"ImportTemplate": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			e, _ := w.sandboxIn(t, &w.deptA)
			_, err := w.envs.ImportTemplate(ctx, a, e.ID, "base")
			return err
		},
		"BackendTemplates": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			e, _ := w.sandboxIn(t, &w.deptA)
			_, err := w.envs.BackendTemplates(ctx, a, e.ID)
			return err
		},
		// The rest answer questions rather than refuse: their cases check
		// the answer.
		"List": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			e := w.hostIn(t, &w.deptA)
			list, err := w.envs.List(ctx, a)
			return refuseUnless(err, containsEnv(list, e.ID), "List")
		},
		"CanManage": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			ok, err := w.envs.CanManage(ctx, a, w.hostIn(t, &w.deptA))
			return refuseUnless(err, ok, "CanManage")
		},
		"CanCreateShared": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			ok, err := w.envs.CanCreateShared(ctx, a)
			return refuseUnless(err, ok, "CanCreateShared")
		},
		"Usable": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			ok, err := w.envs.Usable(ctx, a, w.hostIn(t, &w.deptA))
			return refuseUnless(err, ok, "Usable")
		},
	}
}

// answers are the methods whose refusal is an answer, not an error: they
// record no denial.
var answers = map[string]bool{"List": true, "CanManage": true, "CanCreateShared": true, "Usable": true}

// errRefused stands for a "no" from a method that answers a question.
type errRefused string

func (e errRefused) Error() string { return string(e) + " said no" }

func refuseUnless(err error, ok bool, name string) error {
	if err != nil {
		return err
	}
	if !ok {
		return errRefused(name)
	}
	return nil
}

func containsEnv(list []envs.Environment, id int64) bool {
	for _, e := range list {
		if e.ID == id {
			return true
		}
	}
	return false
}

// manages lists the methods that change an environment (or reach its
// backend with its secrets): members of its department may see, not use.
var manages = map[string]bool{"Manageable": true, "Update": true, "Delete": true, "Test": true, "Create": true, "AddTemplate": true,
	"DeleteTemplate": true, "ImportInput": true, "ImportTemplate": true, "BackendTemplates": true, "CanManage": true, "CanCreateShared": true}

// unguardedEnvMethods take no actor, and why that is safe.
var unguardedEnvMethods = map[string]string{
	"Check":              "probes an environment the caller already holds (loaded through Get/Test, or by the system health checker)",
	"CheckAndRecord":     "records a probe of an environment the caller already holds; called by Test and the system health checker",
	"RecordHealth":       "the health checker's write, as the system",
	"AgentdToken":        "opens the secret of an environment the caller already holds, for the gateway's injection; never returned to clients",
	"Agentd":             "builds a client for an environment the caller already holds",
	"Backend":            "builds a client for an environment the caller already holds",
	"RecordStartFailure": "the session lifecycle's write, as the system, about an environment the caller's session already resolved",
	"ImportInputFor":     "reads a template from the console's own local backend (settings the server holds, not the caller's), only after CanCreateShared allowed the caller; envs.Create then decides",
	"ClearStartFailure":  "the session lifecycle's write, as the system, once a sandbox started in an environment already resolved",
}

func TestEveryEnvMethodIsAuthorized(t *testing.T) {
	tested := map[string]bool{}
	for name := range envCases() {
		tested[name] = true
	}
	authztest.Accounted(t, &envs.Service{}, tested, unguardedEnvMethods)
}

// TestEnvAccess runs every authorized method as each kind of person against
// an environment of department A.
func TestEnvAccess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newAccessWorld(t, d)
		people := []struct {
			name  string
			roles []string
			// see: may see A's environments; manage: may change them;
			// creates: may add shared environments somewhere.
			see, manage, creates bool
		}{
			{"org admin", []string{rbac.RoleOrgAdmin + "@" + rbac.DomainOrg}, true, true, true},
			{"owner of A", []string{rbac.RoleDeptOwner + "@A"}, true, true, true},
			{"member of A", []string{rbac.RoleMember + "@A"}, true, false, false},
			{"owner of B", []string{rbac.RoleDeptOwner + "@B"}, false, false, true},
			{"auditor", []string{rbac.RoleAuditor + "@" + rbac.DomainOrg}, true, false, false},
			{"nobody", nil, false, false, false},
		}
		for name, run := range envCases() {
			for _, p := range people {
				t.Run(name+"/"+p.name, func(t *testing.T) {
					a := w.person(t, p.roles...)
					err := run(t, w, a)
					if answers[name] {
						want := p.see && (!manages[name] || p.manage)
						switch name {
						case "Usable":
							want = p.see
						case "CanCreateShared":
							want = p.creates
						}
						if got := err == nil; got != want {
							t.Errorf("%s = %v (err %v), want %v", name, got, err, want)
						}
						return
					}
					want := authztest.Allowed
					switch {
					case !p.see && name != "Create":
						want = authztest.Hidden
					case manages[name] && !p.manage:
						want = authztest.Forbidden
					}
					authztest.Want(t, a, err, want)
				})
			}
		}
	})
}

// TestPrivateEnvironments: a private host is its owner's; org admins see
// it; nobody else does, until it is shared with a department its owner
// belongs to.
func TestPrivateEnvironments(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		w := newAccessWorld(t, d)
		alice := w.person(t, rbac.RoleMember+"@A")
		bob := w.person(t, rbac.RoleMember+"@A")
		admin := w.person(t, rbac.RoleOrgAdmin+"@"+rbac.DomainOrg)
		in := hostInput("alice-laptop", "http://10.1.2.3:49984", token("p"))
		in.Private = true
		mine, err := w.envs.Create(ctx, alice, in)
		if err != nil {
			t.Fatal(err)
		}
		t.Run("owner manages it", func(t *testing.T) {
			_, err := w.envs.Manageable(ctx, alice, mine.ID)
			authztest.Want(t, alice, err, authztest.Allowed)
		})
		t.Run("a colleague does not see it", func(t *testing.T) {
			a := w.person(t, rbac.RoleMember+"@A")
			_, err := w.envs.Get(ctx, a, mine.ID)
			authztest.Want(t, a, err, authztest.Hidden)
		})
		t.Run("an org admin sees it", func(t *testing.T) {
			_, err := w.envs.Get(ctx, admin, mine.ID)
			authztest.Want(t, admin, err, authztest.Allowed)
		})
		t.Run("unshared, it cannot be attached to agents", func(t *testing.T) {
			if ok, err := w.envs.Usable(ctx, alice, mine); err != nil || ok {
				t.Errorf("Usable = %v, %v", ok, err)
			}
		})
		t.Run("shared with A, A's members see but cannot change it", func(t *testing.T) {
			if _, _, err := w.envs.Update(ctx, alice, mine.ID, envs.Input{DepartmentID: &w.deptA}); err != nil {
				t.Fatal(err)
			}
			_, err := w.envs.Get(ctx, bob, mine.ID)
			authztest.Want(t, bob, err, authztest.Allowed)
			_, _, err = w.envs.Update(ctx, bob, mine.ID, envs.Input{OS: ptr("macos")})
			authztest.Want(t, bob, err, authztest.Forbidden)
		})
		t.Run("sharing with a department one is not in is refused and recorded", func(t *testing.T) {
			a := w.person(t, rbac.RoleMember+"@A")
			in := hostInput("b-share", "http://10.1.2.4:49984", token("q"))
			in.Private, in.DepartmentID = true, &w.deptB
			_, err := w.envs.Create(ctx, a, in)
			wantField(t, err, "department_id", "only with a department you belong to")
			if len(a.Denials()) != 1 {
				t.Errorf("denials = %+v", a.Denials())
			}
		})
		t.Run("a service key cannot own one", func(t *testing.T) {
			key := authz.New(authz.Principal{Kind: "api_key", Subject: rbac.KeySubject(7), KeyID: 7}, w.en, nil)
			_, err := w.envs.Create(ctx, key, in)
			authztest.Want(t, key, err, authztest.Forbidden)
		})
		t.Run("a private host cannot point at loopback", func(t *testing.T) {
			in := hostInput("sneaky", "http://localhost:49984", token("r"))
			in.Private = true
			_, err := w.envs.Create(ctx, alice, in)
			wantField(t, err, "url", "loopback")
		})
	})
}
