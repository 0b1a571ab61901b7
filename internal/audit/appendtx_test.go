package audit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestAppendTxCommitsWithTheChange: an event appended in a transaction that
// rolls back is gone, with no gap in the chain; Append and AppendTx running
// together neither deadlock nor fork the chain.
func TestAppendTxCommitsWithTheChange(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		ev := func(action string) audit.Event {
			return audit.Event{Actor: audit.Actor{Type: audit.ActorSystem, Name: "test"}, Action: action}
		}
		errBoom := errors.New("the change failed")
		err := db.Transaction(func(tx *gorm.DB) error {
			if _, err := log.AppendTx(ctx, tx, ev("rolled.back")); err != nil {
				return err
			}
			return errBoom
		})
		if !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := 0; i < 40; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				if i%2 == 0 {
					_, err := log.Append(ctx, ev(fmt.Sprintf("plain.%d", i)))
					errs <- err
					return
				}
				errs <- db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Exec("INSERT INTO org_settings (key, value) VALUES (?, 'x')", fmt.Sprintf("k%d", i)).Error; err != nil {
						return err
					}
					_, err := log.AppendTx(ctx, tx, ev(fmt.Sprintf("tx.%d", i)))
					return err
				})
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		res, err := log.Verify(ctx)
		if err != nil || !res.OK || res.Checked != 40 {
			t.Fatalf("verify = %+v, %v; want 40 events, intact", res, err)
		}
		evs, err := log.Query(ctx, mustFilter(t, "action:rolled."), 0, 10)
		if err != nil || len(evs) != 0 {
			t.Fatalf("a rolled-back event is in the log: %v %v", evs, err)
		}
	})
}

func mustFilter(t *testing.T, q string) audit.Filter {
	t.Helper()
	f, err := audit.ParseQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
