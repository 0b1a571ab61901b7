package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
)

func TestWritesTellsReadsFromWrites(t *testing.T) {
	for q, want := range map[string]bool{
		"SELECT * FROM commands":             false,
		"  select 1":                         false,
		"(SELECT 1) UNION (SELECT 2)":        false,
		"PRAGMA foreign_keys":                false,
		"EXPLAIN QUERY PLAN SELECT 1":        false,
		"INSERT INTO t VALUES (1)":           true,
		"UPDATE commands SET state = 'x'":    true,
		"DELETE FROM t":                      true,
		"WITH u AS (SELECT 1) DELETE FROM t": true,
		"SELECTED":                           false, // not a statement; counted as a read, harmless
		"":                                   true,
	} {
		if got := writes(q); got != want {
			t.Errorf("writes(%q) = %v, want %v", q, got, want)
		}
	}
}

// TestWritersQueue: a writer waits for the one before it and starts when
// it ends; a waiting writer whose context ends gives up with its error;
// one that waited the busy wait goes on (a transaction left open costs a
// wait, never a deadlock).
func TestWritersQueue(t *testing.T) {
	w := writers{turn: make(chan struct{}, 1), wait: 200 * time.Millisecond}
	ctx := context.Background()
	release, err := w.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var second func()
	go func() {
		var err error
		second, err = w.acquire(ctx)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("the second writer started while the first held its turn (err %v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := w.acquire(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled waiter: err = %v, want context.Canceled", err)
	}

	// The second writer still holds its turn: a third waits it out and
	// goes on.
	if _, err := w.acquire(ctx); err != nil {
		t.Fatalf("a writer past the busy wait: %v", err)
	}
	second()
}

// TestSQLiteWritersInOneProcess: many writers of one SQLite file, in
// transactions and single statements, all land (none meets "database is
// locked"), and the turn is given back however a transaction ends.
func TestSQLiteWritersInOneProcess(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "w.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Close(db) })
	if err := db.Exec("CREATE TABLE n (v INTEGER)").Error; err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				var err error
				switch i % 3 {
				case 0:
					err = db.WithContext(ctx).Exec("INSERT INTO n (v) VALUES (?)", g).Error
				case 1:
					err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
						return tx.Exec("INSERT INTO n (v) VALUES (?)", g).Error
					})
				default:
					// A rolled-back transaction gives its turn back too.
					err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
						if err := tx.Exec("INSERT INTO n (v) VALUES (?)", -1).Error; err != nil {
							return err
						}
						return errRollBack
					})
					if errors.Is(err, errRollBack) {
						err = db.WithContext(ctx).Exec("INSERT INTO n (v) VALUES (?)", g).Error
					}
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d, write %d: %w", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every writer gave its turn back.
	cp, ok := db.ConnPool.(countingPool)
	if !ok {
		t.Fatalf("SQLite pool is %T", db.ConnPool)
	}
	select {
	case cp.w.turn <- struct{}{}:
		cp.w.release()
	default:
		t.Fatal("a writer's turn was never given back")
	}
	var n, bad int64
	if err := db.Raw("SELECT COUNT(*) FROM n WHERE v >= 0").Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Raw("SELECT COUNT(*) FROM n WHERE v < 0").Scan(&bad).Error; err != nil {
		t.Fatal(err)
	}
	if n != 200 || bad != 0 {
		t.Fatalf("rows = %d (rolled back and kept %d), want 200 and 0", n, bad)
	}
}

var errRollBack = errors.New("roll back")
