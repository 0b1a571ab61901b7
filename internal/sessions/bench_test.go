package sessions_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
)

// BenchmarkLazyCreate compares the backend's own create with a session's
// first use (claim, create, attach with its audit record), on the fake
// without processes so that only the API and bookkeeping are measured.
// The difference is what lazy creation adds.
func BenchmarkLazyCreate(b *testing.B) {
	for _, d := range []store.Dialect{store.SQLite, store.Postgres} {
		b.Run(string(d), func(b *testing.B) {
			w := newWorld(b, d, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
			ctx := context.Background()
			be, err := w.envs.Backend(w.env)
			if err != nil {
				b.Fatal(err)
			}
			b.Run("backend create", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if _, err := be.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: 300, AutoPause: true, AutoResume: true,
						Metadata: map[string]string{"bench": strconv.Itoa(i)}}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("first use", func(b *testing.B) {
				svc := w.svc(nil)
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					s := w.newSession(b, svc, sys())
					b.StartTimer()
					if _, err := svc.Ensure(ctx, sys(), s.ID); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("cached use", func(b *testing.B) {
				svc := w.svc(nil)
				s := w.newSession(b, svc, sys())
				if _, err := svc.Ensure(ctx, sys(), s.ID); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := svc.Ensure(ctx, sys(), s.ID); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkReclaimRound times one org's reclaim round over 1,000 tagged
// sandboxes (seeded: no processes) with their sessions: "steady" has
// nothing to do but judge; "100 to reclaim" also kills and closes a tenth,
// paused past the window.
func BenchmarkReclaimRound(b *testing.B) {
	for _, d := range []store.Dialect{store.SQLite, store.Postgres} {
		b.Run(string(d), func(b *testing.B) {
			w := newWorld(b, d, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
			svc := w.svc(nil)
			b.Run("steady", func(b *testing.B) {
				w.seedLive(b, 1000, 0)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					st, err := svc.Reclaim(context.Background(), nil)
					if err != nil || st.Listed < 1000 || st.Reclaimed+st.Orphans+st.Lost != 0 {
						b.Fatalf("round %+v, %v", st, err)
					}
				}
			})
			b.Run("100 to reclaim", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					w.seedLive(b, 900, 100)
					b.StartTimer()
					st, err := svc.Reclaim(context.Background(), nil)
					if err != nil || st.Reclaimed != 100 {
						b.Fatalf("round %+v, %v", st, err)
					}
				}
			})
		})
	}
}

// seedLive adds running sessions with running sandboxes, and sessions
// whose sandbox has been paused for two hours (past the one-hour window).
// Earlier seeded sessions are closed and their sandboxes killed first, so
// each call leaves exactly this population.
func (w *world) seedLive(b *testing.B, running, stale int) {
	b.Helper()
	ctx := context.Background()
	be, _ := w.envs.Backend(w.env)
	list, err := be.List(ctx, sandbox.ListFilter{Metadata: map[string]string{sessions.MetaOrg: testOrg}})
	if err != nil {
		b.Fatal(err)
	}
	for _, in := range list {
		_ = be.Kill(ctx, in.ID)
	}
	if err := w.db.Exec("UPDATE sessions SET state = 'closed' WHERE state <> 'closed'").Error; err != nil {
		b.Fatal(err)
	}
	now := w.fake.Now()
	rows := make([]map[string]any, 0, running+stale)
	for i := 0; i < running+stale; i++ {
		rows = append(rows, map[string]any{"agent_id": w.agent.ID, "subject": "system", "created_by": "bench", "environment_id": w.env.ID,
			"sandbox_mode": "per-session", "state": "running", "created_at": now, "started_at": now.Add(-3 * time.Hour), "updated_at": now})
	}
	if err := w.db.Table("sessions").CreateInBatches(rows, 200).Error; err != nil {
		b.Fatal(err)
	}
	var ids []int64
	if err := w.db.Table("sessions").Where("state = 'running' AND sandbox_id = ''").Order("id").Pluck("id", &ids).Error; err != nil {
		b.Fatal(err)
	}
	seeds := make([]e2bfake.SeedSandbox, len(ids))
	for i, id := range ids {
		seeds[i] = e2bfake.SeedSandbox{Metadata: map[string]string{sessions.MetaOrg: testOrg, sessions.MetaSession: strconv.FormatInt(id, 10)},
			Timeout: time.Hour, AutoPause: true}
		if i >= running {
			seeds[i].State, seeds[i].EndAt = sandbox.StatePaused, now.Add(-2*time.Hour)
		}
	}
	sbIDs, err := w.fake.Seed(seeds...)
	if err != nil {
		b.Fatal(err)
	}
	err = w.db.Transaction(func(tx *gorm.DB) error {
		for i, id := range ids {
			state := "running"
			if i >= running {
				state = "paused"
			}
			if err := tx.Exec("UPDATE sessions SET sandbox_id = ?, state = ? WHERE id = ?", sbIDs[i], state, id).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
