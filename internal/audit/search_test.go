package audit_test

import (
	"context"
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestSearchLeavesOutReadsAndCountsWhatItLists is issue 26's items 13 and
// 14 at the log: a review search omits reads of the log when asked to,
// and its count and list are read against one head, so an event appended
// after the search began (its own audit.view) is in neither.
func TestSearchLeavesOutReadsAndCountsWhatItLists(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		l, _ := newLog(t, d)
		viewer := audit.Actor{Type: audit.ActorUser, ID: "u9", Name: "audrey@acme.test"}
		mustAppend(t, l, audit.Event{Actor: viewer, Action: "agent.create", Target: audit.Target{Type: "agent", ID: "1", Name: "triage"}, Decision: audit.Allow})
		for _, a := range audit.LogReads {
			mustAppend(t, l, audit.Event{Actor: viewer, Action: a, Target: audit.Target{Type: "audit_log"}, Decision: audit.Allow})
		}
		mustAppend(t, l, audit.Event{Actor: viewer, Action: "audit.checkpoint", Target: audit.Target{Type: "org"}, Decision: audit.Allow})

		for _, tc := range []struct {
			name    string
			f       audit.Filter
			actions []string
		}{
			{"reads omitted", audit.Filter{OmitReads: true}, []string{"audit.checkpoint", "agent.create"}},
			{"everything", audit.Filter{}, []string{"audit.checkpoint", "audit.checkpoint_export", "audit.verify", "audit.export", "audit.view", "agent.create"}},
			{"asked for by action", audit.Filter{Action: "audit.v"}, []string{"audit.verify", "audit.view"}},
			{"free text with reads omitted", audit.Filter{OmitReads: true, Text: []string{"audrey"}}, []string{"audit.checkpoint", "agent.create"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				evs, n, more, err := l.Search(ctx, tc.f, 0, 50, 100)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, e := range evs {
					got = append(got, e.Action)
				}
				if !equalStrings(got, tc.actions) || n != len(tc.actions) || more {
					t.Fatalf("Search(%+v) = %q, count %d (more %v); want %q and a count of %d", tc.f, got, n, more, tc.actions, len(tc.actions))
				}
			})
		}

		t.Run("count and list share one head", func(t *testing.T) {
			// A search bounded at the head before a matching append neither
			// lists nor counts it.
			head, _, err := l.Head(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mustAppend(t, l, audit.Event{Actor: viewer, Action: "agent.create", Target: audit.Target{Type: "agent", ID: "2", Name: "later"}, Decision: audit.Allow})
			f := audit.Filter{Action: "agent.", UpTo: head.Seq}
			evs, n, _, err := l.Search(ctx, f, 0, 50, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 1 || n != 1 || evs[0].Target.Name != "triage" {
				t.Fatalf("bounded search = %d events, count %d; want only the first agent.create, counted once", len(evs), n)
			}
			evs, n, _, err = l.Search(ctx, audit.Filter{Action: "agent."}, 0, 50, 100)
			if err != nil || len(evs) != 2 || n != 2 {
				t.Fatalf("unbounded search = %d events, count %d, %v; want 2 and 2", len(evs), n, err)
			}
		})
	})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
