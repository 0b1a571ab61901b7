package sessions_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// noProcesses runs the fake backend without agentd processes: these tests
// only bring sessions up and read their targets.
var noProcesses = e2bfake.Config{Launcher: e2bfake.NopLauncher{}}

// policyOf ensures session id through svc and returns the pattern of its
// agent's command policy that refuses command ("" when none does), as the
// gateway's check sees it.
func policyOf(t *testing.T, svc *sessions.Service, id int64, command string) string {
	t.Helper()
	var denied string
	if _, err := svc.EnsureFor(context.Background(), sys(), id, func(tg sessions.Target) error {
		denied = tg.Agent.DeniedBy(command)
		return nil
	}); err != nil {
		t.Fatalf("ensure session %d: %v", id, err)
	}
	return denied
}

func setPolicy(t *testing.T, w *world, patterns ...string) {
	t.Helper()
	if _, _, err := w.ags.Update(context.Background(), sys(), w.agent.ID, agents.Input{CommandPolicy: patterns}); err != nil {
		t.Fatalf("change the command policy: %v", err)
	}
}

func configVersion(t *testing.T, db *gorm.DB) int64 {
	t.Helper()
	var v int64
	if err := db.Raw("SELECT version FROM config_version WHERE id = 1").Scan(&v).Error; err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCacheKeyedByOrgDatabase: two org databases under one slug (an org
// deleted and created again) share a process's runtime; session 1 of the
// second never gets the first's target, however fresh its entry is.
func TestCacheKeyedByOrgDatabase(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		rt := &sessions.Runtime{RefreshEvery: time.Hour}
		old, recreated := newWorld(t, d, noProcesses), newWorld(t, d, noProcesses)
		oldSvc, newSvc := old.svcOn(old.db, rt), recreated.svcOn(recreated.db, rt)
		a, b := old.newSession(t, oldSvc, sys()), recreated.newSession(t, newSvc, sys())
		if a.ID != b.ID {
			t.Fatalf("sessions %d and %d: the test needs the same id in both databases", a.ID, b.ID)
		}
		if _, err := oldSvc.Ensure(ctx, sys(), a.ID); err != nil {
			t.Fatal(err)
		}
		got, err := newSvc.Ensure(ctx, sys(), b.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Environment.URL != recreated.env.URL || !strings.HasPrefix(got.AgentdURL, "http") || len(recreated.tagged(t, b.ID)) != 1 {
			t.Fatalf("the re-created org's session runs at %s (environment %s), want its own backend %s", got.AgentdURL, got.Environment.URL, recreated.env.URL)
		}
		loc, err := newSvc.Locate(ctx, sys(), b.ID)
		if err != nil || loc.Session.SandboxID != got.Session.SandboxID {
			t.Fatalf("locate in the re-created org: sandbox %q (%v), want %q", loc.Session.SandboxID, err, got.Session.SandboxID)
		}
		rt.ForgetOrg(testOrg)
		if got, err := newSvc.Ensure(ctx, sys(), b.ID); err != nil || got.Environment.URL != recreated.env.URL {
			t.Fatalf("after ForgetOrg: %s, %v", got.Environment.URL, err)
		}
	})
}

// TestConfigChangeAppliesAtOnce: a change of the agent through the
// watched handle is seen by the very next use of a cached session in the
// same process.
func TestConfigChangeAppliesAtOnce(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, noProcesses)
		if err := sessions.WatchConfig(w.db); err != nil {
			t.Fatal(err)
		}
		w.rt.RefreshEvery = time.Hour
		svc := w.svc(nil)
		s := w.newSession(t, svc, sys())
		if got := policyOf(t, svc, s.ID, "echo stale-now"); got != "" {
			t.Fatalf("refused by %q before the change", got)
		}
		setPolicy(t, w, `^echo stale`)
		if got := policyOf(t, svc, s.ID, "echo stale-now"); got != `^echo stale` {
			t.Fatalf("right after the change the policy refuses with %q, want ^echo stale", got)
		}
		setPolicy(t, w, []string{}...)
		if got := policyOf(t, svc, s.ID, "echo stale-now"); got != "" {
			t.Fatalf("right after the pattern was removed it still refuses with %q", got)
		}
	})
}

