package audit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestConcurrentAppends has 50 writers append at once, through one Log and
// through two Logs on separate pools of the same database (two replicas):
// the chain must come out complete, gap-free and verifiable.
func TestConcurrentAppends(t *testing.T) {
	t.Parallel()
	const writers, each = 50, 4
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		for _, replicas := range []int{1, 2} {
			t.Run(fmt.Sprintf("%d_logs", replicas), func(t *testing.T) {
				t.Parallel()
				dsn := storetest.DSN(t, d)
				ctx := context.Background()
				logs := make([]*audit.Log, replicas)
				for i := range logs {
					db, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 20})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = store.Close(db) })
					if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
						t.Fatal(err)
					}
					logs[i] = audit.NewLog(db, audit.OrgTable, nil)
				}
				var wg sync.WaitGroup
				errs := make(chan error, writers*each)
				got := make(chan int64, writers*each)
				for w := 0; w < writers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						l := logs[w%replicas]
						for i := 0; i < each; i++ {
							e, err := l.Append(ctx, audit.Event{
								Actor:  audit.Actor{Type: audit.ActorUser, ID: fmt.Sprint("u", w)},
								Action: "agent.exec", Details: audit.Details(map[string]int{"writer": w, "i": i}),
							})
							if err != nil {
								errs <- err
								return
							}
							got <- e.Seq
						}
					}()
				}
				wg.Wait()
				close(errs)
				close(got)
				for err := range errs {
					t.Fatalf("append: %v", err)
				}
				seen := map[int64]bool{}
				for s := range got {
					if seen[s] {
						t.Fatalf("seq %d handed out twice", s)
					}
					seen[s] = true
				}
				for s := int64(1); s <= writers*each; s++ {
					if !seen[s] {
						t.Fatalf("seq %d never handed out", s)
					}
				}
				res, err := logs[0].Verify(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !res.OK || res.Checked != writers*each {
					t.Fatalf("Verify after concurrent appends = %+v", res)
				}
				// Times never go backwards along the chain.
				evs, err := logs[replicas-1].Query(ctx, audit.Filter{}, 0, audit.MaxPageSize)
				if err != nil {
					t.Fatal(err)
				}
				for i := 1; i < len(evs); i++ {
					if evs[i].Time.After(evs[i-1].Time) {
						t.Fatalf("seq %d is later (%s) than seq %d (%s)", evs[i].Seq, evs[i].Time, evs[i-1].Seq, evs[i-1].Time)
					}
				}
			})
		}
	})
}
