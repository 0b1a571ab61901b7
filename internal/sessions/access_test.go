package sessions_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/authz/authztest"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// accessWorld is a world with a policy and a session owner in the
// department.
type accessWorld struct {
	*world
	en    *rbac.Enforcer
	other int64
	owner *authz.Actor
	svc   *sessions.Service
}

// newSessionOf creates a session owned by the world's owner (a member of
// the department).
func (w *accessWorld) newSessionOf(t *testing.T) sessions.Session {
	t.Helper()
	return w.newSession(t, w.svc, w.owner)
}

type accessCase func(t *testing.T, w *accessWorld, a *authz.Actor) error

// sessionCases has an entry for every method of sessions.Service that
// takes an actor; TestEverySessionMethodIsAuthorized fails when one is
// missing. Each acts on a fresh session of the department's agent owned
// by someone else than a (unless a is that someone).
func sessionCases() map[string]accessCase {
	ctx := context.Background()
	return map[string]accessCase{
		"Get": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.Get(ctx, a, w.newSessionOf(t).ID)
			return err
		},
		"Create": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.Create(ctx, a, sessions.CreateInput{AgentID: w.agent.ID})
			return err
		},
		"Start": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.Start(ctx, a, w.newSessionOf(t).ID)
			return err
		},
		"Prepare": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.Prepare(ctx, a, w.newSessionOf(t).ID)
			return err
		},
		"Preparation": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.Preparation(ctx, a, w.newSessionOf(t).ID)
			return err
		},
		"Ensure": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.Ensure(ctx, a, w.newSessionOf(t).ID)
			return err
		},
		"EnsureFor": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.EnsureFor(ctx, a, w.newSessionOf(t).ID, func(sessions.Target) error { return nil })
			return err
		},
		"Locate": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			s := w.newSessionOf(t)
			if _, err := w.svc.Start(ctx, sys(), s.ID); err != nil {
				t.Fatal(err)
			}
			_, err := w.svc.Locate(ctx, a, s.ID)
			return err
		},
		"LocateForClose": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			s := w.newSessionOf(t)
			if _, err := w.svc.Start(ctx, sys(), s.ID); err != nil {
				t.Fatal(err)
			}
			_, err := w.svc.LocateForClose(ctx, a, s.ID)
			return err
		},
		"Pause": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			s := w.newSessionOf(t)
			if _, err := w.svc.Start(ctx, sys(), s.ID); err != nil {
				t.Fatal(err)
			}
			_, err := w.svc.Pause(ctx, a, s.ID)
			return err
		},
		"Resume": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			s := w.newSessionOf(t)
			if _, err := w.svc.Start(ctx, sys(), s.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := w.svc.Pause(ctx, sys(), s.ID); err != nil {
				t.Fatal(err)
			}
			_, err := w.svc.Resume(ctx, a, s.ID)
			return err
		},
		"Close": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.Close(ctx, a, w.newSessionOf(t).ID)
			return err
		},
		"CloseLeaving": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			_, err := w.svc.CloseLeaving(ctx, a, w.newSessionOf(t).ID, []sessions.LeftRunning{{CommandID: 1, Reason: "refused"}})
			return err
		},
		"Timings": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			idle, reclaim, err := w.svc.Timings(ctx, a, w.newSessionOf(t))
			if err == nil && (idle != 5*time.Minute || reclaim != 60*time.Minute) {
				t.Errorf("Timings = %s, %s; want the agent's 5m0s, 1h0m0s", idle, reclaim)
			}
			return err
		},
		// The rest answer questions rather than refuse.
		"List": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			s := w.newSessionOf(t)
			p, err := w.svc.List(ctx, a, sessions.ListFilter{AgentID: w.agent.ID, Limit: 200})
			ok := false
			for _, x := range p.Items {
				ok = ok || x.ID == s.ID
			}
			return refuseUnless(err, ok, "List")
		},
		"CanUse": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			ok, err := w.svc.CanUse(ctx, a, w.newSessionOf(t))
			return refuseUnless(err, ok, "CanUse")
		},
		"CanCreate": func(t *testing.T, w *accessWorld, a *authz.Actor) error {
			ok, err := w.svc.CanCreate(ctx, a, w.agent)
			return refuseUnless(err, ok, "CanCreate")
		},
	}
}

var answers = map[string]bool{"List": true, "CanUse": true, "CanCreate": true}

// uses lists the methods that act on a session (rather than read it).
var uses = map[string]bool{"Start": true, "Prepare": true, "Ensure": true, "EnsureFor": true, "Pause": true, "Resume": true, "Close": true, "CloseLeaving": true, "LocateForClose": true,
	"CanUse": true}

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

