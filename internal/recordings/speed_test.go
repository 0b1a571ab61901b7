package recordings_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// execChecks are the checks the gateway makes in an exec's commit: the
// session's state and both running-command caps (locks and count).
func execChecks(judge func(recordings.SessionState, [2]int64) error) recordings.StartChecks {
	return recordings.StartChecks{SessionID: 1, Locks: []string{"gatehouse-running-commands:user:1", "gatehouse-running-commands:agent:1"},
		CountSQL: recordings.RunningCountSQL("s.user_id IS NULL AND s.subject = ?"), CountArgs: []any{"user:1", 20, 1, 100}, Judge: judge}
}

func execEvent(id int64) audit.Event {
	return audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "u"}, Action: "command.exec",
		Target: audit.Target{Type: "command", ID: fmt.Sprint(id)}, Details: audit.Details(map[string]any{"command_id": id, "command": "true"})}
}

func newCommand(i int) *recordings.Command {
	now := time.Now().UTC()
	lease := now.Add(time.Minute)
	return &recordings.Command{SessionID: 1, AgentdID: fmt.Sprintf("gh-speed-%d", i), Command: "true", ActorType: "user", ActorID: "1",
		ActorName: "u", StartedAt: now, LeaseOwner: "me", LeaseUntil: &lease, StdinContent: true}
}

// TestExecRoundTrips proves an exec's commit (the checks, the command's
// record and its audit event) costs two round trips on Postgres and one
// short transaction on SQLite, writes nothing when refused or when its
// audit event cannot be written, and keeps the audit chain whole under
// concurrent execs.
func TestExecRoundTrips(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		first := command(t, db, "me") // the rows a command refers to, and one running command
		allow := func(s recordings.SessionState, counts [2]int64) error { return nil }

		t.Run("round trips", func(t *testing.T) {
			// Warm the connection's statement cache, as a console serving
			// execs has.
			for i := range 3 {
				if err := recordings.StartAudited(context.Background(), db, log, execChecks(allow), newCommand(100+i), execEvent); err != nil {
					t.Fatal(err)
				}
			}
			ctx, trips := store.CountTrips(context.Background())
			c := newCommand(1)
			c.ActorVia = "api_key:7"
			if err := recordings.StartAudited(ctx, db, log, execChecks(allow), c, execEvent); err != nil {
				t.Fatal(err)
			}
			sent := strings.Join(trips.Sent(), "\n")
			if d == store.Postgres && trips.N() > 2 {
				t.Fatalf("an exec's commit took %d round trips, want at most 2:\n%s", trips.N(), sent)
			}
			begins, commits := strings.Count(sent, "BEGIN"), strings.Count(sent, "COMMIT")
			if begins != 1 || commits != 1 {
				t.Fatalf("an exec's commit is not one transaction (%d BEGIN, %d COMMIT):\n%s", begins, commits, sent)
			}
			got, err := recordings.Get(context.Background(), db, c.ID)
			// Not acknowledged by agentd yet (the column's default is for
			// older rows), and with the opener's credential.
			if err != nil || got.AgentdID != "gh-speed-1" || got.State != recordings.StateRunning || got.LeaseOwner != "me" ||
				got.Acked || got.ActorVia != "api_key:7" {
				t.Fatalf("recorded %+v, %v", got, err)
			}
			evs, err := log.Query(context.Background(), audit.Filter{Action: "command.exec"}, 0, 1)
			if err != nil || len(evs) != 1 || evs[0].Target.ID != fmt.Sprint(c.ID) {
				t.Fatalf("last exec event %+v, %v", evs, err)
			}
		})

		t.Run("the checks see the session and the counts", func(t *testing.T) {
			var seen recordings.SessionState
			var counts [2]int64
			refused := apperr.New(apperr.ErrTooMany, "command_limit", "At the cap.")
			err := recordings.StartAudited(context.Background(), db, log, execChecks(func(s recordings.SessionState, n [2]int64) error {
				seen, counts = s, n
				return refused
			}), newCommand(2), execEvent)
			if !errors.Is(err, refused) {
				t.Fatalf("refused exec = %v", err)
			}
			if seen.State != "running" || seen.Closing || counts[0] < 2 || counts[0] != counts[1] {
				t.Fatalf("checks saw %+v, counts %v", seen, counts)
			}
			assertNoCommand(t, db, "gh-speed-2")
		})

		t.Run("an exec whose audit event fails writes nothing", func(t *testing.T) {
			refuse := []string{`CREATE TRIGGER refuse_exec BEFORE INSERT ON audit_events FOR EACH ROW WHEN (NEW.action = 'command.exec') BEGIN SELECT RAISE(ABORT, 'refused'); END`}
			allowAll := []string{`DROP TRIGGER refuse_exec`}
			if d == store.Postgres {
				refuse = []string{`CREATE FUNCTION refuse_exec() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$`,
					`CREATE TRIGGER refuse_exec BEFORE INSERT ON audit_events FOR EACH ROW WHEN (NEW.action = 'command.exec') EXECUTE FUNCTION refuse_exec()`}
				allowAll = []string{`DROP TRIGGER refuse_exec ON audit_events`, `DROP FUNCTION refuse_exec()`}
			}
			execAll(t, db, refuse)
			err := recordings.StartAudited(context.Background(), db, log, execChecks(allow), newCommand(3), execEvent)
			execAll(t, db, allowAll)
			if err == nil || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("exec with a failing audit insert = %v", err)
			}
			assertNoCommand(t, db, "gh-speed-3")
			// The pool is usable after the failed commit.
			if err := recordings.StartAudited(context.Background(), db, log, execChecks(allow), newCommand(4), execEvent); err != nil {
				t.Fatal(err)
			}
		})

		t.Run("concurrent execs keep one chain", func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- recordings.StartAudited(context.Background(), db, log, execChecks(allow), newCommand(200+i), execEvent)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			res, err := log.Verify(context.Background())
			if err != nil || !res.OK {
				t.Fatalf("audit verify = %+v, %v", res, err)
			}
			var n int64
			if err := db.Raw("SELECT count(*) FROM commands WHERE id <> ?", first.ID).Scan(&n).Error; err != nil || n != 3+1+1+16 {
				t.Fatalf("%d commands recorded (%v), want %d", n, err, 3+1+1+16)
			}
		})
	})
}

