package rbac_test

import (
	"context"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func TestEnforcer(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		en, err := rbac.NewEnforcer(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		admin, owner, member, auditor, outsider := rbac.UserSubject(1), rbac.UserSubject(2), rbac.UserSubject(3), rbac.UserSubject(4), rbac.UserSubject(5)
		d1, d2 := rbac.DeptDomain(1), rbac.DeptDomain(2)
		for _, a := range []rbac.Assignment{
			{Subject: admin, Role: rbac.RoleOrgAdmin, Domain: rbac.DomainOrg},
			{Subject: owner, Role: rbac.RoleDeptOwner, Domain: d1},
			{Subject: member, Role: rbac.RoleMember, Domain: d1},
			{Subject: auditor, Role: rbac.RoleAuditor, Domain: rbac.DomainOrg},
		} {
			if _, err := en.Assign(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		cases := []struct {
			sub, dom, obj, act string
			want               bool
		}{
			{admin, rbac.DomainOrg, "users", "create", true},
			{admin, d2, "agents/9", "delete", true},
			{rbac.PlatformSubject, rbac.DomainOrg, "audit", "read", true},
			{owner, d1, "agents/9", "update", true},
			{owner, d1, "members", "update", true},
			{owner, d2, "agents/9", "update", false},
			{owner, rbac.DomainOrg, "users", "create", false},
			{member, d1, "agents/9", "read", true},
			{member, d1, "agents/9", "update", false},
			{member, d1, "members", "update", false},
			{auditor, rbac.DomainOrg, "audit", "read", true},
			{auditor, rbac.DomainOrg, "audit", "export", true},
			{auditor, rbac.DomainOrg, "users", "read", false},
			{auditor, d1, "agents/9", "read", true},
			{auditor, d1, "agents/9", "use", false},
			{auditor, rbac.DomainOrg, "environments/3", "read", true},
			{auditor, d1, "environments/3", "update", false},
			{outsider, d1, "agents/9", "read", false},
			{outsider, rbac.DomainOrg, "audit", "read", false},
		}
		for _, tc := range cases {
			got, err := en.Allowed(ctx, tc.sub, tc.dom, tc.obj, tc.act)
			if err != nil || got != tc.want {
				t.Errorf("Allowed(%s, %s, %s, %s) = %v (%v), want %v", tc.sub, tc.dom, tc.obj, tc.act, got, err, tc.want)
			}
		}

		// A deny rule overrides the owner's allow.
		deny := rbac.Rule{Subject: owner, Domain: d1, Object: "agents/9", Action: "update", Effect: "deny"}
		if _, err := en.AddRule(ctx, deny); err != nil {
			t.Fatal(err)
		}
		if ok, _ := en.Allowed(ctx, owner, d1, "agents/9", "update"); ok {
			t.Error("deny rule did not override the role's allow")
		}
		if ok, _ := en.Allowed(ctx, owner, d1, "agents/8", "update"); !ok {
			t.Error("deny rule for agents/9 also denied agents/8")
		}

		// A second replica's enforcer sees changes on its next check.
		other, err := rbac.NewEnforcer(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		other.CheckEvery = 0
		if ok, _ := other.Allowed(ctx, outsider, d2, "agents/1", "read"); ok {
			t.Fatal("outsider allowed before assignment")
		}
		if _, err := en.Assign(ctx, rbac.Assignment{Subject: outsider, Role: rbac.RoleMember, Domain: d2}); err != nil {
			t.Fatal(err)
		}
		if ok, _ := other.Allowed(ctx, outsider, d2, "agents/1", "read"); !ok {
			t.Fatal("other replica did not pick up the new assignment")
		}
		if got, err := en.DomainsOf(outsider); err != nil || len(got) != 1 || got[0] != d2 {
			t.Fatalf("DomainsOf = %v", got)
		}
		if err := en.RemoveSubject(ctx, outsider); err != nil {
			t.Fatal(err)
		}
		if ok, _ := other.Allowed(ctx, outsider, d2, "agents/1", "read"); ok {
			t.Fatal("removed subject still allowed on the other replica")
		}
	})
}

func TestValidAssignment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a  rbac.Assignment
		ok bool
	}{
		{rbac.Assignment{Role: rbac.RoleOrgAdmin, Domain: "org"}, true},
		{rbac.Assignment{Role: rbac.RoleOrgAdmin, Domain: "dept:1"}, false},
		{rbac.Assignment{Role: rbac.RoleMember, Domain: "dept:1"}, true},
		{rbac.Assignment{Role: rbac.RoleMember, Domain: "org"}, false},
		{rbac.Assignment{Role: "root", Domain: "org"}, false},
	} {
		if got := rbac.ValidAssignment(tc.a) == ""; got != tc.ok {
			t.Errorf("ValidAssignment(%+v) ok = %v, want %v", tc.a, got, tc.ok)
		}
	}
}
