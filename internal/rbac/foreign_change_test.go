package rbac_test

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestLocalChangeAfterAForeignOne: replica B adds a deny; within replica
// A's CheckEvery, A makes an unrelated change of its own. A must not take
// the version its bump returned (B's + 1) for what it loaded: it loads
// B's deny too (found in review: A allowed what B denied until some third
// change).
func TestLocalChangeAfterAForeignOne(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) { localChangeAfterAForeignOne(t, d) })
}

func localChangeAfterAForeignOne(t *testing.T, d store.Dialect) {
	ctx := context.Background()
	rs := replicas(t, d, 2)
	a, b := rs[0], rs[1]
	a.SetCheckEvery(time.Hour)
	member, dept, obj := rbac.UserSubject(7), rbac.DeptDomain(1), "agents/3"
	if _, err := a.Assign(ctx, rbac.Assignment{Subject: member, Role: rbac.RoleMember, Domain: dept}); err != nil {
		t.Fatal(err)
	}
	b.SetCheckEvery(0)
	if ok, _ := b.Allowed(ctx, member, dept, obj, "use"); !ok {
		t.Fatal("b: member not allowed")
	}
	if _, err := b.AddRule(ctx, rbac.Rule{Subject: member, Domain: dept, Object: obj, Action: "use", Effect: "deny"}); err != nil {
		t.Fatal(err)
	}
	// An unrelated change on A.
	if _, err := a.Assign(ctx, rbac.Assignment{Subject: rbac.UserSubject(8), Role: rbac.RoleMember, Domain: dept}); err != nil {
		t.Fatal(err)
	}
	a.SetCheckEvery(0) // even checking on every decision
	if ok, _ := a.Allowed(ctx, member, dept, obj, "use"); ok {
		t.Fatal("replica A still allows what replica B denied: its own change marked B's as loaded")
	}
}
