package sessions_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func listFilter(id int64) sandbox.ListFilter {
	return sandbox.ListFilter{Metadata: map[string]string{sessions.MetaOrg: testOrg, sessions.MetaSession: strconv.FormatInt(id, 10)}}
}

// reclaimOnce runs one reclaim round as a freshly started console would:
// a new runtime, nothing remembered.
func (w *world) reclaimOnce(t testing.TB) sessions.RoundStats {
	t.Helper()
	st, err := w.svc(&sessions.Runtime{Now: w.clock.Now}).Reclaim(context.Background(), nil)
	if err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	return st
}

func wantState(t testing.TB, svc *sessions.Service, id int64, want string) sessions.Session {
	t.Helper()
	s, err := svc.Get(context.Background(), sys(), id)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != want {
		t.Fatalf("session %d is %s (%s), want %s", id, s.State, s.Reason, want)
	}
	return s
}

// TestThreeStages walks a per-session sandbox through its life against
// the fake backend with real agentd processes: lazy create with the tags,
// keep-alive, pause by the backend when idle, resume on use with the
// workspace intact, reclamation by a console that restarted in between.
func TestThreeStages(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{})
		ctx := context.Background()
		svc := w.svc(nil)
		sess := w.newSession(t, svc, sys())
		var tg sessions.Target
		t.Run("pending until first use", func(t *testing.T) {
			wantState(t, svc, sess.ID, sessions.StatePending)
			if n := w.fake.Calls("POST /sandboxes"); n != 0 {
				t.Fatalf("%d creates before first use", n)
			}
		})
		t.Run("first use creates the sandbox with the tags", func(t *testing.T) {
			var err error
			if tg, err = svc.Ensure(ctx, sys(), sess.ID); err != nil {
				t.Fatal(err)
			}
			snap, ok := w.fake.Inspect(tg.Session.SandboxID)
			if !ok {
				t.Fatalf("sandbox %q not at the backend", tg.Session.SandboxID)
			}
			want := map[string]string{sessions.MetaOrg: testOrg, sessions.MetaSession: strconv.FormatInt(sess.ID, 10),
				sessions.MetaAgent: strconv.FormatInt(w.agent.ID, 10), sessions.MetaUser: "system"}
			for k, v := range want {
				if snap.Metadata[k] != v {
					t.Errorf("metadata %s = %q, want %q", k, snap.Metadata[k], v)
				}
			}
			b, _ := w.envs.Backend(w.env)
			info, err := b.Get(ctx, tg.Session.SandboxID)
			if err != nil {
				t.Fatal(err)
			}
			if info.Lifecycle == nil || info.Lifecycle.OnTimeout != sandbox.OnTimeoutPause || !info.Lifecycle.AutoResume {
				t.Errorf("lifecycle = %+v, want pause on timeout with auto-resume", info.Lifecycle)
			}
			if got := info.EndAt.Sub(w.fake.Now()); got < 4*time.Minute || got > 5*time.Minute {
				t.Errorf("timeout ends in %s, want the agent's idle timeout (5m)", got)
			}
			if tg.Session.State != sessions.StateRunning || tg.AgentdToken == "" || tg.AgentdURL == "" {
				t.Errorf("target = %+v", tg)
			}
			run(t, tg, "echo kept > note.txt")
		})
		t.Run("a cached use costs no backend call", func(t *testing.T) {
			before := w.fake.Calls("POST /sandboxes/{sandboxID}/connect")
			for i := 0; i < 20; i++ {
				if _, err := svc.Ensure(ctx, sys(), sess.ID); err != nil {
					t.Fatal(err)
				}
			}
			if n := w.fake.Calls("POST /sandboxes/{sandboxID}/connect") - before; n != 0 {
				t.Errorf("%d connects for cached uses", n)
			}
		})
		t.Run("use refreshes the backend timeout", func(t *testing.T) {
			w.fake.Advance(4 * time.Minute)
			// A read in between (an output poll) caches what it read;
			// use must still ask the backend.
			if _, err := svc.Locate(ctx, sys(), sess.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.Ensure(ctx, sys(), sess.ID); err != nil {
				t.Fatal(err)
			}
			snap, _ := w.fake.Inspect(tg.Session.SandboxID)
			if snap.State != sandbox.StateRunning || snap.EndAt.Sub(w.fake.Now()) < 4*time.Minute {
				t.Errorf("after use: %s, ends in %s", snap.State, snap.EndAt.Sub(w.fake.Now()))
			}
		})
		t.Run("idle: the backend pauses it and the reclaimer records it", func(t *testing.T) {
			w.fake.Advance(6 * time.Minute)
			snap, _ := w.fake.Inspect(tg.Session.SandboxID)
			if snap.State != sandbox.StatePaused {
				t.Fatalf("backend state %s, want paused", snap.State)
			}
			if st := w.reclaimOnce(t); st.Synced != 1 || st.Reclaimed != 0 {
				t.Errorf("round = %+v", st)
			}
			wantState(t, svc, sess.ID, sessions.StatePaused)
		})
		t.Run("next use resumes it with the workspace intact", func(t *testing.T) {
			tg2, err := svc.Ensure(ctx, sys(), sess.ID)
			if err != nil {
				t.Fatal(err)
			}
			if tg2.Session.SandboxID != tg.Session.SandboxID || tg2.Session.State != sessions.StateRunning {
				t.Fatalf("after resume: %+v", tg2.Session)
			}
			if got := run(t, tg2, "cat note.txt"); strings.TrimSpace(got) != "kept" {
				t.Errorf("note.txt = %q", got)
			}
		})
		t.Run("paused past the window after a restart: reclaimed", func(t *testing.T) {
			if _, err := svc.Pause(ctx, sys(), sess.ID); err != nil {
				t.Fatal(err)
			}
			w.fake.Advance(30 * time.Minute)
			if st := w.reclaimOnce(t); st.Reclaimed != 0 {
				t.Fatalf("reclaimed inside the window: %+v", st)
			}
			w.fake.Advance(31 * time.Minute)
			if st := w.reclaimOnce(t); st.Reclaimed != 1 {
				t.Fatalf("round = %+v, want one reclaimed", st)
			}
			if _, ok := w.fake.Inspect(tg.Session.SandboxID); ok {
				t.Errorf("sandbox still exists")
			}
			s := wantState(t, svc, sess.ID, sessions.StateClosed)
			if !strings.Contains(s.Reason, "reclaim") {
				t.Errorf("reason %q", s.Reason)
			}
		})
		t.Run("every transition is audited", func(t *testing.T) {
			got := strings.Join(w.auditActions(t, sess.ID), ",")
			want := "session.start,session.pause,session.resume,session.pause,session.reclaim"
			if got != want {
				t.Errorf("audit = %s, want %s", got, want)
			}
		})
		t.Run("a closed session cannot be used", func(t *testing.T) {
			_, err := svc.Ensure(ctx, sys(), sess.ID)
			if !errors.Is(err, apperr.ErrConflict) {
				t.Errorf("Ensure on closed = %v", err)
			}
		})
	})
}

