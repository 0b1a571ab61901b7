package audit_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// matches is the reference meaning of a Filter, checked against the SQL.
func matches(f audit.Filter, e audit.Event) bool {
	if f.Actor != "" && e.Actor.ID != f.Actor && !strings.HasPrefix(strings.ToLower(e.Actor.Name), strings.ToLower(f.Actor)) {
		return false
	}
	if f.Target != "" && e.Target.ID != f.Target && e.Target.Name != f.Target {
		return false
	}
	if f.Action != "" && !strings.HasPrefix(e.Action, f.Action) {
		return false
	}
	if f.Decision != "" && e.Decision != f.Decision {
		return false
	}
	if !f.From.IsZero() && e.Time.Before(f.From) {
		return false
	}
	if !f.Until.IsZero() && !e.Time.Before(f.Until) {
		return false
	}
	hay := strings.ToLower(e.Action + " " + e.Actor.Name + " " + e.Target.Name + " " + string(e.Details))
	for _, term := range f.Text {
		if !strings.Contains(hay, strings.ToLower(term)) {
			return false
		}
	}
	return true
}

func TestQueryFilters(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		l, db := newLog(t, d)
		all := seedVaried(t, l, 90) // one event an hour from 2026-01-01T00:00Z
		queries := []struct {
			q       string
			atLeast int // guards against a reference that matches nothing
		}{
			{"", 90},
			{"actor:u1", 10},
			{`actor:"Jane Doe"`, 10},
			{"actor:Jane", 20},     // name prefix: Jane Doe and Janet
			{`actor:"jane d"`, 10}, // case-insensitive
			{"actor:JANET", 10},
			{"actor:CI-", 10},
			{"actor:U1", 0},  // ids match exactly
			{"actor:Doe", 0}, // a prefix, not a substring
			{"actor:J%", 0},  // LIKE wildcards match literally
			{"actor:_anet", 0},
			{"actor:scheduler", 10},
			{"action:agent.", 20},
			{"action:agent", 20},
			{"action:agent_", 10}, // underscore is literal, not "any character"
			{"action:user.login", 20},
			{"action:AGENT.", 0}, // prefix is case-sensitive
			{"target:ag-2", 20},
			{`target:"db 2"`, 20},
			{"target:prod", 20},
			{"decision:deny", 10},
			{"decision:allow", 70},
			{"from:2026-01-02", 60},
			{"to:2026-01-02", 40}, // whole of Jan 2 included
			{"from:2026-01-02 to:2026-01-02", 20},
			{"from:2026-01-02T05:00:00Z to:2026-01-02T07:00:00Z", 3}, // to: instant inclusive
			{"from:2030-01-01", 0},
			{"to:2025-12-31", 0},
			{"kubectl", 10},
			{"KUBECTL GET", 10},
			{`"rm -rf"`, 10},
			{"100%_done", 10},
			{"100%", 10},
			{"0%_", 10}, // LIKE wildcards match literally
			{"%_d", 10},
			{`x\y`, 0},
			{"JANET", 10}, // actor name via free text
			{"web-1", 20}, // target name via free text
			{"actor:u1 target:prod", 5},
			{"actor:u2 target:ag-1 decision:allow", 1},
			{"action:agent. decision:deny from:2026-01-02 kubectl", 0},
		}
		ctx := context.Background()
		// A second Log on the same table whose free-text window covers only
		// a few rows, so the trigram step of a text query is exercised too.
		narrow := audit.NewLog(db, audit.OrgTable, nil)
		audit.SetTextWindow(narrow, 5)
		for _, tc := range queries {
			f, err := audit.ParseQuery(tc.q)
			if err != nil {
				t.Fatalf("ParseQuery(%q): %v", tc.q, err)
			}
			var want []int64
			for i := len(all) - 1; i >= 0; i-- {
				if matches(f, all[i]) {
					want = append(want, all[i].Seq)
				}
			}
			if len(want) < tc.atLeast {
				t.Fatalf("%q: reference matched %d, seed expected at least %d", tc.q, len(want), tc.atLeast)
			}
			for name, lg := range map[string]*audit.Log{"default": l, "narrow text window": narrow} {
				// Page through with a small page to exercise the cursor.
				var got []int64
				before := int64(0)
				for {
					page, err := lg.Query(ctx, f, before, 7)
					if err != nil {
						t.Fatalf("Query(%q): %v", tc.q, err)
					}
					got = append(got, seqs(page)...)
					if len(page) < 7 {
						break
					}
					before = page[len(page)-1].Seq
				}
				if !slices.Equal(got, want) {
					t.Errorf("%q (%s):\n got  %s\n want %s", tc.q, name, fmtSeqs(got), fmtSeqs(want))
				}
			}
		}
	})
}

func TestQueryReturnsFullEvents(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		l, _ := newLog(t, d)
		all := seedVaried(t, l, 5)
		got, err := l.Query(context.Background(), audit.Filter{Actor: "Jane Doe"}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("got %d events, want 2", len(got))
		}
		want := all[4]
		g := got[0]
		if g.Seq != want.Seq || !g.Time.Equal(want.Time) || g.Actor != want.Actor || g.Target != want.Target ||
			g.Action != want.Action || g.Decision != want.Decision || string(g.Details) != string(want.Details) ||
			g.PrevHash != want.PrevHash || g.Hash != want.Hash || g.SourceIP != want.SourceIP || g.UserAgent != want.UserAgent {
			t.Fatalf("round trip:\n got  %+v\n want %+v", g, want)
		}
	})
}

// TestQueryPagingUnderAppends pages through a filter while new matching
// events keep arriving: the pages must be exactly the events present when
// paging began, newest first, without duplicates or gaps.
func TestQueryPagingUnderAppends(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		l, _ := newLog(t, d)
		ctx := context.Background()
		all := seedVaried(t, l, 60)
		f, err := audit.ParseQuery("action:agent.")
		if err != nil {
			t.Fatal(err)
		}
		var want []int64
		for i := len(all) - 1; i >= 0; i-- {
			if matches(f, all[i]) {
				want = append(want, all[i].Seq)
			}
		}
		var got []int64
		before := int64(0)
		for {
			page, err := l.Query(ctx, f, before, 4)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, seqs(page)...)
			if len(page) < 4 {
				break
			}
			before = page[len(page)-1].Seq
			// New matching and non-matching events between pages.
			mustAppend(t, l, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "u9"}, Action: "agent.exec"})
			mustAppend(t, l, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "u9"}, Action: "user.logout"})
		}
		if !slices.Equal(got, want) {
			t.Fatalf("paged under appends:\n got  %s\n want %s", fmtSeqs(got), fmtSeqs(want))
		}
		// The first page now starts with the newest appended event.
		first, err := l.Query(ctx, f, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(first) != 1 || first[0].Seq <= all[len(all)-1].Seq {
			t.Fatalf("first page after appends = %v", seqs(first))
		}
	})
}

func TestQueryPageSize(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		l, _ := newLog(t, d)
		seedVaried(t, l, audit.DefaultPageSize+3)
		got, err := l.Query(context.Background(), audit.Filter{}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != audit.DefaultPageSize || got[0].Seq != int64(audit.DefaultPageSize+3) {
			t.Fatalf("default page: %d events starting at %d", len(got), got[0].Seq)
		}
	})
}