func execAll(t *testing.T, db *gorm.DB, stmts []string) {
	t.Helper()
	for _, s := range stmts {
		if err := db.Exec(s).Error; err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func assertNoCommand(t *testing.T, db *gorm.DB, agentdID string) {
	t.Helper()
	var n int64
	if err := db.Raw("SELECT count(*) FROM commands WHERE agentd_id = ?", agentdID).Scan(&n).Error; err != nil || n != 0 {
		t.Fatalf("%d commands %s recorded (%v), want none", n, agentdID, err)
	}
}

// TestFollowerRoundTrips proves a follower's batch is one round trip on
// Postgres (one short transaction on SQLite), a quiet batch none, and the
// lease renewal of all of a replica's commands one statement; and that
// the one-statement form still never stores a batch twice nor writes
// without the lease.
func TestFollowerRoundTrips(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		at := time.Now().UTC()
		batch := func(from, to uint64) recordings.Output {
			out := recordings.Output{NextCursor: to}
			for i := from; i <= to; i++ {
				out.Chunks = append(out.Chunks, recordings.Chunk{Seq: i, Stream: recordings.StreamStdout, At: at, Data: []byte(fmt.Sprintf("line %d\n", i))})
			}
			return out
		}
		ctx, trips := store.CountTrips(context.Background())
		var err error
		// The first batch warms the connection's statement cache.
		if c, err = recordings.AppendFollowed(context.Background(), db, c, "me", batch(1, 2)); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name  string
			out   recordings.Output
			trips int // on Postgres; SQLite: one transaction, or nothing when 0
			last  int64
		}{
			{"a batch", batch(3, 5), 1, 5},
			{"a quiet batch", recordings.Output{NextCursor: 5}, 0, 5},
			{"a batch read twice", batch(4, 7), 1, 7},
			{"a batch with a gap", recordings.Output{Chunks: batch(10, 10).Chunks, Dropped: 100, NextCursor: 10}, 1, 10},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				trips.Reset()
				next, err := recordings.AppendFollowed(ctx, db, c, "me", tc.out)
				if err != nil {
					t.Fatal(err)
				}
				sent := strings.Join(trips.Sent(), "\n")
				switch {
				case tc.trips == 0 && trips.N() != 0:
					t.Fatalf("a quiet batch wrote:\n%s", sent)
				case d == store.Postgres && trips.N() != tc.trips:
					t.Fatalf("%d round trips, want %d:\n%s", trips.N(), tc.trips, sent)
				case d == store.SQLite && tc.trips > 0 && (strings.Count(sent, "BEGIN") != 1 || strings.Count(sent, "COMMIT") != 1):
					t.Fatalf("not one transaction:\n%s", sent)
				}
				stored, err := recordings.Get(context.Background(), db, c.ID)
				if err != nil || stored.LastChunk != tc.last || stored.OutHash != next.OutHash || stored.OutBytes != next.OutBytes || !stored.Acked {
					t.Fatalf("stored %+v (%v), follower has %+v", stored, err, next)
				}
				c = next
			})
		}
		t.Run("a follower behind the row falls back and stores nothing twice", func(t *testing.T) {
			stale := c
			if c, err = recordings.AppendFollowed(ctx, db, c, "me", batch(11, 12)); err != nil {
				t.Fatal(err)
			}
			got, err := recordings.AppendFollowed(ctx, db, stale, "me", batch(11, 13))
			if err != nil || got.LastChunk != 13 {
				t.Fatalf("stale append = %+v, %v", got, err)
			}
			c = got
			chunks, err := recordings.Read(context.Background(), db, c.ID, recordings.KindOut)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i < len(chunks); i++ {
				if chunks[i].Seq <= chunks[i-1].Seq {
					t.Fatalf("chunk %d stored twice or out of order: %v", chunks[i].Seq, chunks)
				}
			}
		})
		t.Run("another follower cannot write", func(t *testing.T) {
			if _, err := recordings.AppendFollowed(ctx, db, c, "other", batch(14, 14)); !errors.Is(err, recordings.ErrLeaseLost) {
				t.Fatalf("append by a non-owner = %v", err)
			}
		})
		t.Run("one statement renews a replica's leases", func(t *testing.T) {
			ids := []int64{c.ID}
			for i := range 50 {
				n := newCommand(300 + i)
				if i%10 == 0 {
					n.LeaseOwner = "other"
				}
				if err := recordings.Start(context.Background(), db, n); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, n.ID)
			}
			until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
			trips.Reset()
			n, err := recordings.RenewLeases(ctx, db, "me", ids, until)
			if err != nil {
				t.Fatal(err)
			}
			if trips.N() != 1 {
				t.Fatalf("renewal took %d round trips:\n%s", trips.N(), strings.Join(trips.Sent(), "\n"))
			}
			if n != 46 {
				t.Fatalf("renewed %d leases, want the 46 held by this replica", n)
			}
			var renewed int64
			if err := db.Raw("SELECT count(*) FROM commands WHERE lease_until >= ? AND lease_owner = 'me'", until).Scan(&renewed).Error; err != nil || renewed != 46 {
				t.Fatalf("%d leases renewed in the database (%v)", renewed, err)
			}
		})
		t.Run("a command's end is two round trips", func(t *testing.T) {
			// Another command, so the end below finds the chain's head
			// written by others.
			if err := recordings.StartAudited(context.Background(), db, log, execChecks(func(recordings.SessionState, [2]int64) error { return nil }),
				newCommand(400), execEvent); err != nil {
				t.Fatal(err)
			}
			// Input typed meanwhile is not in the follower's copy: the end
			// event must carry the row's input chain.
			typed, err := recordings.AppendInput(context.Background(), db, c.SessionID, c.ID, []byte("q"), false, time.Now(), recordings.Typist{Type: "user", ID: "1", Name: "u"})
			if err != nil {
				t.Fatal(err)
			}
			exit := 3
			trips.Reset()
			ended, err := recordings.CompleteFollowed(ctx, db, log, c, "me", batch(14, 15),
				recordings.End{State: recordings.StateExited, ExitCode: &exit, At: time.Now()}, audit.Actor{Type: audit.ActorSystem, Name: "recorder"})
			if err != nil {
				t.Fatal(err)
			}
			sent := strings.Join(trips.Sent(), "\n")
			if d == store.Postgres && trips.N() != 2 {
				t.Fatalf("a command's end took %d round trips, want 2:\n%s", trips.N(), sent)
			}
			if strings.Count(sent, "BEGIN") != 1 || strings.Count(sent, "COMMIT") != 1 {
				t.Fatalf("a command's end is not one transaction:\n%s", sent)
			}
			stored, err := recordings.Get(context.Background(), db, c.ID)
			if err != nil || stored.State != recordings.StateExited || stored.ExitCode == nil || *stored.ExitCode != 3 || stored.LastChunk != 15 ||
				stored.LeaseOwner != "" || stored.LeaseUntil != nil || stored.InHash != typed.InHash || stored.OutHash != ended.OutHash ||
				stored.TextCursor != ended.TextCursor || stored.EndedAt == nil {
				t.Fatalf("stored %+v (%v), returned %+v", stored, err, ended)
			}
			evs, err := log.Query(context.Background(), audit.Filter{Action: "command.end"}, 0, 1)
			if err != nil || len(evs) != 1 || evs[0].Target.ID != fmt.Sprint(c.ID) {
				t.Fatalf("last end event %+v, %v", evs, err)
			}
			var det map[string]any
			if err := json.Unmarshal(evs[0].Details, &det); err != nil || det["input_hash"] != typed.InHash || det["output_hash"] != ended.OutHash ||
				det["output_chunks"] != float64(15) || det["exit_code"] != float64(3) {
				t.Fatalf("end event details %s (%v)", evs[0].Details, err)
			}
			var body string
			if err := db.Raw("SELECT body FROM recording_text WHERE command_id = ?", c.ID).Scan(&body).Error; err != nil || !strings.Contains(body, "line 15") {
				t.Fatalf("the ended command's last batch is not in its search entry: %q (%v)", body, err)
			}
			c = ended
		})
		t.Run("an end already recorded is not recorded twice", func(t *testing.T) {
			trips.Reset()
			again, err := recordings.CompleteFollowed(ctx, db, log, c, "me", recordings.Output{NextCursor: 15},
				recordings.End{State: recordings.StateKilled, At: time.Now()}, audit.Actor{Type: audit.ActorSystem, Name: "recorder"})
			if err != nil || again.State != recordings.StateExited {
				t.Fatalf("second end = %+v, %v", again, err)
			}
			var n int64
			if err := db.Raw("SELECT count(*) FROM audit_events WHERE action = 'command.end' AND target_id = ?", fmt.Sprint(c.ID)).Scan(&n).Error; err != nil || n != 1 {
				t.Fatalf("%d end events (%v)", n, err)
			}
		})
		t.Run("an end behind the row or without the lease", func(t *testing.T) {
			n := newCommand(500)
			if err := recordings.Start(context.Background(), db, n); err != nil {
				t.Fatal(err)
			}
			cur, err := recordings.AppendFollowed(context.Background(), db, *n, "me", batch(1, 2))
			if err != nil {
				t.Fatal(err)
			}
			end := recordings.End{State: recordings.StateExited, At: time.Now()}
			sys := audit.Actor{Type: audit.ActorSystem, Name: "recorder"}
			if _, err := recordings.CompleteFollowed(ctx, db, log, cur, "other", batch(3, 3), end, sys); !errors.Is(err, recordings.ErrLeaseLost) {
				t.Fatalf("end by a non-owner = %v", err)
			}
			// The follower's copy is behind the row (it stored 3 and 4
			// since): the end stores only what is new, once.
			if _, err := recordings.AppendFollowed(context.Background(), db, cur, "me", batch(3, 4)); err != nil {
				t.Fatal(err)
			}
			ended, err := recordings.CompleteFollowed(ctx, db, log, cur, "me", batch(3, 5), end, sys)
			if err != nil || ended.LastChunk != 5 || ended.State != recordings.StateExited {
				t.Fatalf("end behind the row = %+v, %v", ended, err)
			}
			chunks, err := recordings.Read(context.Background(), db, n.ID, recordings.KindOut)
			if err != nil || len(chunks) != 5 {
				t.Fatalf("recorded %d chunks (%v), want 5", len(chunks), err)
			}
		})
		t.Run("the recordings verify", func(t *testing.T) {
			res, err := recordings.VerifyAll(context.Background(), db, log)
			if err != nil || !res.OK {
				t.Fatalf("VerifyAll = %+v, %v", res, err)
			}
			if res, err := log.Verify(context.Background()); err != nil || !res.OK {
				t.Fatalf("audit verify = %+v, %v", res, err)
			}
		})
	})
}

