package audit_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// With a 1-day policy over events spread across 10 days, Expire archives
// and removes the old ones; the remaining chain verifies from its
// checkpoint, the archive verifies on its own and links to the checkpoint,
// an event edited in the archive fails, and appends continue the chain.
func TestExpireKeepsChainVerifiable(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		c := &clock{t: start, step: 2 * time.Hour} // 120 events over 10 days
		l := audit.NewLog(db, audit.OrgTable, c.now)
		const n = 120
		for i := range n {
			mustAppend(t, l, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "u1", Name: "alice"}, Action: "thing.do",
				Target: audit.Target{Type: "thing", ID: string(rune('a' + i%26))}, Details: audit.Details(map[string]int{"i": i})})
		}
		ctx := context.Background()
		now := start.Add(n * 2 * time.Hour)
		cutoff := now.Add(-24 * time.Hour)
		res, err := l.Expire(ctx, cutoff)
		if err != nil {
			t.Fatal(err)
		}
		// Events at 0h, 2h, ... before cutoff (= 216h): seq 1..108.
		if res.Removed != 108 || res.ThroughSeq != 108 || len(res.Archives) != 1 {
			t.Fatalf("expire: %+v, want 108 removed through seq 108 in one archive", res)
		}
		v, err := l.Verify(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !v.OK || v.Checked != n-108 || v.StartSeq != 109 || v.StartPrevHash != res.ThroughHash {
			t.Fatalf("verify after retention: %+v", v)
		}
		// The search index is rebuilt without blocking (a no-op on SQLite),
		// and the chain still verifies.
		if err := l.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		if v, err := l.Verify(ctx); err != nil || !v.OK {
			t.Fatalf("verify after compact: %+v %v", v, err)
		}
		// Idempotent: nothing more to remove.
		if again, err := l.Expire(ctx, cutoff); err != nil || again.Removed != 0 {
			t.Fatalf("second expire: %+v %v", again, err)
		}

		var archive bytes.Buffer
		a, err := l.WriteArchive(ctx, res.Archives[0], &archive)
		if err != nil {
			t.Fatal(err)
		}
		if a.FirstSeq != 1 || a.LastSeq != 108 || a.LastHash != res.ThroughHash || a.Events != 108 {
			t.Fatalf("archive: %+v", a)
		}
		av, err := audit.VerifyJSONL(bytes.NewReader(archive.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if !av.OK || av.Checked != 108 || av.StartSeq != 1 || av.HeadHash != v.StartPrevHash {
			t.Fatalf("archive verify: %+v (head must link to the checkpoint %s)", av, v.StartPrevHash)
		}
		// An edited event in the archive fails at its own sequence.
		lines := strings.Split(strings.TrimSpace(archive.String()), "\n")
		lines[41] = strings.Replace(lines[41], `"alice"`, `"mallory"`, 1)
		bad, err := audit.VerifyJSONL(strings.NewReader(strings.Join(lines, "\n")))
		if err != nil {
			t.Fatal(err)
		}
		// The archive and the live chain give the same reasons.
		if bad.OK || bad.BrokenAt != 42 || bad.Reason != "event content does not match its hash" {
			t.Fatalf("edited archive: %+v, want broken at 42", bad)
		}
		// A removed line is a gap.
		gap, _ := audit.VerifyJSONL(strings.NewReader(strings.Join(append(append([]string{}, lines[:10]...), lines[11:]...), "\n")))
		if gap.OK || gap.BrokenAt != 11 || gap.Reason != "sequence 11 is missing (next present is 12)" {
			t.Fatalf("archive with a line removed: %+v, want broken at 11", gap)
		}

		// The chain goes on from the remaining head.
		mustAppend(t, l, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem}, Action: "retention.apply"})
		if v, err := l.Verify(ctx); err != nil || !v.OK || v.Checked != n-108+1 {
			t.Fatalf("verify after a later append: %+v %v", v, err)
		}
		// An edit of a remaining event is still caught.
		if err := db.Exec("UPDATE audit_events SET actor_name = 'mallory' WHERE seq = 110").Error; err != nil {
			t.Fatal(err)
		}
		if v, _ := l.Verify(ctx); v.OK || v.BrokenAt != 110 || v.Reason != "event content does not match its hash" {
			t.Fatalf("edited remaining event: %+v", v)
		}
		list, err := l.Archives(ctx)
		if err != nil || len(list) != 1 || list[0].Body != nil {
			t.Fatalf("archives: %+v %v", list, err)
		}
	})
}

// Expire never removes the chain head, even when every event expired.
func TestExpireKeepsHead(t *testing.T) {
	t.Parallel()
	l, _ := newLog(t, store.SQLite)
	for range 5 {
		mustAppend(t, l, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem}, Action: "x"})
	}
	res, err := l.Expire(context.Background(), time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	if err != nil || res.Removed != 4 {
		t.Fatalf("expire all: %+v %v", res, err)
	}
	if v, err := l.Verify(context.Background()); err != nil || !v.OK || v.Checked != 1 || v.StartSeq != 5 {
		t.Fatalf("verify: %+v %v", v, err)
	}
}
