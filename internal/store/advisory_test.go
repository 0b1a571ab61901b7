package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestLockWaitLeavesNoTimeout: waiting for an advisory lock sets
// lock_timeout on its connection; the connection goes back to the pool
// without it, whether the lock was taken or not.
func TestLockWaitLeavesNoTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := storetest.Open(t, store.Postgres, store.CatalogSet)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	holder, err := sqlDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	const key = 424242
	for _, tc := range []struct {
		name string
		held bool
	}{{"taken", false}, {"stayed taken by another", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.held {
				if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
					t.Fatal(err)
				}
				defer holder.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key) //nolint:errcheck
			}
			conn, err := sqlDB.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			got, err := store.LockOnConn(ctx, conn, key, 50*time.Millisecond)
			if err != nil || got == tc.held {
				t.Fatalf("LockOnConn = %v, %v; want %v", got, err, !tc.held)
			}
			if got {
				defer conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key) //nolint:errcheck
			}
			var timeout string
			if err := conn.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&timeout); err != nil {
				t.Fatal(err)
			}
			if timeout != "0" {
				t.Errorf("lock_timeout after the wait = %q, want 0 (the server default)", timeout)
			}
		})
	}
}