// TestPauseResumeClose drives the explicit transitions.
func TestPauseResumeClose(t *testing.T) {
	t.Parallel()
	w := newWorld(t, store.SQLite, e2bfake.Config{})
	ctx := context.Background()
	svc := w.svc(nil)
	sess := w.newSession(t, svc, sys())
	steps := []struct {
		name string
		do   func() (sessions.Session, error)
		want string
		// backend is the fake's state afterwards ("" gone).
		backend sandbox.State
	}{
		{"pause before start is a conflict", func() (sessions.Session, error) { return svc.Pause(ctx, sys(), sess.ID) }, "conflict", ""},
		{"start", func() (sessions.Session, error) { return svc.Start(ctx, sys(), sess.ID) }, sessions.StateRunning, sandbox.StateRunning},
		{"pause", func() (sessions.Session, error) { return svc.Pause(ctx, sys(), sess.ID) }, sessions.StatePaused, sandbox.StatePaused},
		{"pause again is a conflict", func() (sessions.Session, error) { return svc.Pause(ctx, sys(), sess.ID) }, "conflict", sandbox.StatePaused},
		{"resume", func() (sessions.Session, error) { return svc.Resume(ctx, sys(), sess.ID) }, sessions.StateRunning, sandbox.StateRunning},
		{"close", func() (sessions.Session, error) { return svc.Close(ctx, sys(), sess.ID) }, sessions.StateClosed, ""},
		{"close again is a no-op", func() (sessions.Session, error) { return svc.Close(ctx, sys(), sess.ID) }, sessions.StateClosed, ""},
	}
	var sandboxID string
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			got, err := st.do()
			if st.want == "conflict" {
				if !errors.Is(err, apperr.ErrConflict) {
					t.Fatalf("err = %v, want a conflict", err)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if got.State != st.want {
				t.Fatalf("state %s, want %s", got.State, st.want)
			}
			if got.SandboxID != "" {
				sandboxID = got.SandboxID
			}
			if sandboxID == "" {
				return
			}
			snap, ok := w.fake.Inspect(sandboxID)
			if st.backend == "" && ok {
				t.Errorf("sandbox still exists (%s)", snap.State)
			} else if st.backend != "" && snap.State != st.backend {
				t.Errorf("backend state %s, want %s", snap.State, st.backend)
			}
		})
	}
}

