package rbac_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestEnforcerOpenedDuringAChange: a role assigned on one replica while
// another replica is loading the org's policies for the first time (after
// it read the rules, before it noted the policy version) reaches that
// replica at its next check, as every change does. Found by the chaos run
// (internal/bench TestChaos): such a replica refused the member's own
// session ("You may see session 1 but not use it") until the next change.
func TestEnforcerOpenedDuringAChange(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dsn := storetest.DSN(t, d)
		db, otherDB := openDB(t, dsn), openDB(t, dsn)
		if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
			t.Fatal(err)
		}
		first, err := rbac.NewEnforcer(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		member := rbac.UserSubject(7)
		dept := rbac.DeptDomain(1)

		// The other replica's first load of the rules: right after it read
		// them, the first replica assigns the role.
		var armed atomic.Bool
		armed.Store(true)
		if err := otherDB.Callback().Query().After("gorm:query").Register("test:assign_during_load", func(tx *gorm.DB) {
			if strings.Contains(tx.Statement.Table, "casbin") && armed.CompareAndSwap(true, false) {
				if _, err := first.Assign(ctx, rbac.Assignment{Subject: member, Role: rbac.RoleMember, Domain: dept}); err != nil {
					t.Error(err)
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		late, err := rbac.NewEnforcer(ctx, otherDB)
		if err != nil {
			t.Fatal(err)
		}
		if armed.Load() {
			t.Fatal("the assignment was not made during the load")
		}
		late.SetCheckEvery(0)
		if ok, err := late.Allowed(ctx, member, dept, "agents/1", "use"); err != nil || !ok {
			t.Errorf("the replica that loaded during the assignment refuses it: allowed %v (%v)", ok, err)
		}
	})
}
