package anchor_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/anchor"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// clock is a fake time source advancing by step on every call.
type clock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.t
	c.t = c.t.Add(c.step)
	return t
}

// fixture is a catalog with one org row and the org's own database.
type fixture struct {
	catalog  *gorm.DB
	orgDB    *gorm.DB
	org      orgs.Org
	log      *audit.Log // the org's
	platform *audit.Log
	svc      *anchor.Service
	box      *sealed.Box
}

func newFixture(t *testing.T, d store.Dialect) *fixture {
	t.Helper()
	key := make([]byte, sealed.KeySize)
	_, _ = rand.Read(key)
	box, err := sealed.New(key)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{catalog: storetest.Open(t, d, store.CatalogSet), orgDB: storetest.Open(t, d, store.OrgSet), box: box}
	f.org = addOrg(t, f.catalog, "acme")
	c := &clock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), step: time.Hour}
	f.log = audit.NewLog(f.orgDB, audit.OrgTable, c.now)
	f.platform = audit.NewLog(f.catalog, audit.PlatformTable, nil)
	f.svc = &anchor.Service{Catalog: f.catalog, Box: box, Audit: f.platform}
	return f
}

// addOrg writes an organizations row (the anchors refer to it).
func addOrg(t *testing.T, cat *gorm.DB, slug string) orgs.Org {
	t.Helper()
	now := time.Now().UTC()
	if err := cat.Exec(`INSERT INTO organizations (slug, name, status, db_dialect, db_locator, db_attached, created_at, updated_at)
		VALUES (?, ?, 'active', 'sqlite', 'x', FALSE, ?, ?)`, slug, strings.ToUpper(slug), now, now).Error; err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := cat.Raw("SELECT id FROM organizations WHERE slug = ?", slug).Scan(&id).Error; err != nil {
		t.Fatal(err)
	}
	return orgs.Org{ID: id, Slug: slug, Name: strings.ToUpper(slug), Status: orgs.StatusActive}
}

func (f *fixture) append(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		if _, err := f.log.Append(context.Background(), audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "alice"},
			Action: "thing.do", Details: audit.Details(map[string]int{"i": i})}); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fixture) take(t *testing.T) anchor.Result {
	t.Helper()
	res, err := f.svc.Take(context.Background(), f.org, f.log)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// counts is how many checkpoints the catalog holds for the org and how
// many the platform log recorded.
func (f *fixture) counts(t *testing.T) (rows, events int64) {
	t.Helper()
	if err := f.catalog.Raw("SELECT count(*) FROM audit_anchors WHERE org_id = ?", f.org.ID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if err := f.catalog.Raw("SELECT count(*) FROM platform_audit_events WHERE action = ?", anchor.Action).Scan(&events).Error; err != nil {
		t.Fatal(err)
	}
	return rows, events
}

// verify is what `audit verify` does: the chain, then the checkpoints.
func (f *fixture) verify(t *testing.T) audit.VerifyResult {
	t.Helper()
	ctx := context.Background()
	res, err := f.log.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err = f.svc.Verify(ctx, f.org, f.log, res); err != nil {
		t.Fatal(err)
	}
	return res
}

// cut deletes the org's events after seq, as a cut tail or a restored
// older copy of its database leaves it.
func (f *fixture) cut(t *testing.T, after int64) {
	t.Helper()
	if err := f.orgDB.Exec("DELETE FROM audit_events WHERE seq > ?", after).Error; err != nil {
		t.Fatal(err)
	}
}

// The loop, driven by a tick the test owns, writes a checkpoint when the
// head moved and not when it did not; each is in the platform log.
func TestCheckpointOnlyWhenHeadMoves(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		f.append(t, 5)
		tick := make(chan time.Time)
		stats := make(chan anchor.Stats)
		r := &anchor.Runner{Anchors: f.svc, Stats: stats,
			ListOrgs: func(context.Context) ([]string, error) { return []string{f.org.Slug}, nil },
			OpenOrg: func(context.Context, string) (anchor.OrgDeps, error) {
				return anchor.OrgDeps{Org: f.org, Audit: f.log, Release: func() {}}, nil
			}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx, tick); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		round := func(step string, want anchor.Stats) {
			t.Helper()
			if got := <-stats; got != want {
				t.Fatalf("%s: round %+v, want %+v", step, got, want)
			}
		}
		round("at start", anchor.Stats{Orgs: 1, Written: 1})
		if rows, evs := f.counts(t); rows != 1 || evs != 1 {
			t.Fatalf("after the first round: %d checkpoints, %d platform events; want 1 and 1", rows, evs)
		}
		tick <- time.Now()
		round("head unchanged", anchor.Stats{Orgs: 1, Unchanged: 1})
		if rows, evs := f.counts(t); rows != 1 || evs != 1 {
			t.Fatalf("an unchanged head was checkpointed again: %d checkpoints, %d platform events", rows, evs)
		}
		f.append(t, 2)
		tick <- time.Now()
		round("head moved", anchor.Stats{Orgs: 1, Written: 1})
		cp, err := f.svc.Latest(context.Background(), f.org)
		if err != nil {
			t.Fatal(err)
		}
		head, _, _ := f.log.Head(context.Background())
		if cp.Seq != 7 || cp.Hash != head.Hash {
			t.Fatalf("checkpoint %d %s, want the head 7 %s", cp.Seq, cp.Hash, head.Hash)
		}
		if rows, evs := f.counts(t); rows != 2 || evs != 2 {
			t.Fatalf("after the head moved: %d checkpoints, %d platform events; want 2 and 2", rows, evs)
		}
		evs, err := f.platform.Query(context.Background(), audit.Filter{Action: anchor.Action}, 0, 10)
		if err != nil || len(evs) != 2 || evs[0].Target.ID != "acme" || !strings.Contains(string(evs[0].Details), `"seq":7`) {
			t.Fatalf("platform record of the checkpoint: %+v %v", evs, err)
		}
		if v, err := f.platform.Verify(context.Background()); err != nil || !v.OK {
			t.Fatalf("platform chain: %+v %v", v, err)
		}
	})
}