// TestExactlyOneSandbox: fifty concurrent first uses of one session,
// spread over two console instances (two services over two separate
// connection pools and runtimes on the same Postgres database), create
// exactly one sandbox.
func TestExactlyOneSandbox(t *testing.T) {
	t.Parallel()
	dsn := storetest.DSN(t, store.Postgres)
	open := func() *gorm.DB {
		db, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close(db) })
		return db
	}
	db1, db2 := open(), open()
	if _, err := store.Migrate(context.Background(), db1, store.OrgSet); err != nil {
		t.Fatal(err)
	}
	// Creates take a while, as at a real backend, so the race is real.
	w := newWorldOn(t, db1, newBox(t), e2bfake.Config{})
	w.fake.InjectFault(e2bfake.Fault{Route: "POST /sandboxes", Delay: 200 * time.Millisecond})
	consoles := []*sessions.Service{w.svcOn(db1, &sessions.Runtime{Now: w.clock.Now}), w.svcOn(db2, &sessions.Runtime{Now: w.clock.Now})}
	sess := w.newSession(t, consoles[0], sys())
	errs := make(chan error, 50)
	ids := make(chan string, 50)
	for i := 0; i < 50; i++ {
		go func(svc *sessions.Service) {
			tg, err := svc.Ensure(context.Background(), sys(), sess.ID)
			errs <- err
			ids <- tg.Session.SandboxID
		}(consoles[i%2])
	}
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		if err := <-errs; err != nil {
			t.Errorf("Ensure: %v", err)
		}
		seen[<-ids] = true
	}
	if n := w.fake.Calls("POST /sandboxes"); n != 1 {
		t.Errorf("%d creates at the backend, want 1", n)
	}
	if got := w.tagged(t, sess.ID); len(got) != 1 || len(seen) != 1 || !seen[got[0]] {
		t.Errorf("tagged sandboxes %v, sandboxes handed out %v", got, seen)
	}
}

