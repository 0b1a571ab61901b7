package rbac_test

import (
	"context"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// openDB opens a handle of its own on dsn, closed when t ends.
func openDB(t *testing.T, dsn string) *gorm.DB {
	t.Helper()
	db, err := store.Open(context.Background(), dsn, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	return db
}

// replicas makes a fresh org database on d and n enforcers on it, each
// standing for one replica's view of the org's policies.
func replicas(t *testing.T, d store.Dialect, n int) []*rbac.Enforcer {
	t.Helper()
	ctx := context.Background()
	db := openDB(t, storetest.DSN(t, d))
	if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
		t.Fatal(err)
	}
	out := make([]*rbac.Enforcer, n)
	for i := range out {
		en, err := rbac.NewEnforcer(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = en
	}
	return out
}