// Deleting the newest events after a checkpoint: the chain that remains
// still links, but verification against the checkpoint fails naming the
// missing events, and no newer checkpoint hides the cut.
func TestCutTailIsReported(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		f.append(t, 10)
		if res := f.take(t); !res.Written || res.Checkpoint.Seq != 10 {
			t.Fatalf("take: %+v", res)
		}
		if v := f.verify(t); !v.OK || v.Anchor == nil || !v.Anchor.OK {
			t.Fatalf("untouched chain: %+v", v)
		}
		f.cut(t, 7)
		if v, err := f.log.Verify(context.Background()); err != nil || !v.OK {
			t.Fatalf("the cut chain should still link on its own: %+v %v", v, err)
		}
		v := f.verify(t)
		if v.OK || v.BrokenAt != 8 || v.Anchor.MissingFrom != 8 || v.Anchor.MissingThrough != 10 || v.Anchor.HeadSeq != 7 {
			t.Fatalf("cut tail: %+v %+v", v, v.Anchor)
		}
		for _, want := range []string{"events 8–10 are missing", "recorded event 10 with hash " + v.Anchor.Anchor.Hash, "the log ends at 7"} {
			if !strings.Contains(v.Reason, want) {
				t.Errorf("reason %q does not say %q", v.Reason, want)
			}
		}
		if res := f.take(t); res.Written || res.Mismatch == nil || res.Checkpoint.Seq != 10 {
			t.Fatalf("a checkpoint was taken over the cut: %+v", res)
		}
	})
}