// TestBackendFaults: a failing backend gives the caller a clear error and
// leaves no orphan sandbox and no half-written session; a create whose
// answer was lost is found by its tag instead of repeated.
func TestBackendFaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		fault e2bfake.Fault
		// created: the create happened (its answer was spoiled).
		created bool
		timeout time.Duration
		msg     string
	}{
		{"500", e2bfake.Fault{Route: "POST /sandboxes", Status: 500}, false, 0, "create the session's sandbox"},
		{"503 with Retry-After", e2bfake.Fault{Route: "POST /sandboxes", Status: 503, RetryAfter: time.Second}, false, 0, "create the session's sandbox"},
		{"400", e2bfake.Fault{Route: "POST /sandboxes", Status: 400}, false, 0, "create the session's sandbox"},
		{"malformed answer after the create", e2bfake.Fault{Route: "POST /sandboxes", Body: "{not json", AfterHandler: true}, true, 0, ""},
		{"502 after the create", e2bfake.Fault{Route: "POST /sandboxes", Status: 502, AfterHandler: true}, true, 0, ""},
		{"answer never arrives after the create", e2bfake.Fault{Route: "POST /sandboxes", Hang: true, AfterHandler: true}, true, 2 * time.Second, ""},
		{"backend hangs", e2bfake.Fault{Route: "POST /sandboxes", Hang: true}, false, 2 * time.Second, "create the session's sandbox"},
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				svc := w.svc(&sessions.Runtime{Now: w.clock.Now})
				sess := w.newSession(t, svc, sys())
				remove := w.fake.InjectFault(tc.fault)
				ctx := context.Background()
				if tc.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
					defer cancel()
				}
				_, err := svc.Ensure(ctx, sys(), sess.ID)
				remove()
				tagged := w.tagged(t, sess.ID)
				cur, gerr := svc.Get(context.Background(), sys(), sess.ID)
				if gerr != nil {
					t.Fatal(gerr)
				}
				if !tc.created {
					if err == nil || !strings.Contains(err.Error(), tc.msg) {
						t.Fatalf("err = %v, want it to say %q", err, tc.msg)
					}
					if len(tagged) != 0 {
						t.Errorf("orphan sandboxes %v", tagged)
					}
					if cur.State != sessions.StatePending || cur.SandboxID != "" || cur.CreateToken != "" {
						t.Errorf("session half-written: %+v", cur)
					}
				} else if len(tagged) != 1 {
					t.Fatalf("tagged sandboxes %v, want exactly the one created", tagged)
				}
				// The next use works and creates nothing more.
				creates := w.fake.Calls("POST /sandboxes")
				tg, err := svc.Ensure(context.Background(), sys(), sess.ID)
				if err != nil {
					t.Fatalf("retry: %v", err)
				}
				after := w.tagged(t, sess.ID)
				if len(after) != 1 || after[0] != tg.Session.SandboxID {
					t.Errorf("after retry: tagged %v, session's %q", after, tg.Session.SandboxID)
				}
				if tc.created && w.fake.Calls("POST /sandboxes") != creates {
					t.Errorf("the lost create was repeated instead of found")
				}
			})
		}
	})
}