// TestLocalChangeSeenOnce: after a change through this process's handle,
// uses read config_version only until one read shows the change; from then
// on they are back to one read per ConfigCheckEvery (the gateway's hot
// path pays no query for the seconds after an admin's edit). A bump that
// rolled back does not keep them reading either, once a later change is
// seen.
func TestLocalChangeSeenOnce(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, noProcesses)
		if err := sessions.WatchConfig(w.db); err != nil {
			t.Fatal(err)
		}
		var reads atomic.Int64
		if err := w.db.Callback().Row().After("gorm:row").Register("test:count_version_reads", func(db *gorm.DB) {
			if strings.HasPrefix(db.Statement.SQL.String(), "SELECT version FROM config_version") {
				reads.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
		w.rt.RefreshEvery = time.Hour
		svc := w.svc(nil)
		s := w.newSession(t, svc, sys())
		uses := func(step string) {
			t.Helper()
			reads.Store(0)
			start := time.Now()
			for range 50 {
				if got := policyOf(t, svc, s.ID, "echo stale-now"); got != `^echo stale` {
					t.Fatalf("%s: the policy refuses with %q, want ^echo stale", step, got)
				}
			}
			if n, took := reads.Load(), time.Since(start); took < sessions.DefaultConfigCheckEvery && n > 1 {
				t.Fatalf("%s: 50 uses within %s read config_version %d times, want at most once a second", step, took, n)
			}
		}
		setPolicy(t, w, `^echo stale`)
		if got := policyOf(t, svc, s.ID, "echo stale-now"); got != `^echo stale` {
			t.Fatalf("right after the change the policy refuses with %q, want ^echo stale", got)
		}
		uses("after the change was seen")

		_ = w.db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Table("agents").Where("id = ?", w.agent.ID).Update("description", "never").Error; err != nil {
				t.Fatal(err)
			}
			return errRollback
		})
		setPolicy(t, w, `^echo stale`, `^rm`)
		if got := policyOf(t, svc, s.ID, "rm -rf /"); got != `^rm` {
			t.Fatalf("right after a change that followed a rolled-back one the policy refuses rm with %q, want ^rm", got)
		}
		uses("after a rolled-back change and a committed one")
	})
}

// TestConfigChangeReachesOtherReplica: replica B (its own handle and
// runtime on the same database) sees a change made through replica A
// within ConfigCheckEvery, and in between reads config_version at most
// once per ConfigCheckEvery however many requests it serves.
func TestConfigChangeReachesOtherReplica(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dsn := storetest.DSN(t, d)
		open := func() *gorm.DB {
			db, err := store.Open(ctx, dsn, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close(db) })
			if err := sessions.WatchConfig(db); err != nil {
				t.Fatal(err)
			}
			return db
		}
		dbA := open()
		if _, err := store.Migrate(ctx, dbA, store.OrgSet); err != nil {
			t.Fatal(err)
		}
		dbB := open()
		var reads atomic.Int64
		if err := dbB.Callback().Row().After("gorm:row").Register("test:count_version_reads", func(db *gorm.DB) {
			if strings.Contains(db.Statement.SQL.String(), "config_version") {
				reads.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
		w := newWorldOn(t, dbA, newBox(t), noProcesses)
		b := w.svcOn(dbB, &sessions.Runtime{RefreshEvery: time.Hour})
		s := w.newSession(t, w.svc(nil), sys())
		if got := policyOf(t, b, s.ID, "echo stale-now"); got != "" {
			t.Fatalf("refused by %q before the change", got)
		}
		reads.Store(0)
		start := time.Now()
		for range 50 {
			policyOf(t, b, s.ID, "echo stale-now")
		}
		if n, took := reads.Load(), time.Since(start); took < sessions.DefaultConfigCheckEvery && n > 1 {
			t.Fatalf("50 uses within %s read config_version %d times, want at most once a second", took, n)
		}
		setPolicy(t, w, `^echo stale`)
		// The documented bound: another replica's change applies within
		// ConfigCheckEvery.
		time.Sleep(sessions.DefaultConfigCheckEvery + 100*time.Millisecond)
		if got := policyOf(t, b, s.ID, "echo stale-now"); got != `^echo stale` {
			t.Fatalf("a second after replica A's change, replica B's policy refuses with %q, want ^echo stale", got)
		}
	})
}

// TestConfigVersionBumps: what moves config_version and what does not.
func TestConfigVersionBumps(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		w := newWorld(t, d, noProcesses)
		if err := sessions.WatchConfig(w.db); err != nil {
			t.Fatal(err)
		}
		if err := sessions.WatchConfig(w.db); err != nil {
			t.Fatalf("watching twice: %v", err)
		}
		s := w.newSession(t, w.svc(nil), sys())
		steps := []struct {
			name  string
			bumps bool
			write func() error
		}{
			{"agent updated", true, func() error {
				_, _, err := w.ags.Update(ctx, sys(), w.agent.ID, agents.Input{Description: ptr("changed")})
				return err
			}},
			{"environment renamed", true, func() error {
				_, _, err := w.envs.Update(ctx, sys(), w.env.ID, envs.Input{Name: ptr("renamed")})
				return err
			}},
			{"hand-written SQL on agents", true, func() error {
				return w.db.Exec("UPDATE agents SET description = 'raw' WHERE id = ?", w.agent.ID).Error
			}},
			{"health recorded", false, func() error {
				_, err := w.envs.RecordHealth(ctx, w.env.ID, envs.Health{Status: "ok", Latency: time.Millisecond})
				return err
			}},
			{"session row written", false, func() error {
				return w.db.Exec("UPDATE sessions SET reason = 'x' WHERE id = ?", s.ID).Error
			}},
			{"agent update rolled back", false, func() error {
				_ = w.db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Table("agents").Where("id = ?", w.agent.ID).Update("description", "never").Error; err != nil {
						return err
					}
					return errRollback
				})
				return nil
			}},
		}
		for _, step := range steps {
			before := configVersion(t, w.db)
			if err := step.write(); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			if after := configVersion(t, w.db); (after != before) != step.bumps {
				t.Errorf("%s: config_version %d → %d, want a change: %v", step.name, before, after, step.bumps)
			}
		}
	})
}

var errRollback = errors.New("rolled back on purpose")
