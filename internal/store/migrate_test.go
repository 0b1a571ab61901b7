package store_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
)

// TestConcurrentMigrationsOfOneFile: two pools migrating the same new
// SQLite file at once (a second open racing a provisioning) apply each step
// once and both succeed.
func TestConcurrentMigrationsOfOneFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "org.db")
	ctx := context.Background()
	var dbs []*gorm.DB
	for range 4 {
		db, err := store.Open(ctx, path, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close(db) })
		dbs = append(dbs, db)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(dbs))
	for i, db := range dbs {
		wg.Go(func() { _, errs[i] = store.Migrate(ctx, db, store.OrgSet) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
	}
}
