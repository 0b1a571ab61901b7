package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"

	"gorm.io/gorm"

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

// TestPreparedKeepsStatements proves the hot paths' Prepared session on
// SQLite prepares a statement once and keeps it for the next use, in and
// out of transactions, and that a transaction through it still commits
// (and rolls back) as one.
func TestPreparedKeepsStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := store.Open(ctx, storetest.DSN(t, store.SQLite), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	if err := db.Exec("CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER NOT NULL)").Error; err != nil {
		t.Fatal(err)
	}
	const insert = "INSERT INTO kv (k, v) VALUES (?, ?)"
	for i, fail := range []bool{false, false, true} {
		err := store.Prepared(db.WithContext(ctx)).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec(insert, fmt.Sprint("k", i), i).Error; err != nil {
				return err
			}
			if fail {
				return errors.New("refused")
			}
			return nil
		})
		if (err != nil) != fail {
			t.Fatalf("transaction %d: %v", i, err)
		}
	}
	var n int64
	if err := store.Prepared(db.WithContext(ctx)).Raw("SELECT count(*) FROM kv").Scan(&n).Error; err != nil || n != 2 {
		t.Fatalf("%d rows (%v), want the 2 committed", n, err)
	}
	p, ok := store.Prepared(db).Statement.ConnPool.(*gorm.PreparedStmtDB)
	if !ok {
		t.Fatalf("Prepared's pool is %T, not gorm's statement cache", store.Prepared(db).Statement.ConnPool)
	}
	keys := p.Stmts.Keys()
	if !slices.Contains(keys, insert) || !slices.Contains(keys, "SELECT count(*) FROM kv") {
		t.Fatalf("statements kept: %q", keys)
	}
	// A context counting round trips sees every statement (the plain form).
	cctx, trips := store.CountTrips(ctx)
	if err := store.Prepared(db.WithContext(cctx)).Raw("SELECT count(*) FROM kv").Scan(&n).Error; err != nil || trips.N() != 1 {
		t.Fatalf("counted %d statements (%v), want 1", trips.N(), err)
	}
}