// An older copy of the database restored: with nothing written since, the
// events after the copy are missing; written to since, the log diverges
// after the newest checkpoint it still matches.
func TestRestoredOlderCopyIsReported(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		f.append(t, 5)
		f.take(t) // 5
		f.append(t, 5)
		f.take(t) // 10
		f.append(t, 5)
		f.take(t)   // 15
		f.cut(t, 8) // the copy made at event 8
		t.Run("as restored", func(t *testing.T) {
			v := f.verify(t)
			if v.OK || v.BrokenAt != 9 || !strings.Contains(v.Reason, "events 9–15 are missing") {
				t.Fatalf("restored copy: %+v", v)
			}
		})
		f.append(t, 7) // the restored copy in use: events 9..15 again, but other ones
		t.Run("written to since", func(t *testing.T) {
			v := f.verify(t)
			if v.OK || v.Anchor.MissingFrom != 6 || v.Anchor.MissingThrough != 15 || v.BrokenAt != 6 {
				t.Fatalf("restored and written: %+v %+v", v, v.Anchor)
			}
			for _, want := range []string{"no longer holds events 6–15 as checkpointed", "after event 5", "at or before event 10"} {
				if !strings.Contains(v.Reason, want) {
					t.Errorf("reason %q does not say %q", v.Reason, want)
				}
			}
			if res := f.take(t); res.Written || res.Mismatch == nil || res.Mismatch.MissingFrom != 6 {
				t.Fatalf("a checkpoint was taken over the restored copy: %+v", res)
			}
		})
	})
}

// Retention removes the oldest events, the checkpointed one included when
// the head moved on; verification and new checkpoints carry on.
func TestRetentionKeepsCheckpointsVerifying(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		f := newFixture(t, d)
		f.append(t, 5)
		f.take(t) // event 5, at 04:00
		f.append(t, 5)
		// Events 1..9 are older than the cutoff; 10, the head, stays.
		if res, err := f.log.Expire(ctx, time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)); err != nil || res.ThroughSeq != 9 {
			t.Fatalf("expire: %+v %v", res, err)
		}
		if v := f.verify(t); !v.OK || !v.Anchor.OK || !v.Anchor.Retained {
			t.Fatalf("checkpoint inside the archives: %+v %+v", v, v.Anchor)
		}
		if res := f.take(t); !res.Written || res.Checkpoint.Seq != 10 {
			t.Fatalf("take after retention: %+v", res)
		}
		f.append(t, 3)
		if res := f.take(t); !res.Written || res.Checkpoint.Seq != 13 {
			t.Fatalf("take: %+v", res)
		}
		f.append(t, 1)
		// Through 13: the checkpoint at 13 is compared with the retention
		// checkpoint that ends at it.
		if res, err := f.log.Expire(ctx, time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)); err != nil || res.ThroughSeq != 13 {
			t.Fatalf("expire: %+v %v", res, err)
		}
		if v := f.verify(t); !v.OK || !v.Anchor.OK || v.Anchor.Retained {
			t.Fatalf("after a second retention run: %+v %+v", v, v.Anchor)
		}
		if res := f.take(t); !res.Written || res.Checkpoint.Seq != 14 {
			t.Fatalf("take: %+v", res)
		}
		f.cut(t, 13) // retention never removes the head: this is a cut
		if v := f.verify(t); v.OK || v.BrokenAt != 14 || !strings.Contains(v.Reason, "event 14 is missing") || !strings.Contains(v.Reason, "the log ends at 13") {
			t.Fatalf("cut after retention: %+v", v)
		}
	})
}