// unguardedSessionMethods take no actor, and why that is safe.
var unguardedSessionMethods = map[string]string{
	"ReportUnreachable": "the gateway reports agentd failures of a session it already resolved through Ensure",
	"ReportReachable":   "the gateway reports agentd answered for a session it already resolved through Ensure",
	"Reclaim":           "the reclaim round, run by the system reclaimer per org",
}

func TestEverySessionMethodIsAuthorized(t *testing.T) {
	tested := map[string]bool{}
	for name := range sessionCases() {
		tested[name] = true
	}
	authztest.Accounted(t, &sessions.Service{}, tested, unguardedSessionMethods)
}

// TestSessionAccess runs every authorized method as each kind of person
// against a session of another member of the agent's department.
func TestSessionAccess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		base := newWorld(t, d, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
		en, err := rbac.NewEnforcer(context.Background(), base.db)
		if err != nil {
			t.Fatal(err)
		}
		w := &accessWorld{world: base, en: en, other: newDepartment(t, base.db, "other"), svc: base.svc(nil)}
		w.owner = w.person(t, en, w.other, rbac.RoleMember+"@D")
		people := []struct {
			name  string
			roles []string
			// see: may see others' sessions of the agent; use: may act
			// on them; create: may start sessions of the agent.
			see, use, create bool
		}{
			{"org admin", []string{rbac.RoleOrgAdmin + "@org"}, true, true, true},
			{"owner of the department", []string{rbac.RoleDeptOwner + "@D"}, true, true, true},
			{"another member", []string{rbac.RoleMember + "@D"}, false, false, true},
			{"auditor", []string{rbac.RoleAuditor + "@org"}, true, false, false},
			{"owner of another department", []string{rbac.RoleDeptOwner + "@O"}, false, false, false},
			{"nobody", nil, false, false, false},
		}
		for name, run := range sessionCases() {
			for _, p := range people {
				t.Run(name+"/"+p.name, func(t *testing.T) {
					a := w.person(t, en, w.other, p.roles...)
					err := run(t, w, a)
					if answers[name] {
						want := p.see && (!uses[name] || p.use)
						if name == "CanCreate" {
							want = p.create
						}
						if got := err == nil; got != want {
							t.Errorf("%s = %v (err %v), want %v", name, got, err, want)
						}
						return
					}
					want := authztest.Allowed
					switch {
					case name == "Create":
						switch {
						case p.create:
						case p.see && !p.use:
							// Auditors read the agent (as they read its
							// sessions) but may not start one.
							want = authztest.Forbidden
						default:
							// The agent is hidden from all who may
							// neither see nor use it here.
							want = authztest.Hidden
						}
					case !p.see:
						want = authztest.Hidden
					case uses[name] && !p.use:
						want = authztest.Forbidden
					}
					authztest.Want(t, a, err, want)
				})
			}
		}
		t.Run("the owner sees and uses their own session", func(t *testing.T) {
			s := w.newSessionOf(t)
			_, err := w.svc.Close(context.Background(), w.owner, s.ID)
			authztest.Want(t, w.owner, err, authztest.Allowed)
		})
		t.Run("an owner who left the department may read but not use", func(t *testing.T) {
			leaver := w.person(t, en, w.other, rbac.RoleMember+"@D")
			s := w.newSession(t, w.svc, leaver)
			if _, err := en.Unassign(context.Background(), rbac.Assignment{Subject: leaver.Subject, Role: rbac.RoleMember, Domain: rbac.DeptDomain(w.dept)}); err != nil {
				t.Fatal(err)
			}
			fresh := authz.New(leaver.Principal, en, nil)
			if _, err := w.svc.Get(context.Background(), fresh, s.ID); err != nil {
				t.Errorf("Get = %v", err)
			}
			_, err := w.svc.Ensure(context.Background(), fresh, s.ID)
			authztest.Want(t, fresh, err, authztest.Forbidden)
		})
		t.Run("cached uses are still authorized", func(t *testing.T) {
			s := w.newSessionOf(t)
			if _, err := w.svc.Ensure(context.Background(), w.owner, s.ID); err != nil {
				t.Fatal(err)
			}
			stranger := w.person(t, en, w.other, rbac.RoleMember+"@O")
			_, err := w.svc.Ensure(context.Background(), stranger, s.ID)
			authztest.Want(t, stranger, err, authztest.Hidden)
		})
		t.Run("a state filter outside the vocabulary is refused", func(t *testing.T) {
			_, err := w.svc.List(context.Background(), sys(), sessions.ListFilter{State: "reclaimed"})
			var v *apperr.ValidationError
			if !errors.Is(err, apperr.ErrInvalid) || !errors.As(err, &v) || v.Fields["state"] == "" {
				t.Errorf("err = %v, want a validation error on state", err)
			}
		})
	})
}
