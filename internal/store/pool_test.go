package store_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestPoolKeepsItsConnections proves a pool opened with the defaults (an
// org's) keeps the connections a burst opened instead of closing all but
// two: the next burst neither reconnects nor re-prepares its statements.
func TestPoolKeepsItsConnections(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db, err := store.Open(ctx, storetest.DSN(t, d), store.Options{MaxOpenConns: 6})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close(db) })
		sqlDB, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		// A burst of six requests holds six connections at once.
		var conns []*sql.Conn
		for range 6 {
			c, err := sqlDB.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
		st := sqlDB.Stats()
		if st.MaxIdleClosed != 0 || st.Idle != 6 {
			t.Fatalf("after the burst: %d idle of %d open, %d closed as over the idle limit; want all 6 kept", st.Idle, st.OpenConnections, st.MaxIdleClosed)
		}
	})
}