// The export verifies offline with its own public key; an edited
// signature or field does not; a pinned key must match.
func TestExportVerifiesOffline(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		f := newFixture(t, d)
		f.append(t, 4)
		f.take(t)
		exp, err := f.svc.Export(ctx, f.org)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(exp)
		got, err := anchor.ReadExport(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		a, err := got.Verify(got.PublicKeySHA256)
		if err != nil || a.Seq != 4 || got.Org != "acme" || got.OrgID != f.org.ID {
			t.Fatalf("exported checkpoint: %+v %v", got, err)
		}
		sig, _ := base64.StdEncoding.DecodeString(got.Signature)
		sig[10] ^= 1
		for name, edit := range map[string]func(*anchor.Export){
			"signature": func(e *anchor.Export) { e.Signature = base64.StdEncoding.EncodeToString(sig) },
			"seq":       func(e *anchor.Export) { e.Seq = 3 },
			"hash":      func(e *anchor.Export) { e.Hash = strings.Repeat("0", 64) },
			"org":       func(e *anchor.Export) { e.Org = "globex" },
			"taken_at":  func(e *anchor.Export) { e.TakenAt = "2030-01-01T00:00:00Z" },
		} {
			e := got
			edit(&e)
			if _, err := e.Verify(""); err == nil || !strings.Contains(err.Error(), "signature does not verify") {
				t.Errorf("edited %s: %v", name, err)
			}
		}
		if _, err := got.Verify(strings.Repeat("ab", 32)); err == nil || !strings.Contains(err.Error(), "pinned") {
			t.Errorf("another pinned key: %v", err)
		}
		// The same checkpoint signed by another key (another org's, say)
		// with its own public key in the file still verifies on its own:
		// pinning is what ties it to the org.
		other := addOrg(t, f.catalog, "globex")
		otherLog := audit.NewLog(storetest.Open(t, d, store.OrgSet), audit.OrgTable, nil)
		if _, err := otherLog.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem}, Action: "org.create"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.Take(ctx, other, otherLog); err != nil {
			t.Fatal(err)
		}
		oexp, err := f.svc.Export(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		if oexp.PublicKeySHA256 == got.PublicKeySHA256 {
			t.Fatal("two orgs share a checkpoint key")
		}
		if _, err := oexp.Verify(got.PublicKeySHA256); err == nil {
			t.Fatal("another org's checkpoint passed acme's pinned key")
		}
	})
}

// The key's seed is sealed to its org: a key row moved to another org
// does not open there.
func TestKeySealedToItsOrg(t *testing.T) {
	t.Parallel()
	f := newFixture(t, store.SQLite)
	ctx := context.Background()
	f.append(t, 1)
	f.take(t)
	var sealedKey string
	if err := f.catalog.Raw("SELECT sealed_key FROM audit_anchor_keys WHERE org_id = ?", f.org.ID).Scan(&sealedKey).Error; err != nil || !strings.HasPrefix(sealedKey, "v1:") {
		t.Fatalf("sealed key %q %v", sealedKey, err)
	}
	other := addOrg(t, f.catalog, "globex")
	if err := f.catalog.Exec("UPDATE audit_anchor_keys SET org_id = ? WHERE org_id = ?", other.ID, f.org.ID).Error; err != nil {
		t.Fatal(err)
	}
	otherLog := audit.NewLog(storetest.Open(t, store.SQLite, store.OrgSet), audit.OrgTable, nil)
	if _, err := otherLog.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem}, Action: "org.create"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Take(ctx, other, otherLog); err == nil || !strings.Contains(err.Error(), "open the audit checkpoint key") {
		t.Fatalf("a moved key opened: %v", err)
	}
}

// Replicas checkpointing one org at once write each head once, in order:
// no two checkpoints share a sequence number and none goes backwards.
func TestConcurrentReplicasWriteInOrder(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		f := newFixture(t, d)
		f.append(t, 1)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for r := range 4 { // replicas: their own services on one catalog
			svc := &anchor.Service{Catalog: f.catalog, Box: f.box, Audit: audit.NewLog(f.catalog, audit.PlatformTable, nil)}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 8 {
					if r == 0 && i%2 == 0 {
						if _, err := f.log.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem}, Action: "thing.do"}); err != nil {
							errs <- err
							return
						}
					}
					res, err := svc.Take(ctx, f.org, f.log)
					if err != nil {
						errs <- fmt.Errorf("replica %d: %w", r, err)
						return
					}
					if res.Mismatch != nil {
						errs <- fmt.Errorf("replica %d: mismatch %s", r, res.Mismatch.Reason)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		var seqs []int64
		if err := f.catalog.Raw("SELECT seq FROM audit_anchors WHERE org_id = ? ORDER BY id", f.org.ID).Scan(&seqs).Error; err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("checkpoints out of order: %v", seqs)
			}
		}
		rows, evs := f.counts(t)
		head, _, _ := f.log.Head(ctx)
		if rows != evs || len(seqs) == 0 || seqs[len(seqs)-1] != head.Seq {
			t.Fatalf("checkpoints %v (%d platform events), head %d", seqs, evs, head.Seq)
		}
		if v := f.verify(t); !v.OK {
			t.Fatalf("verify: %+v", v)
		}
	})
}