// TestRunningCountReadsAtMostTheCaps: the caps' count counts the running
// commands of the owner's and the agent's open sessions (not ended ones,
// not those of closed sessions), each up to its cap, and on SQLite reaches
// them from the sessions rather than by scanning the org's running
// commands (the plan a 2,000-command org paid on every exec).
func TestRunningCountReadsAtMostTheCaps(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		command(t, db, "me") // session 1: user:1's, agent 1, one running command
		now := time.Now().UTC()
		for _, q := range []string{
			"INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at) VALUES (1, 'user:2', 'x', 'off', 'running', ?, ?)",
			"INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at) VALUES (1, 'user:1', 'x', 'off', 'closed', ?, ?)",
		} {
			if err := db.Exec(q, now, now).Error; err != nil {
				t.Fatal(err)
			}
		}
		start := func(session int64, n int) {
			for range n {
				c := newCommand(0)
				c.SessionID, c.AgentdID = session, fmt.Sprintf("gh-count-%d-%d", session, time.Now().UnixNano())
				if err := recordings.Start(ctx, db, c); err != nil {
					t.Fatal(err)
				}
			}
		}
		start(1, 30) // 31 running in session 1
		start(2, 2)  // 2 in user:2's session of the same agent
		start(3, 4)  // 4 left running in a closed session: they count for nobody
		if err := db.Exec("UPDATE commands SET state = ? WHERE session_id = 1 AND id = (SELECT MAX(id) FROM commands WHERE session_id = 1)", recordings.StateExited).Error; err != nil {
			t.Fatal(err)
		}
		q := recordings.RunningCountSQL("s.user_id IS NULL AND s.subject = ?")
		for _, c := range []struct {
			owner                string
			ownerCap, agentCap   int
			wantOwner, wantAgent int64
		}{
			{"user:1", 100, 100, 30, 32},
			{"user:1", 5, 10, 5, 10},
			{"user:2", 20, 0, 2, 0},
			{"user:3", 20, 100, 0, 32},
		} {
			var got [2]int64
			if err := db.Raw(q, c.owner, c.ownerCap, 1, c.agentCap).Row().Scan(&got[0], &got[1]); err != nil {
				t.Fatal(err)
			}
			if got != [2]int64{c.wantOwner, c.wantAgent} {
				t.Errorf("%s with caps %d and %d: counted %v, want [%d %d]", c.owner, c.ownerCap, c.agentCap, got, c.wantOwner, c.wantAgent)
			}
		}
		if d != store.SQLite {
			return
		}
		rows, err := db.Raw("EXPLAIN QUERY PLAN "+q, "user:1", 20, 1, 100).Rows()
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "commands_running (") || strings.Count(text, "USING INDEX commands_running_session") != 2 {
			t.Fatalf("the count's plan does not start from the sessions:\n%s", text)
		}
	})
}
