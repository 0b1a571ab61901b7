package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestStdinInputHeads: the gateway stores a keystroke in one round trip on
// Postgres once it knows the command's input head (from the exec, or from
// its own last write), two replicas writing to one command each fall back
// when the other moved the chain and then go on in one round trip, and a
// command that ended is refused (command_ended) and leaves the cache.
func TestStdinInputHeads(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		org := Org{Slug: "acme", DB: db, Audit: audit.NewLog(db, audit.OrgTable, nil)}
		c := stdinCommand(t, db)
		one, other := &Gateway{}, &Gateway{} // two replicas
		who := recordings.Typist{Type: "user", ID: "1", Name: "u", Via: "login:0a1b2c3d4e5f"}
		k := knownKey{db: db, id: c.ID}
		// As Exec does once the command is recorded: its chain is empty.
		one.inputs.store(k, c)
		type step struct {
			name     string
			g        *Gateway
			data     string
			locking  bool // the write reads the command under its lock first
			wantSeq  int64
			wantHead bool // the writer knows the head after
		}
		steps := []step{
			{"the first keystroke after the exec", one, "a", false, 2, true},
			{"the next keystroke", one, "b", false, 4, true},
			{"another replica's first keystroke", other, "c", true, 6, true},
			{"this replica after the other wrote", one, "d", true, 8, true},
			{"this replica again", one, "e", false, 10, true},
		}
		ctx, trips := store.CountTrips(context.Background())
		for _, s := range steps {
			t.Run(s.name, func(t *testing.T) {
				trips.Reset()
				got, err := s.g.appendInput(ctx, org, who, c.SessionID, c.ID, []byte(s.data), false)
				if err != nil {
					t.Fatal(err)
				}
				sent := strings.Join(trips.Sent(), "\n")
				locked := strings.Contains(sent, "FOR UPDATE") || (d == store.SQLite && strings.Contains(sent, "SELECT * FROM `commands`"))
				switch {
				case locked != s.locking:
					t.Fatalf("read the command under its lock: %v, want %v:\n%s", locked, s.locking, sent)
				case d == store.Postgres && !s.locking && trips.N() != 1:
					t.Fatalf("a keystroke took %d round trips, want 1:\n%s", trips.N(), sent)
				}
				if got.InSeq != s.wantSeq || got.AgentdID != c.AgentdID {
					t.Fatalf("after the write: %+v, want in_seq %d", got, s.wantSeq)
				}
				if h, ok := s.g.inputs.load(k); ok != s.wantHead || h != recordings.HeadOf(got) {
					t.Fatalf("cached head %+v (%v), want %+v", h, ok, recordings.HeadOf(got))
				}
			})
		}
		t.Run("an ended command is refused and forgotten", func(t *testing.T) {
			exit := 0
			if _, err := recordings.Finish(context.Background(), db, org.Audit, c.ID, "me",
				recordings.End{State: recordings.StateExited, ExitCode: &exit, At: time.Now()}, audit.Actor{Type: audit.ActorSystem, Name: "recorder"}); err != nil {
				t.Fatal(err)
			}
			_, err := one.appendInput(ctx, org, who, c.SessionID, c.ID, []byte("late"), false)
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != "command_ended" {
				t.Fatalf("stdin into an ended command = %v, want command_ended", err)
			}
			if _, ok := one.inputs.load(k); ok {
				t.Fatal("the ended command's head is still cached")
			}
			ended, err := recordings.Get(context.Background(), db, c.ID)
			if err != nil || ended.InSeq != 10 {
				t.Fatalf("ended command %+v (%v): the refused write was stored", ended, err)
			}
			v, err := recordings.Verify(context.Background(), db, c.ID, ended.OutHash, ended.InHash)
			if err != nil || !v.OK {
				t.Fatalf("Verify = %+v, %v", v, err)
			}
		})
	})
}

// stdinCommand records a running command in a new session.
func stdinCommand(t *testing.T, db *gorm.DB) recordings.Command {
	t.Helper()
	now := time.Now().UTC()
	for _, q := range []string{
		"INSERT INTO environments (name, kind, url, created_by, created_at, updated_at) VALUES ('h', 'host', 'http://h', 'x', ?, ?)",
		"INSERT INTO agents (name, description, config, sandbox_mode, default_environment_id, idle_timeout_seconds, reclaim_after_seconds, command_policy, created_by, created_at, updated_at) VALUES ('a', '', '{}', 'off', 1, 900, 3600, '[]', 'x', ?, ?)",
		"INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at) VALUES (1, 'user:1', 'x', 'off', 'running', ?, ?)",
	} {
		if err := db.Exec(q, now, now).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	lease := now.Add(time.Minute)
	c := recordings.Command{SessionID: 1, AgentdID: "gh-stdin", Command: "cat", TTY: true, ActorType: "user", ActorID: "1", ActorName: "u",
		StartedAt: now, LeaseOwner: "me", LeaseUntil: &lease, StdinContent: true}
	if err := recordings.Start(context.Background(), db, &c); err != nil {
		t.Fatal(err)
	}
	return c
}