// TestReclaimReconciles: tagged sandboxes of unknown or closed sessions are
// killed, sessions whose sandbox vanished become lost, a sandbox being
// created is left alone, and a failing list judges nothing.
func TestReclaimReconciles(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
		ctx := context.Background()
		svc := w.svc(nil)
		b, _ := w.envs.Backend(w.env)
		orphan, err := w.fake.Seed(e2bfake.SeedSandbox{Metadata: map[string]string{sessions.MetaOrg: testOrg, sessions.MetaSession: "999999"}, Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		foreign, _ := w.fake.Seed(e2bfake.SeedSandbox{Metadata: map[string]string{sessions.MetaOrg: "globex", sessions.MetaSession: "1"}, Timeout: time.Hour})
		vanish := w.newSession(t, svc, sys())
		tgV, err := svc.Ensure(ctx, sys(), vanish.ID)
		if err != nil {
			t.Fatal(err)
		}
		closed := w.newSession(t, svc, sys())
		tgC, err := svc.Ensure(ctx, sys(), closed.ID)
		if err != nil {
			t.Fatal(err)
		}
		// Closed while the backend refused the kill: its sandbox is left.
		remove := w.fake.InjectFault(e2bfake.Fault{Route: "DELETE /sandboxes/{sandboxID}", Status: 500})
		if _, err := svc.Close(ctx, sys(), closed.ID); err != nil {
			t.Fatal(err)
		}
		remove()
		if err := b.Kill(ctx, tgV.Session.SandboxID); err != nil {
			t.Fatal(err)
		}
		w.fake.Advance(time.Second)
		t.Run("a failing list judges nothing", func(t *testing.T) {
			remove := w.fake.InjectFault(e2bfake.Fault{Route: "GET /v2/sandboxes", Status: 503})
			st := w.reclaimOnce(t)
			remove()
			if st.Skipped != 1 || st.Lost+st.Orphans != 0 {
				t.Errorf("round = %+v", st)
			}
			wantState(t, svc, vanish.ID, sessions.StateRunning)
		})
		t.Run("orphans killed, vanished sandbox makes the session lost", func(t *testing.T) {
			st := w.reclaimOnce(t)
			if st.Orphans != 2 || st.Lost != 1 {
				t.Errorf("round = %+v, want 2 orphans, 1 lost", st)
			}
			for _, id := range []string{orphan[0], tgC.Session.SandboxID} {
				if _, ok := w.fake.Inspect(id); ok {
					t.Errorf("orphan %s survived", id)
				}
			}
			if _, ok := w.fake.Inspect(foreign[0]); !ok {
				t.Errorf("another org's sandbox was killed")
			}
			wantState(t, svc, vanish.ID, sessions.StateLost)
		})
		t.Run("a second round finds nothing to do", func(t *testing.T) {
			if st := w.reclaimOnce(t); st.Orphans+st.Lost+st.Reclaimed+st.Synced != 0 {
				t.Errorf("round = %+v", st)
			}
		})
		t.Run("a sandbox being created is left alone", func(t *testing.T) {
			s := w.newSession(t, svc, sys())
			if _, err := w.fake.Seed(e2bfake.SeedSandbox{Metadata: map[string]string{sessions.MetaOrg: testOrg,
				sessions.MetaSession: strconv.FormatInt(s.ID, 10)}, Timeout: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if st := w.reclaimOnce(t); st.Orphans != 0 {
				t.Errorf("round = %+v", st)
			}
		})
	})
}

// TestReclaimerLoop drives the loop with a tick the test owns, on an org
// whose database the loop opens itself.
func TestReclaimerLoop(t *testing.T) {
	t.Parallel()
	w := newWorld(t, store.Postgres, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	if _, err := w.fake.Seed(e2bfake.SeedSandbox{Metadata: map[string]string{sessions.MetaOrg: testOrg, sessions.MetaSession: "42"}, Timeout: time.Hour}); err != nil {
		t.Fatal(err)
	}
	tick := make(chan time.Time)
	stats := make(chan sessions.RoundStats)
	r := &sessions.Reclaimer{
		ListOrgs: func(context.Context) ([]string, error) { return []string{testOrg}, nil },
		OpenOrg: func(context.Context, string) (sessions.OrgDeps, error) {
			return sessions.OrgDeps{Sessions: w.svc(nil), Release: func() {}}, nil
		},
		Tick: tick, Stats: stats,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	if st := <-stats; st.Orgs != 1 || st.Orphans != 1 {
		t.Errorf("first round = %+v", st)
	}
	tick <- time.Now()
	if st := <-stats; st.Orgs != 1 || st.Orphans != 0 {
		t.Errorf("second round = %+v", st)
	}
	t.Run("another replica holding the org's lock skips it", func(t *testing.T) {
		unlock, ok, err := store.TryAdvisoryLock(ctx, w.db, sessionsLockKey(testOrg))
		if err != nil || !ok {
			t.Fatalf("lock: %v %v", ok, err)
		}
		tick <- time.Now()
		if st := <-stats; st.Orgs != 0 || st.Skipped != 1 {
			t.Errorf("round while locked = %+v", st)
		}
		unlock()
	})
	cancel()
	<-done
}

func sessionsLockKey(slug string) int64 { return store.LockKey("gatehouse-reclaim:" + slug) }

// TestLostAfterUnreachable: a session is lost only when its agentd failed
// every call for the unreachable window, however many calls failed
// meanwhile (a blip with quick retries, many commands followed at once);
// an answer in between starts the window over, and a sandbox the backend
// says is gone makes the session lost at once.
func TestLostAfterUnreachable(t *testing.T) {
	t.Parallel()
	const window = 30 * time.Second
	cause := errors.New("dial tcp: connection refused")
	for _, tc := range []struct {
		name string
		// steps: "fail" reports a failure, "ok" an answer, "+10s" moves the
		// clock, "gone" kills the sandbox at the backend.
		steps    []string
		wantLost bool
	}{
		{"a hundred quick failures inside the window", append(repeat("fail", 100), "+10s", "fail", "+10s", "fail"), false},
		{"failures across the window", []string{"fail", "+10s", "fail", "+10s", "fail", "+10s", "fail"}, true},
		{"an answer starts the window over", []string{"fail", "+10s", "+10s", "ok", "+10s", "fail", "+10s", "fail", "+10s", "fail"}, false},
		{"the backend says the sandbox is gone", []string{"gone", "fail"}, true},
		{"isolated failures far apart", []string{"fail", "+10s", "+10s", "+10s", "+10s", "fail", "+10s", "+10s", "+10s", "+10s", "fail"}, false},
		{"an answer on another replica clears a failure", []string{"warm-elsewhere", "fail", "+10s", "fail", "ok-elsewhere", "+10s", "fail", "+10s", "fail"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, store.SQLite, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
			ctx := context.Background()
			svc := w.svc(&sessions.Runtime{Now: w.clock.Now, UnreachableWindow: window})
			sess := w.newSession(t, svc, sys())
			tg, err := svc.Ensure(ctx, sys(), sess.ID)
			if err != nil {
				t.Fatal(err)
			}
			other := w.svc(&sessions.Runtime{Now: w.clock.Now, UnreachableWindow: window})
			lost := false
			for i, step := range tc.steps {
				if lost {
					t.Fatalf("step %d (%s): the session was lost already", i, step)
				}
				switch step {
				case "fail":
					if lost, err = svc.ReportUnreachable(ctx, sess.ID, cause); err != nil {
						t.Fatal(err)
					}
				case "ok":
					if err := svc.ReportReachable(ctx, sess.ID); err != nil {
						t.Fatal(err)
					}
				case "warm-elsewhere":
					// Another replica caches the session as it is before
					// the failures.
					if _, err := other.Locate(ctx, sys(), sess.ID); err != nil {
						t.Fatal(err)
					}
				case "ok-elsewhere":
					if err := other.ReportReachable(ctx, sess.ID); err != nil {
						t.Fatal(err)
					}
				case "+10s":
					w.fake.Advance(10 * time.Second)
				case "gone":
					b, err := w.envs.Backend(w.env)
					if err != nil {
						t.Fatal(err)
					}
					if err := b.Kill(ctx, tg.Session.SandboxID); err != nil {
						t.Fatal(err)
					}
				}
			}
			if lost != tc.wantLost {
				t.Fatalf("lost = %v, want %v", lost, tc.wantLost)
			}
			if !tc.wantLost {
				wantState(t, svc, sess.ID, sessions.StateRunning)
				return
			}
			s := wantState(t, svc, sess.ID, sessions.StateLost)
			if !strings.Contains(s.Reason, "refused the connection") && !strings.Contains(s.Reason, "connection refused") {
				t.Errorf("reason %q does not say how agentd failed", s.Reason)
			}
			if len(w.tagged(t, sess.ID)) != 0 {
				t.Errorf("the lost session's sandbox was left behind")
			}
		})
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestHostSessions: with sandbox mode off a session is a workspace
// directory under the host environment's root, created on first use.
func TestHostSessions(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
		ctx := context.Background()
		root := t.TempDir()
		url, token := agentdtest.Start(t, agentdtest.WithRoot(root))
		host, err := w.envs.Create(ctx, sys(), envs.Input{Name: ptr("build-01"), Kind: envs.KindHost, URL: ptr(url), OS: ptr("linux"),
			Deployment: ptr("bare-metal"), WorkspaceRoot: ptr(root), AgentdToken: ptr(token), DepartmentID: &w.dept})
		if err != nil {
			t.Fatal(err)
		}
		ag, err := w.ags.Create(ctx, sys(), agents.Input{DepartmentID: &w.dept, Name: ptr("host-coder"), Config: ptr(`{"model":"m"}`),
			EnvironmentIDs: []int64{host.ID}})
		if err != nil {
			t.Fatal(err)
		}
		svc := w.svc(nil)
		// Agents allowed both environments, so that the refusal comes from
		// the environment's kind, not from the agent's list.
		t.Run("a sandbox environment is refused", func(t *testing.T) {
			both, err := w.ags.Create(ctx, sys(), agents.Input{DepartmentID: &w.dept, Name: ptr("host-coder-both"), Config: ptr(`{"model":"m"}`),
				EnvironmentIDs: []int64{host.ID, w.env.ID}, DefaultEnvironmentID: &host.ID})
			if err != nil {
				t.Fatal(err)
			}
			_, err = svc.Create(ctx, sys(), sessions.CreateInput{AgentID: both.ID, EnvironmentID: &w.env.ID})
			wantFieldError(t, err, "environment_id", "runs sessions directly on a host")
		})
		t.Run("a host environment is refused for per-session sandboxes", func(t *testing.T) {
			both, err := w.ags.Create(ctx, sys(), agents.Input{DepartmentID: &w.dept, Name: ptr("sandbox-coder-both"), Config: ptr(`{"model":"m"}`),
				SandboxMode: ptr(agents.SandboxPerSession), TemplateID: w.agent.TemplateID,
				EnvironmentIDs: []int64{w.env.ID, host.ID}, DefaultEnvironmentID: &w.env.ID})
			if err != nil {
				t.Fatal(err)
			}
			_, err = svc.Create(ctx, sys(), sessions.CreateInput{AgentID: both.ID, EnvironmentID: &host.ID})
			wantFieldError(t, err, "environment_id", "choose a sandbox environment, not host")
		})
		sess, err := svc.Create(ctx, sys(), sessions.CreateInput{AgentID: ag.ID})
		if err != nil {
			t.Fatal(err)
		}
		tg, err := svc.Ensure(ctx, sys(), sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := root + "/gatehouse-sessions/" + strconv.FormatInt(sess.ID, 10)
		if tg.Workspace != want || tg.AgentdURL != url || tg.Session.State != sessions.StateRunning {
			t.Fatalf("target = %+v", tg)
		}
		if got := strings.TrimSpace(run(t, tg, "pwd")); got != want {
			t.Errorf("pwd = %q, want %q", got, want)
		}
		if _, err := svc.Pause(ctx, sys(), sess.ID); !errors.Is(err, apperr.ErrConflict) {
			t.Errorf("pause on a host = %v", err)
		}

		t.Run("first uses racing on several replicas all get the started session", func(t *testing.T) {
			for round := range 5 {
				raced, err := svc.Create(ctx, sys(), sessions.CreateInput{AgentID: ag.ID})
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				errs := make([]error, 6)
				for i := range errs {
					replica := w.svc(&sessions.Runtime{Now: w.clock.Now}) // a gate of its own
					wg.Add(1)
					go func() {
						defer wg.Done()
						_, errs[i] = replica.Ensure(ctx, sys(), raced.ID)
					}()
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("round %d, use %d: %v (want every racing first use to proceed once the session started)", round, i, err)
					}
				}
			}
		})
	})
}

// wantFieldError requires err to be a validation error whose field holds a
// message containing want.
func wantFieldError(t *testing.T, err error, field, want string) {
	t.Helper()
	var v *apperr.ValidationError
	if !errors.Is(err, apperr.ErrInvalid) || !errors.As(err, &v) {
		t.Fatalf("err = %v, want a validation error", err)
	}
	if got := v.Fields[field]; !strings.Contains(got, want) {
		t.Errorf("%s: %q, want it to say %q (all: %v)", field, got, want, v.Fields)
	}
}

// TestLifecycleRaces: pauses, resumes and uses of one sandbox session
// issued together (on two replicas, on Postgres) are serialized: each
// answers what happened (done, a conflict naming the state it found, or
// the backend's own failure as backend_error: the fake's freeze fails now
// and then on a process in uninterruptible sleep), the console's state
// ends equal to the backend's, and the session is usable afterwards
// (never left running at the console with its sandbox frozen).
func TestLifecycleRaces(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		var logs bytes.Buffer
		w := newWorld(t, d, e2bfake.Config{Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))})
		ctx := context.Background()
		replicas := []*sessions.Service{w.svc(nil), w.svc(&sessions.Runtime{Now: w.clock.Now})}
		if d == store.SQLite {
			// Single-node: one process, one runtime.
			replicas[1] = replicas[0]
		}
		defer func() {
			if t.Failed() {
				t.Logf("fake backend log:\n%s", logs.String())
			}
		}()
		sess := w.newSession(t, replicas[0], sys())
		if _, err := replicas[0].Ensure(ctx, sys(), sess.ID); err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			var wg sync.WaitGroup
			errs := make(chan error, 18)
			for i := range 18 {
				svc := replicas[i%2]
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					switch i % 3 {
					case 0:
						_, err = svc.Pause(ctx, sys(), sess.ID)
					case 1:
						_, err = svc.Resume(ctx, sys(), sess.ID)
					default:
						var tg sessions.Target
						if tg, err = svc.Ensure(ctx, sys(), sess.ID); err == nil {
							_, err = agentdOf(tg).Run(ctx, agentd.CreateSessionRequest{Command: "echo ok", Cwd: tg.Workspace, WaitMS: 10_000})
							if agentd.Unanswered(err) {
								// A pause began after the use was served: the
								// frozen agentd does not answer, which the
								// gateway reports as 502 environment_unreachable
								// (docs/sessions.md). What counts is that the
								// session is usable after the round.
								err = nil
							}
						}
					}
					var ae *apperr.Error
					if err != nil && !(errors.As(err, &ae) && (ae.Code == "session_not_running" || ae.Code == "session_not_paused" || ae.Code == "backend_error")) {
						errs <- fmt.Errorf("round %d, request %d: %w", round, i, err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			cur, err := replicas[0].Get(ctx, sys(), sess.ID)
			if err != nil {
				t.Fatal(err)
			}
			snap, _ := w.fake.Inspect(cur.SandboxID)
			if string(snap.State) != map[string]string{sessions.StateRunning: "running", sessions.StatePaused: "paused"}[cur.State] {
				t.Errorf("round %d: the console says %s, the backend %s", round, cur.State, snap.State)
			}
			tg, err := replicas[1].Ensure(ctx, sys(), sess.ID)
			if err != nil {
				t.Fatalf("round %d: use after the races: %v", round, err)
			}
			if got := run(t, tg, "echo usable"); got != "usable\n" {
				t.Fatalf("round %d: %q", round, got)
			}
		}
	})
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestLifecycleLocksLeaveThePoolUsable: first uses of more sandbox
// sessions at once than the org's pool has connections all finish. Each
// holds a connection for its lock across replicas and needs another for
// the session: without a bound on the locks held at once they would take
// every connection and wait for each other.
func TestLifecycleLocksLeaveThePoolUsable(t *testing.T) {
	t.Parallel()
	dsn := storetest.DSN(t, store.Postgres)
	db, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 6})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	if _, err := store.Migrate(context.Background(), db, store.OrgSet); err != nil {
		t.Fatal(err)
	}
	w := newWorldOn(t, db, newBox(t), e2bfake.Config{})
	svc := w.svc(nil)
	ids := make([]int64, 8)
	for i := range ids {
		ids[i] = w.newSession(t, svc, sys()).ID
	}
	// A deadlock ends here rather than at the test binary's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(ids))
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := svc.Ensure(ctx, sys(), id); err != nil {
				errs <- fmt.Errorf("session %d: %w", id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
