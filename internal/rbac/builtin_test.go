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

// TestRemovalsTouchOnlyTheirRule: a removal with empty or partial fields,
// or of a rule that does not exist, deletes nothing from the database
// (the adapter reads empty fields as "any", so it used to delete every
// rule of the table while answering "not found").
func TestRemovalsTouchOnlyTheirRule(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		en, err := rbac.NewEnforcer(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		rule := rbac.Rule{Subject: rbac.UserSubject(7), Domain: rbac.DomainOrg, Object: "users", Action: "read", Effect: "deny"}
		if _, err := en.AddRule(ctx, rule); err != nil {
			t.Fatal(err)
		}
		if _, err := en.Assign(ctx, rbac.Assignment{Subject: rbac.UserSubject(7), Role: rbac.RoleMember, Domain: rbac.DeptDomain(1)}); err != nil {
			t.Fatal(err)
		}
		rows := func() int64 {
			var n int64
			if err := db.Table("casbin_rule").Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			return n
		}
		want := rows()
		for _, r := range []rbac.Rule{{}, {Subject: rbac.UserSubject(7)}, {Subject: rbac.UserSubject(7), Domain: rbac.DomainOrg, Object: "users", Action: "read", Effect: "allow"}} {
			if ok, err := en.RemoveRule(ctx, r); ok || err != nil {
				t.Errorf("RemoveRule(%+v) = %v, %v", r, ok, err)
			}
		}
		for _, a := range []rbac.Assignment{{}, {Subject: rbac.UserSubject(7)}, {Subject: rbac.UserSubject(7), Role: rbac.RoleMember, Domain: rbac.DeptDomain(2)}} {
			if ok, err := en.Unassign(ctx, a); ok || err != nil {
				t.Errorf("Unassign(%+v) = %v, %v", a, ok, err)
			}
		}
		if err := en.RemoveSubject(ctx, ""); err == nil {
			t.Error("RemoveSubject of an empty subject accepted")
		}
		if err := en.RemoveDomain(ctx, ""); err == nil {
			t.Error("RemoveDomain of an empty domain accepted")
		}
		if got := rows(); got != want {
			t.Fatalf("casbin_rule has %d rows after removals that matched nothing, want %d", got, want)
		}
		if ok, err := en.RemoveRule(ctx, rule); !ok || err != nil {
			t.Fatalf("removing the rule itself: %v, %v", ok, err)
		}
		if got := rows(); got != want-1 {
			t.Fatalf("casbin_rule has %d rows after removing one rule, want %d", got, want-1)
		}
	})
}

// TestApprovalsDecide: approvals:decide is held by org admins everywhere and
// by department owners in their department only; members and auditors do
// not hold it (auditors read), and it is grantable by a rule like any
// permission.
func TestApprovalsDecide(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		en, err := rbac.NewEnforcer(ctx, storetest.Open(t, d, store.OrgSet))
		if err != nil {
			t.Fatal(err)
		}
		assign := map[int64]rbac.Assignment{
			1: {Role: rbac.RoleOrgAdmin, Domain: rbac.DomainOrg},
			2: {Role: rbac.RoleDeptOwner, Domain: rbac.DeptDomain(1)},
			3: {Role: rbac.RoleMember, Domain: rbac.DeptDomain(1)},
			4: {Role: rbac.RoleAuditor, Domain: rbac.DomainOrg},
		}
		for id, a := range assign {
			a.Subject = rbac.UserSubject(id)
			if _, err := en.Assign(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := en.AddRule(ctx, rbac.Rule{Subject: rbac.UserSubject(5), Domain: rbac.DeptDomain(2), Object: "approvals", Action: "decide", Effect: "allow"}); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			user int64
			dom  string
			act  string
			want bool
		}{
			{1, rbac.DeptDomain(1), "decide", true},
			{1, rbac.DomainOrg, "decide", true},
			{2, rbac.DeptDomain(1), "decide", true},
			{2, rbac.DeptDomain(2), "decide", false},
			{2, rbac.DomainOrg, "decide", false},
			{3, rbac.DeptDomain(1), "decide", false},
			{4, rbac.DeptDomain(1), "decide", false},
			{4, rbac.DeptDomain(1), "read", true},
			{5, rbac.DeptDomain(2), "decide", true},
			{5, rbac.DeptDomain(1), "decide", false},
		}
		for _, tc := range cases {
			ok, err := en.Allowed(ctx, rbac.UserSubject(tc.user), tc.dom, "approvals", tc.act)
			if err != nil || ok != tc.want {
				t.Errorf("user %d %s approvals in %s = %v (%v), want %v", tc.user, tc.act, tc.dom, ok, err, tc.want)
			}
		}
	})
}
