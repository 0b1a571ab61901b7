package retention_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/metrics"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/retention"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// syncBuffer is a log sink safe for the runner's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// counter reads one series of a counter from the registry (0 when absent).
func counter(t *testing.T, m *metrics.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue series
				}
			}
			return s.GetCounter().GetValue()
		}
	}
	return 0
}

func retentionEvents(t *testing.T, log *audit.Log) int {
	t.Helper()
	f, err := audit.ParseQuery("action:" + recordings.RetentionAction)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := log.Query(context.Background(), f, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// Every retention round leaves a trace: a debug log line naming the org
// and the outcome, and a count per org and outcome. A round that removed
// something is also audited (retention.apply) and its removals counted; a
// round that found nothing to remove, or an org that keeps everything,
// writes no audit event.
func TestRetentionRoundsReport(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Second)
		type org struct {
			db  *gorm.DB
			log *audit.Log
		}
		open := map[string]org{}
		for _, slug := range []string{"acme", "beta"} {
			db := storetest.Open(t, d, store.OrgSet)
			// Ten events a day apart, the newest 21 days ago.
			c := &clock{t: now.Add(-30 * 24 * time.Hour), step: 24 * time.Hour}
			log := audit.NewLog(db, audit.OrgTable, c.now)
			fill(t, log, 10)
			open[slug] = org{db, log}
		}
		// acme keeps 60 days (nothing is that old yet); beta keeps everything.
		if err := open["acme"].db.Transaction(func(tx *gorm.DB) error {
			return retention.Save(ctx, tx, retention.Policy{AuditDays: 60})
		}); err != nil {
			t.Fatal(err)
		}
		logs := &syncBuffer{}
		m := metrics.New(metrics.Options{PerOrgDB: true})
		r := &retention.Runner{
			ListOrgs: func(context.Context) ([]string, error) { return []string{"acme", "beta"}, nil },
			OpenOrg: func(_ context.Context, slug string) (retention.OrgDeps, error) {
				return retention.OrgDeps{DB: open[slug].db, Audit: open[slug].log, Release: func() {}}, nil
			},
			Now:     func() time.Time { return now },
			Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Metrics: m,
		}
		rounds := func(org, outcome string) float64 {
			return counter(t, m, "gatehouse_retention_rounds_total", map[string]string{"org": org, "outcome": outcome})
		}

		t.Run("nothing to remove", func(t *testing.T) {
			r.Round(ctx)
			for _, want := range []string{
				`msg="retention round" org=acme outcome=nothing audit_days=60 recordings_days=0 audit_removed=0 recordings_removed=0`,
				`msg="retention round" org=beta outcome=keep_all`,
			} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("no log line %q in:\n%s", want, logs)
				}
			}
			if got := rounds("acme", retention.OutcomeNothing); got != 1 {
				t.Errorf("acme rounds with nothing removed: %v, want 1", got)
			}
			if got := rounds("beta", retention.OutcomeKeepAll); got != 1 {
				t.Errorf("beta rounds keeping everything: %v, want 1", got)
			}
			for slug, o := range open {
				if n := retentionEvents(t, o.log); n != 0 {
					t.Errorf("%s: %d retention.apply events after a round that removed nothing", slug, n)
				}
			}
		})

		t.Run("removes and audits", func(t *testing.T) {
			if err := open["acme"].db.Transaction(func(tx *gorm.DB) error {
				return retention.Save(ctx, tx, retention.Policy{AuditDays: 25})
			}); err != nil {
				t.Fatal(err)
			}
			r.Round(ctx)
			// Events 30..26 days old are older than 25 days.
			if !strings.Contains(logs.String(), `msg="retention round" org=acme outcome=removed audit_days=25 recordings_days=0 audit_removed=5`) {
				t.Errorf("no removing round logged:\n%s", logs)
			}
			if got := rounds("acme", retention.OutcomeRemoved); got != 1 {
				t.Errorf("acme rounds that removed: %v, want 1", got)
			}
			if got := counter(t, m, "gatehouse_retention_removed_total", map[string]string{"org": "acme", "kind": "audit_events"}); got != 5 {
				t.Errorf("audit events counted removed: %v, want 5", got)
			}
			if n := retentionEvents(t, open["acme"].log); n != 1 {
				t.Errorf("%d retention.apply events after a removing round, want 1", n)
			}
			if n := retentionEvents(t, open["beta"].log); n != 0 {
				t.Errorf("beta audited %d retention runs keeping everything", n)
			}
		})

		t.Run("again, nothing left", func(t *testing.T) {
			r.Round(ctx)
			if got := rounds("acme", retention.OutcomeNothing); got != 2 {
				t.Errorf("acme rounds with nothing removed: %v, want 2", got)
			}
			if n := retentionEvents(t, open["acme"].log); n != 1 {
				t.Errorf("%d retention.apply events, want still 1", n)
			}
		})
	})
}

