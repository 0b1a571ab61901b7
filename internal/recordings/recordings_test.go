package recordings_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// command inserts a running command under a session of an agent, with the
// rows it refers to.
func command(t testing.TB, db *gorm.DB, owner string) recordings.Command {
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
	c := recordings.Command{SessionID: 1, AgentdID: "gh-test", Command: "seq 1 3", ActorType: "user", ActorID: "1", ActorName: "u",
		StartedAt: now, LeaseOwner: owner, LeaseUntil: &lease, StdinContent: true}
	if err := recordings.Start(context.Background(), db, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRecordAndVerify(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		at := time.Now()
		lease := at.Add(time.Minute)
		typist := recordings.Typist{Type: "user", ID: "1", Name: "u", Via: "login:0123456789ab"}
		batch := func(from, to uint64) recordings.Output {
			var out recordings.Output
			for i := from; i <= to; i++ {
				out.Chunks = append(out.Chunks, recordings.Chunk{Seq: i, Stream: recordings.StreamStdout, At: at, Data: []byte(fmt.Sprintf("line %d\n", i))})
			}
			return out
		}
		if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", batch(1, 3), lease); err != nil {
			t.Fatal(err)
		}
		t.Run("a batch read twice is stored once", func(t *testing.T) {
			if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", batch(2, 5), lease); err != nil {
				t.Fatal(err)
			}
			got, err := recordings.Read(ctx, db, c.ID, recordings.KindOut)
			if err != nil {
				t.Fatal(err)
			}
			var all bytes.Buffer
			for i, ch := range got {
				if ch.Seq != uint64(i+1) {
					t.Fatalf("chunk %d has seq %d", i, ch.Seq)
				}
				all.Write(ch.Data)
			}
			if want := "line 1\nline 2\nline 3\nline 4\nline 5\n"; all.String() != want {
				t.Fatalf("recording %q", all.String())
			}
		})
		t.Run("another follower cannot write", func(t *testing.T) {
			if _, err := recordings.AppendOutput(ctx, db, c.ID, "other", batch(6, 6), lease); err != recordings.ErrLeaseLost {
				t.Fatalf("append by a non-owner = %v", err)
			}
		})
		t.Run("stdin is recorded, or only its size", func(t *testing.T) {
			if _, err := recordings.AppendInput(ctx, db, c.SessionID, c.ID, []byte("typed"), false, at, typist); err != nil {
				t.Fatal(err)
			}
			// The org chose to keep only sizes for this command.
			if err := db.Exec("UPDATE commands SET stdin_content = ? WHERE id = ?", false, c.ID).Error; err != nil {
				t.Fatal(err)
			}
			if _, err := recordings.AppendInput(ctx, db, c.SessionID, c.ID, []byte("secret"), true, at, typist); err != nil {
				t.Fatal(err)
			}
			if _, err := recordings.AppendInput(ctx, db, c.SessionID+1, c.ID, []byte("x"), false, at, typist); !errors.Is(err, apperr.ErrNotFound) {
				t.Errorf("stdin to a command of another session = %v", err)
			}
			in, err := recordings.Read(ctx, db, c.ID, recordings.KindIn)
			// Each write opens with its typist; the second closed stdin:
			// its end is recorded too.
			if err != nil || len(in) != 5 || in[0].Stream != recordings.StreamTypist || string(in[1].Data) != "typed" ||
				in[2].Stream != recordings.StreamTypist || len(in[3].Data) != 0 || in[4].Stream != recordings.StreamEOF {
				t.Fatalf("input %+v, %v", in, err)
			}
		})
		exit := 0
		ended, err := recordings.Finish(ctx, db, log, c.ID, "me", recordings.End{State: recordings.StateExited, ExitCode: &exit, At: time.Now()},
			audit.Actor{Type: audit.ActorSystem, Name: "recorder"})
		if err != nil {
			t.Fatal(err)
		}
		if ended.InBytes != int64(len("typed")+len("secret")) || ended.OutBytes != int64(len("line 1\n")*5) {
			t.Errorf("byte counts out %d in %d", ended.OutBytes, ended.InBytes)
		}
		t.Run("nothing is appended after the end", func(t *testing.T) {
			// A follower that lost the race to another replica recording
			// the end (as any owner: the end cleared the lease).
			for _, owner := range []string{"me", "other"} {
				if _, err := recordings.AppendOutput(ctx, db, c.ID, owner, batch(6, 7), lease); err != nil {
					t.Fatalf("append by %s after the end: %v", owner, err)
				}
			}
			got, err := recordings.Read(ctx, db, c.ID, recordings.KindOut)
			if err != nil || len(got) != 5 {
				t.Fatalf("after the end the recording has %d chunks (%v), want 5", len(got), err)
			}
		})
		t.Run("the audit log proves the recording", func(t *testing.T) {
			res, err := recordings.VerifyAll(ctx, db, log)
			if err != nil || !res.OK || res.Checked != 1 {
				t.Fatalf("VerifyAll = %+v, %v", res, err)
			}
		})
		t.Run("a changed chunk fails verification at its command", func(t *testing.T) {
			var body []byte
			if err := db.Raw("SELECT body FROM recording_frames WHERE command_id = ? AND kind = 'out' ORDER BY first_seq LIMIT 1", c.ID).Row().Scan(&body); err != nil {
				t.Fatal(err)
			}
			forged := recordings.ForgeFrame(t, body)
			if err := db.Exec("UPDATE recording_frames SET body = ? WHERE command_id = ? AND kind = 'out' AND first_seq = 1", forged, c.ID).Error; err != nil {
				t.Fatal(err)
			}
			res, err := recordings.VerifyAll(ctx, db, log)
			if err != nil {
				t.Fatal(err)
			}
			if res.OK || res.FailedCommand != c.ID || res.Problem == "" {
				t.Fatalf("VerifyAll after tampering = %+v", res)
			}
		})
	})
}
