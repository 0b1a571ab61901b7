package rbac_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestBuiltinSubjectsAreNotRuleTargets is finding 8 of the attack run: an
// org admin cannot lock platform admins out with a deny on their subject
// or on a role they hold, nor redefine a role with a rule.
func TestBuiltinSubjectsAreNotRuleTargets(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		en, err := rbac.NewEnforcer(ctx, storetest.Open(t, d, store.OrgSet))
		if err != nil {
			t.Fatal(err)
		}
		for _, sub := range []string{rbac.PlatformSubject, rbac.RoleOrgAdmin, rbac.RoleDeptOwner, rbac.RoleMember, rbac.RoleAuditor} {
			r := rbac.Rule{Subject: sub, Domain: "*", Object: "*", Action: "*", Effect: "deny"}
			if _, err := en.AddRule(ctx, r); !errors.Is(err, rbac.ErrBuiltin) {
				t.Errorf("deny rule on %s: %v, want ErrBuiltin", sub, err)
			}
			if _, err := en.Assign(ctx, rbac.Assignment{Subject: sub, Role: rbac.RoleAuditor, Domain: rbac.DomainOrg}); !errors.Is(err, rbac.ErrBuiltin) {
				t.Errorf("role for %s: %v, want ErrBuiltin", sub, err)
			}
		}
		if ok, err := en.Allowed(ctx, rbac.PlatformSubject, rbac.DomainOrg, "users", "create"); err != nil || !ok {
			t.Fatalf("platform admins after the attempts: %v, %v", ok, err)
		}
		// Rules on users still work.
		if _, err := en.AddRule(ctx, rbac.Rule{Subject: rbac.UserSubject(7), Domain: rbac.DomainOrg, Object: "users", Action: "read", Effect: "deny"}); err != nil {
			t.Fatal(err)
		}
	})
}
