package retention_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/retention"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// clock is a fake time source: each read advances it by step.
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

func (c *clock) peek() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

var filler = audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "alice"}, Action: "thing.do", Target: audit.Target{Type: "thing"}}

func fill(t *testing.T, log *audit.Log, n int) {
	t.Helper()
	for range n {
		if _, err := log.Append(context.Background(), filler); err != nil {
			t.Fatal(err)
		}
	}
}

// recorded runs a command through the recorder at the clock's time: its
// output is recorded and its end event written.
func recorded(t *testing.T, db *gorm.DB, log *audit.Log, c *clock, n int) int64 {
	t.Helper()
	ctx := context.Background()
	at := c.peek()
	lease := at.Add(time.Hour)
	cmd := recordings.Command{SessionID: 1, AgentdID: fmt.Sprintf("gh-%d", n), Command: "echo hi", ActorType: "user", ActorID: "1",
		ActorName: "alice", StartedAt: at, LeaseOwner: "me", LeaseUntil: &lease, StdinContent: true}
	if err := recordings.Start(ctx, db, &cmd); err != nil {
		t.Fatal(err)
	}
	out := recordings.Output{Chunks: []recordings.Chunk{{Seq: 1, Stream: recordings.StreamStdout, At: at, Data: []byte("hi\n")}}}
	if _, err := recordings.AppendOutput(ctx, db, cmd.ID, "me", out, lease); err != nil {
		t.Fatal(err)
	}
	exit := 0
	if _, err := recordings.Finish(ctx, db, log, cmd.ID, "me", recordings.End{State: recordings.StateExited, ExitCode: &exit, At: at},
		audit.Actor{Type: audit.ActorSystem, Name: "recorder"}); err != nil {
		t.Fatal(err)
	}
	return cmd.ID
}

// Events and commands spread over 10 days, a policy of 7 days for audit
// events and 1 day for recordings: the old events are archived and removed,
// the old recording is removed with its command row kept and marked, the
// run is audited, and the org's verification (chain from its checkpoint,
// recordings its end events vouch for) passes, skipping only the removed
// recording. A marker set by hand on a newer command fails verification.
func TestApplyKeepsOrgVerifiable(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		now := time.Now().UTC().Truncate(time.Second)
		c := &clock{t: now.Add(-10 * 24 * time.Hour), step: 2 * time.Hour}
		log := audit.NewLog(db, audit.OrgTable, c.now)
		for _, q := range []string{
			"INSERT INTO environments (name, kind, url, created_by, created_at, updated_at) VALUES ('h', 'host', 'http://h', 'x', ?, ?)",
			"INSERT INTO agents (name, description, config, sandbox_mode, default_environment_id, idle_timeout_seconds, reclaim_after_seconds, command_policy, created_by, created_at, updated_at) VALUES ('a', '', '{}', 'off', 1, 900, 3600, '[]', 'x', ?, ?)",
			"INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at) VALUES (1, 'user:1', 'x', 'off', 'running', ?, ?)",
		} {
			if err := db.Exec(q, now, now).Error; err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		fill(t, log, 48)                    // days 0-4
		old := recorded(t, db, log, c, 1)   // ends ~6 days ago
		fill(t, log, 48)                    // days 4-8
		fresh := recorded(t, db, log, c, 2) // ends ~2 days ago
		fill(t, log, 12)

		if err := db.Transaction(func(tx *gorm.DB) error {
			return retention.Save(ctx, tx, retention.Policy{AuditDays: 7, RecordingsDays: 1})
		}); err != nil {
			t.Fatal(err)
		}
		r := &retention.Runner{ListOrgs: func(context.Context) ([]string, error) { return []string{"acme"}, nil },
			OpenOrg: func(context.Context, string) (retention.OrgDeps, error) {
				return retention.OrgDeps{DB: db, Audit: log, Release: func() {}}, nil
			}, Now: func() time.Time { return now }}
		res, err := r.ApplyOrg(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		// Events up to 3 days in (every 2 h from day 0) are older than 7 days.
		if res.AuditRemoved < 30 || res.RecordingsRemoved != 2 {
			t.Fatalf("apply: %+v", res)
		}
		v, err := recordings.VerifyOrg(ctx, db, log)
		if err != nil {
			t.Fatal(err)
		}
		if !v.OK || v.StartSeq != res.ThroughSeq+1 {
			t.Fatalf("org verify after retention: %+v", v)
		}
		// Both recordings ended more than a day ago: both removed, both
		// skipped; the command rows stay.
		var kept int64
		if err := db.Table("commands").Where("id IN ? AND recording_removed_at IS NOT NULL", []int64{old, fresh}).Count(&kept).Error; err != nil || kept != 2 {
			t.Fatalf("marked command rows: %d %v", kept, err)
		}
		if frames, err := recordings.Read(ctx, db, old, recordings.KindOut); err != nil || len(frames) != 0 {
			t.Fatalf("old recording still readable: %d chunks, %v", len(frames), err)
		}
		check, err := recordings.VerifyAll(ctx, db, log)
		if err != nil || !check.OK || check.RemovedByRetention != 2 {
			t.Fatalf("recordings check: %+v %v", check, err)
		}
		// The run is in the chain.
		f, _ := audit.ParseQuery("action:" + recordings.RetentionAction)
		evs, err := log.Query(ctx, f, 0, 10)
		if err != nil || len(evs) != 1 {
			t.Fatalf("retention events: %d %v", len(evs), err)
		}
		// The archive verifies on its own and ends where the chain starts.
		var buf bytes.Buffer
		if _, err := log.WriteArchive(ctx, res.Archives[0], &buf); err != nil {
			t.Fatal(err)
		}
		av, err := audit.VerifyJSONL(&buf)
		if err != nil || !av.OK || av.HeadHash != v.StartPrevHash {
			t.Fatalf("archive: %+v %v", av, err)
		}
		// A second run finds nothing more and is not audited again.
		if res2, err := r.ApplyOrg(ctx, "acme"); err != nil || res2.AuditRemoved != 0 || res2.RecordingsRemoved != 0 {
			t.Fatalf("second run: %+v %v", res2, err)
		}
		// A recording "removed" by hand on a command newer than the cutoff
		// is not vouched for.
		c.t = now.Add(time.Hour)
		newer := recorded(t, db, log, c, 3)
		if err := db.Exec("UPDATE commands SET recording_removed_at = ? WHERE id = ?", now, newer).Error; err != nil {
			t.Fatal(err)
		}
		if v, err := recordings.VerifyOrg(ctx, db, log); err != nil || v.OK {
			t.Fatalf("hand-removed recording verified: %+v %v", v, err)
		}
	})
}

