package rbac_test

import (
	"context"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestCachedDecisionsFollowEveryChange: decisions are cached, and every
// change of the policies is seen by the very next check, on the replica
// that made it at once and on another at its next version check.
func TestCachedDecisionsFollowEveryChange(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		rs := replicas(t, d, 2)
		here, there := rs[0], rs[1]
		// The other replica reads the stored version on every check, so
		// a change made here shows there at its next one.
		there.SetCheckEvery(0)
		member, dept := rbac.UserSubject(7), rbac.DeptDomain(1)
		obj := "agents/3"
		want := func(en *rbac.Enforcer, where string, allowed bool) {
			t.Helper()
			for range 2 { // the second answer comes from the cache
				ok, err := en.Allowed(ctx, member, dept, obj, "use")
				if err != nil {
					t.Fatal(err)
				}
				if ok != allowed {
					t.Fatalf("%s: allowed = %v, want %v", where, ok, allowed)
				}
			}
		}
		want(here, "before any role", false)
		want(there, "before any role (other replica)", false)

		steps := []struct {
			name    string
			change  func() error
			allowed bool
		}{
			{"role assigned", func() error {
				_, err := here.Assign(ctx, rbac.Assignment{Subject: member, Role: rbac.RoleMember, Domain: dept})
				return err
			}, true},
			{"deny rule added", func() error {
				_, err := here.AddRule(ctx, rbac.Rule{Subject: member, Domain: dept, Object: obj, Action: "use", Effect: "deny"})
				return err
			}, false},
			{"deny rule removed", func() error {
				_, err := here.RemoveRule(ctx, rbac.Rule{Subject: member, Domain: dept, Object: obj, Action: "use", Effect: "deny"})
				return err
			}, true},
			{"role removed", func() error {
				_, err := here.Unassign(ctx, rbac.Assignment{Subject: member, Role: rbac.RoleMember, Domain: dept})
				return err
			}, false},
			{"roles set", func() error { return here.SetRoles(ctx, member, dept, []string{rbac.RoleMember}) }, true},
			{"subject removed", func() error { return here.RemoveSubject(ctx, member) }, false},
			{"role assigned again", func() error {
				_, err := here.Assign(ctx, rbac.Assignment{Subject: member, Role: rbac.RoleMember, Domain: dept})
				return err
			}, true},
			{"department removed", func() error { return here.RemoveDomain(ctx, dept) }, false},
		}
		for _, s := range steps {
			if err := s.change(); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			want(here, s.name, s.allowed)
			want(there, s.name+" (other replica)", s.allowed)
		}
	})
}
