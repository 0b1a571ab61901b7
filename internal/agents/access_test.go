package agents_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/authz/authztest"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// agentCase runs one method as a against a fresh agent of department A.
type agentCase func(t *testing.T, w *world, a *authz.Actor) error

func agentCases() map[string]agentCase {
	ctx := context.Background()
	return map[string]agentCase{
		"Get": func(t *testing.T, w *world, a *authz.Actor) error {
			_, err := w.svc.Get(ctx, a, w.agentInA(t).ID)
			return err
		},
		"Template": func(t *testing.T, w *world, a *authz.Actor) error {
			_, _, err := w.svc.Template(ctx, a, w.agentInA(t).ID)
			return err
		},
		"Manageable": func(t *testing.T, w *world, a *authz.Actor) error {
			_, err := w.svc.Manageable(ctx, a, w.agentInA(t).ID)
			return err
		},
		"Update": func(t *testing.T, w *world, a *authz.Actor) error {
			_, _, err := w.svc.Update(ctx, a, w.agentInA(t).ID, agents.Input{Description: ptr("changed")})
			return err
		},
		"Delete": func(t *testing.T, w *world, a *authz.Actor) error {
			_, err := w.svc.Delete(ctx, a, w.agentInA(t).ID)
			return err
		},
		"Create": func(t *testing.T, w *world, a *authz.Actor) error {
			in := w.inputInA()
			_, err := w.svc.Create(ctx, a, in)
			return err
		},
		"Uploads": func(t *testing.T, w *world, a *authz.Actor) error {
			_, err := w.svc.Uploads(ctx, a, w.agentWithUpload(t).ID)
			return err
		},
		"UploadContent": func(t *testing.T, w *world, a *authz.Actor) error {
			_, err := w.svc.UploadContent(ctx, a, w.agentWithUpload(t).ID, agents.UploadFile, "notes.md")
			return err
		},
		"PutUpload": func(t *testing.T, w *world, a *authz.Actor) error {
			_, _, err := w.svc.PutUpload(ctx, a, w.agentInA(t).ID, agents.UploadInput{Kind: agents.UploadFile, Name: "notes.md", Body: []byte("hi")})
			return err
		},
		"RemoveUpload": func(t *testing.T, w *world, a *authz.Actor) error {
			_, err := w.svc.RemoveUpload(ctx, a, w.agentWithUpload(t).ID, agents.UploadFile, "notes.md")
			return err
		},
		"List": func(t *testing.T, w *world, a *authz.Actor) error {
			ag := w.agentInA(t)
			list, err := w.svc.List(ctx, a)
			for _, x := range list {
				if x.ID == ag.ID {
					return err
				}
			}
			return refusal(err)
		},
		"CanManage": func(t *testing.T, w *world, a *authz.Actor) error {
			ok, err := w.svc.CanManage(ctx, a, w.agentInA(t))
			if ok {
				return err
			}
			return refusal(err)
		},
		"CanCreate": func(t *testing.T, w *world, a *authz.Actor) error {
			ok, err := w.svc.CanCreate(ctx, a)
			if ok {
				return err
			}
			return refusal(err)
		},
	}
}

type errNo struct{}

func (errNo) Error() string { return "answered no" }

func refusal(err error) error {
	if err != nil {
		return err
	}
	return errNo{}
}

// inputInA is a valid agent of department A on its host.
func (w *world) inputInA() agents.Input {
	w.n++
	return agents.Input{Name: ptr(fmt.Sprintf("agent-a-%d", w.n)), DepartmentID: &w.deptA, Config: ptr(`{"model":"m"}`),
		EnvironmentIDs: []int64{w.hostA.ID}}
}

func (w *world) agentInA(t *testing.T) agents.Agent {
	t.Helper()
	a, err := w.svc.Create(context.Background(), w.admin, w.inputInA())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// agentWithUpload is an agent of department A with one uploaded file.
func (w *world) agentWithUpload(t *testing.T) agents.Agent {
	t.Helper()
	a := w.agentInA(t)
	if _, _, err := w.svc.PutUpload(context.Background(), w.admin, a.ID, agents.UploadInput{Kind: agents.UploadFile, Name: "notes.md", Body: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestEveryAgentMethodIsAuthorized(t *testing.T) {
	tested := map[string]bool{}
	for name := range agentCases() {
		tested[name] = true
	}
	authztest.Accounted(t, &agents.Service{}, tested, nil)
}

func TestAgentAccess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d)
		people := []struct {
			name                 string
			roles                []string
			see, manage, creates bool
		}{
			{"org admin", []string{rbac.RoleOrgAdmin + "@" + rbac.DomainOrg}, true, true, true},
			{"owner of A", []string{rbac.RoleDeptOwner + "@" + rbac.DeptDomain(w.deptA)}, true, true, true},
			{"member of A", []string{rbac.RoleMember + "@" + rbac.DeptDomain(w.deptA)}, true, false, false},
			{"owner of B", []string{rbac.RoleDeptOwner + "@" + rbac.DeptDomain(w.deptB)}, false, false, true},
			{"auditor", []string{rbac.RoleAuditor + "@" + rbac.DomainOrg}, true, false, false},
		}
		answers := map[string]bool{"List": true, "CanManage": true, "CanCreate": true}
		for name, run := range agentCases() {
			for _, p := range people {
				t.Run(name+"/"+p.name, func(t *testing.T) {
					u, _, err := (&directory.Directory{DB: w.db}).CreateUser(context.Background(), fmt.Sprintf("%s-%s@example.com", name, strings.ReplaceAll(p.name, " ", "-")), "P")
					if err != nil {
						t.Fatal(err)
					}
					a := w.actor(t, u.ID, p.roles...)
					err = run(t, w, a)
					if answers[name] {
						want := map[string]bool{"List": p.see, "CanManage": p.manage, "CanCreate": p.creates}[name]
						if got := err == nil; got != want {
							t.Errorf("%s = %v (%v), want %v", name, got, err, want)
						}
						return
					}
					want := authztest.Allowed
					switch {
					case name == "Create" && !p.manage:
						want = authztest.Forbidden
					case name == "Create":
					case !p.see:
						want = authztest.Hidden
					case name != "Get" && name != "Template" && name != "Uploads" && !p.manage:
						want = authztest.Forbidden
					}
					authztest.Want(t, a, err, want)
				})
			}
		}
	})
}