// Without per-org labels every org counts as org="all", so the series stay
// bounded however many orgs there are.
func TestRetentionRoundsUnlabelledByDefault(t *testing.T) {
	t.Parallel()
	db := storetest.Open(t, store.SQLite, store.OrgSet)
	log := audit.NewLog(db, audit.OrgTable, nil)
	fill(t, log, 2)
	m := metrics.New(metrics.Options{})
	r := &retention.Runner{
		ListOrgs: func(context.Context) ([]string, error) { return []string{"a", "b", "c"}, nil },
		OpenOrg: func(context.Context, string) (retention.OrgDeps, error) {
			return retention.OrgDeps{DB: db, Audit: log, Release: func() {}}, nil
		},
		Metrics: m,
	}
	r.Round(context.Background())
	if got := counter(t, m, "gatehouse_retention_rounds_total", map[string]string{"org": "all", "outcome": retention.OutcomeKeepAll}); got != 3 {
		t.Fatalf("rounds counted as org=all: %v, want 3", got)
	}
}

// With AsOf (console retention run --as-of), the policy counts back from
// that earlier time, so less is removed, while what is removed is marked
// and archived at the real time: a command row never claims its recording
// was removed before it was. The org still verifies.
func TestAsOfCountsBackButRecordsNow(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		now := time.Now().UTC().Truncate(time.Second)
		for _, q := range []string{
			"INSERT INTO environments (name, kind, url, created_by, created_at, updated_at) VALUES ('h', 'host', 'http://h', 'x', ?, ?)",
			"INSERT INTO agents (name, description, config, sandbox_mode, default_environment_id, idle_timeout_seconds, reclaim_after_seconds, command_policy, created_by, created_at, updated_at) VALUES ('a', '', '{}', 'off', 1, 900, 3600, '[]', 'x', ?, ?)",
			"INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at) VALUES (1, 'user:1', 'x', 'off', 'running', ?, ?)",
		} {
			if err := db.Exec(q, now, now).Error; err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		c := &clock{t: now.Add(-10 * 24 * time.Hour), step: time.Minute}
		log := audit.NewLog(db, audit.OrgTable, c.now)
		old := recorded(t, db, log, c, 1) // ended 10 days ago
		c.t = now.Add(-3 * 24 * time.Hour)
		mid := recorded(t, db, log, c, 2) // ended 3 days ago
		c.t = now
		if err := db.Transaction(func(tx *gorm.DB) error { return retention.Save(ctx, tx, retention.Policy{RecordingsDays: 1}) }); err != nil {
			t.Fatal(err)
		}
		r := &retention.Runner{OpenOrg: func(context.Context, string) (retention.OrgDeps, error) {
			return retention.OrgDeps{DB: db, Audit: log, Release: func() {}}, nil
		}, Now: func() time.Time { return now }, AsOf: now.Add(-5 * 24 * time.Hour)}
		res, err := r.ApplyOrg(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		// As of 5 days ago, a day's policy removes what ended before 6 days ago.
		if res.RecordingsRemoved != 1 || res.RecordingsCutoff == nil || !res.RecordingsCutoff.Equal(now.Add(-6*24*time.Hour)) {
			t.Fatalf("as-of run: %+v", res)
		}
		var marks []struct {
			ID                 int64
			RecordingRemovedAt *time.Time
		}
		if err := db.Table("commands").Select("id, recording_removed_at").Where("id IN ?", []int64{old, mid}).Order("id").Scan(&marks).Error; err != nil {
			t.Fatal(err)
		}
		if len(marks) != 2 || marks[0].RecordingRemovedAt == nil || !marks[0].RecordingRemovedAt.UTC().Equal(now) || marks[1].RecordingRemovedAt != nil {
			t.Fatalf("markers: %+v, want the old command's at %s and none on the newer", marks, now)
		}
		if v, err := recordings.VerifyOrg(ctx, db, log); err != nil || !v.OK {
			t.Fatalf("org verify after an as-of run: %+v %v", v, err)
		}
	})
}
