package recordings_test

import (
	"context"
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

// TestStdinRoundTrips proves a keystroke into a command whose input head
// the writer knows is one round trip on Postgres (one short transaction on
// SQLite, no read of the command), that a stale head falls back to the
// locking path and never stores a frame twice or out of chain order, that
// an ended command and another session's command are refused as the
// locking path refuses them with nothing stored, and that the recording
// still verifies against its end event with every frame's typist intact.
func TestStdinRoundTrips(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		mia := recordings.Typist{Type: "user", ID: "3", Name: "mia@acme.test", Via: "login:0a1b2c3d4e5f"}
		bot := recordings.Typist{Type: "api_key", ID: "7", Name: "ci (gh_ab12)", Via: "api_key:7"}
		ctx, trips := store.CountTrips(context.Background())
		at := time.Now().UTC()
		// The first write warms the connection's statement cache, as a
		// console serving keystrokes has.
		head := recordings.HeadOf(c)
		stored, err := recordings.AppendInputAfter(context.Background(), db, head, c.SessionID, c.ID, []byte("a"), false, at, mia)
		if err != nil {
			t.Fatal(err)
		}
		head = recordings.HeadOf(stored)
		wantIn := int64(1)
		if stored.Acked {
			t.Fatal("a command agentd never answered for came back acknowledged")
		}
		// agentd answered from here on: the gateway tells an "unknown"
		// from agentd apart by it (ended lost, not "not started yet").
		if err := db.Exec("UPDATE commands SET agentd_acked = ? WHERE id = ?", true, c.ID).Error; err != nil {
			t.Fatal(err)
		}

		cases := []struct {
			name   string
			typist recordings.Typist
			data   string
			eof    bool
		}{
			{"a keystroke", mia, "b", false},
			{"a paste", mia, strings.Repeat("paste ", 100), false},
			{"another typist", bot, "ls\r", false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				trips.Reset()
				got, err := recordings.AppendInputAfter(ctx, db, head, c.SessionID, c.ID, []byte(tc.data), tc.eof, at, tc.typist)
				if err != nil {
					t.Fatal(err)
				}
				sent := strings.Join(trips.Sent(), "\n")
				switch {
				case d == store.Postgres && trips.N() != 1:
					t.Fatalf("a keystroke took %d round trips, want 1:\n%s", trips.N(), sent)
				case d == store.SQLite && (strings.Count(sent, "BEGIN") != 1 || strings.Count(sent, "COMMIT") != 1 || strings.Contains(sent, "SELECT")):
					t.Fatalf("a keystroke is not one short transaction without a read:\n%s", sent)
				}
				wantIn += int64(len(tc.data))
				if got.InSeq != head.Seq+2 || got.InBytes != wantIn || got.AgentdID != c.AgentdID || got.SessionID != c.SessionID {
					t.Fatalf("returned %+v after head %+v", got, head)
				}
				row, err := recordings.Get(context.Background(), db, c.ID)
				if err != nil || recordings.HeadOf(row) != recordings.HeadOf(got) || row.InBytes != wantIn {
					t.Fatalf("stored %+v (%v), returned %+v", row, err, got)
				}
				// Every field the gateway goes on with is the row's.
				if got.ID != row.ID || got.State != row.State || got.Acked != row.Acked || !got.Acked {
					t.Fatalf("returned %+v, stored %+v", got, row)
				}
				head = recordings.HeadOf(got)
			})
		}

		t.Run("a stale head falls back and stores nothing twice", func(t *testing.T) {
			stale := head
			// Another replica (or a racing write here) moves the chain on.
			got, err := recordings.AppendInput(ctx, db, c.SessionID, c.ID, []byte("x"), false, at, bot)
			if err != nil {
				t.Fatal(err)
			}
			trips.Reset()
			got, err = recordings.AppendInputAfter(ctx, db, stale, c.SessionID, c.ID, []byte("y"), false, at, mia)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(trips.Sent(), "\n"), "FOR UPDATE") && d == store.Postgres {
				t.Fatalf("a stale head did not take the locking path:\n%s", strings.Join(trips.Sent(), "\n"))
			}
			wantIn += 2
			if got.InSeq != stale.Seq+4 || got.InBytes != wantIn {
				t.Fatalf("after a stale head: %+v, want in_seq %d", got, stale.Seq+4)
			}
			head = recordings.HeadOf(got)
			assertInputChain(t, db, c.ID, head.Seq)
		})

		t.Run("concurrent writers with one head keep one chain", func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := recordings.AppendInputAfter(context.Background(), db, head, c.SessionID, c.ID, []byte{byte('0' + i)}, false, at, mia)
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			row, err := recordings.Get(context.Background(), db, c.ID)
			if err != nil || row.InSeq != head.Seq+16 || row.InBytes != wantIn+8 {
				t.Fatalf("after 8 concurrent writes from in_seq %d: %+v (%v)", head.Seq, row, err)
			}
			wantIn += 8
			head = recordings.HeadOf(row)
			assertInputChain(t, db, c.ID, head.Seq)
		})

		t.Run("another session's command is not found", func(t *testing.T) {
			_, err := recordings.AppendInputAfter(ctx, db, head, c.SessionID+1, c.ID, []byte("z"), false, at, mia)
			if !errors.Is(err, apperr.ErrNotFound) {
				t.Fatalf("stdin into another session's command = %v", err)
			}
			assertInputChain(t, db, c.ID, head.Seq)
		})

		t.Run("closing stdin", func(t *testing.T) {
			got, err := recordings.AppendInputAfter(ctx, db, head, c.SessionID, c.ID, nil, true, at, mia)
			if err != nil || got.InSeq != head.Seq+2 {
				t.Fatalf("eof = %+v, %v", got, err)
			}
			head = recordings.HeadOf(got)
			chunks, err := recordings.Read(context.Background(), db, c.ID, recordings.KindIn)
			if err != nil || chunks[len(chunks)-1].Stream != recordings.StreamEOF {
				t.Fatalf("input ends %+v (%v), want eof", chunks[len(chunks)-1:], err)
			}
		})

		var ended recordings.Command
		t.Run("an ended command is refused", func(t *testing.T) {
			exit := 0
			if ended, err = recordings.Finish(context.Background(), db, log, c.ID, "me",
				recordings.End{State: recordings.StateExited, ExitCode: &exit, At: time.Now()}, audit.Actor{Type: audit.ActorSystem, Name: "recorder"}); err != nil {
				t.Fatal(err)
			}
			// The head is current: only the command's end refuses it.
			_, err := recordings.AppendInputAfter(ctx, db, head, c.SessionID, c.ID, []byte("late"), false, at, mia)
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != "command_ended" || !errors.Is(err, apperr.ErrConflict) {
				t.Fatalf("stdin into an ended command = %v, want command_ended", err)
			}
			assertInputChain(t, db, c.ID, head.Seq)
		})

		t.Run("the recording verifies with its typists", func(t *testing.T) {
			v, err := recordings.Verify(context.Background(), db, c.ID, ended.OutHash, ended.InHash)
			if err != nil || !v.OK || v.InBytes != wantIn {
				t.Fatalf("Verify = %+v, %v (want %d input bytes)", v, err, wantIn)
			}
			chunks, err := recordings.Read(context.Background(), db, c.ID, recordings.KindIn)
			if err != nil {
				t.Fatal(err)
			}
			frames := 0
			for _, ch := range chunks {
				if ch.Stream == recordings.StreamTypist {
					frames++
				}
			}
			if int64(frames)*2 != head.Seq {
				t.Fatalf("%d typist chunks for %d input chunks, want one per frame of two", frames, head.Seq)
			}
			changes, err := recordings.TypistChanges(context.Background(), db, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			var who []string
			for _, ch := range changes {
				who = append(who, ch.Typist.ID)
			}
			// mia, the key, the key's write a stale head fell behind, mia
			// again for the rest.
			if got := strings.Join(who, ","); got != "3,7,3" {
				t.Fatalf("typist changes %s, want 3,7,3", got)
			}
			res, err := recordings.VerifyAll(context.Background(), db, log)
			if err != nil || !res.OK {
				t.Fatalf("VerifyAll = %+v, %v", res, err)
			}
		})
	})
}

// assertInputChain checks command id's input is stored once, in order,
// each frame opening with its typist, up to seq.
func assertInputChain(t *testing.T, db *gorm.DB, id, seq int64) {
	t.Helper()
	chunks, err := recordings.Read(context.Background(), db, id, recordings.KindIn)
	if err != nil {
		t.Fatal(err)
	}
	for i, ch := range chunks {
		if ch.Seq != uint64(i+1) {
			t.Fatalf("input chunk %d has seq %d: stored twice or out of order (%s)", i+1, ch.Seq, seqs(chunks))
		}
	}
	if len(chunks) == 0 || int64(chunks[len(chunks)-1].Seq) != seq {
		t.Fatalf("input ends at %s, want %d", seqs(chunks), seq)
	}
}

func seqs(cs []recordings.Chunk) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%d:%s ", c.Seq, c.Stream)
	}
	return b.String()
}