// The default policy keeps everything and audits nothing.
func TestDefaultKeepsEverything(t *testing.T) {
	t.Parallel()
	db := storetest.Open(t, store.SQLite, store.OrgSet)
	c := &clock{t: time.Now().Add(-400 * 24 * time.Hour), step: 24 * time.Hour}
	log := audit.NewLog(db, audit.OrgTable, c.now)
	fill(t, log, 20)
	p, err := retention.Load(context.Background(), db)
	if err != nil || p != (retention.Policy{}) {
		t.Fatalf("default policy %+v %v", p, err)
	}
	r := &retention.Runner{ListOrgs: func(context.Context) ([]string, error) { return []string{"a"}, nil },
		OpenOrg: func(context.Context, string) (retention.OrgDeps, error) {
			return retention.OrgDeps{DB: db, Audit: log, Release: func() {}}, nil
		}}
	r.Round(context.Background())
	var n int64
	if err := db.Table(audit.OrgTable).Count(&n).Error; err != nil || n != 20 {
		t.Fatalf("events after a default round: %d %v", n, err)
	}
	if err := (retention.Policy{AuditDays: -1}).Validate(); err == nil {
		t.Fatal("negative days accepted")
	}
}

// With several replicas, a replica that finds the org's retention lock held
// leaves the org to the holder: nothing is removed twice or concurrently.
func TestApplyOrgSkipsWhenAnotherReplicaHoldsTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := storetest.Open(t, store.Postgres, store.OrgSet)
	c := &clock{t: time.Now().Add(-30 * 24 * time.Hour), step: 24 * time.Hour}
	log := audit.NewLog(db, audit.OrgTable, c.now)
	fill(t, log, 10)
	if err := db.Transaction(func(tx *gorm.DB) error { return retention.Save(ctx, tx, retention.Policy{AuditDays: 1}) }); err != nil {
		t.Fatal(err)
	}
	r := &retention.Runner{OpenOrg: func(context.Context, string) (retention.OrgDeps, error) {
		return retention.OrgDeps{DB: db, Audit: log, Release: func() {}}, nil
	}}
	unlock, ok, err := store.TryAdvisoryLock(ctx, db, store.LockKey("gatehouse-retention:acme"))
	if err != nil || !ok {
		t.Fatalf("take the other replica's lock: %v %v", ok, err)
	}
	if res, err := r.ApplyOrg(ctx, "acme"); !errors.Is(err, retention.ErrBusy) || res.AuditRemoved != 0 {
		t.Fatalf("while locked elsewhere: %+v %v", res, err)
	}
	unlock()
	if res, err := r.ApplyOrg(ctx, "acme"); err != nil || res.AuditRemoved == 0 {
		t.Fatalf("after the other replica let go: %+v %v", res, err)
	}
}
