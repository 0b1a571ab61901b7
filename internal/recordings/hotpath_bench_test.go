package recordings_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// BenchmarkHotPaths times the database work of the gateway's per-operation
// hot paths on each engine: an exec's commit, a keystroke, a follower's
// batch and a command's end (with its command.end event).
//
//	go test -run '^$' -bench BenchmarkHotPaths -benchtime 500x ./internal/recordings/
func BenchmarkHotPaths(b *testing.B) {
	for _, d := range []store.Dialect{store.SQLite, store.Postgres} {
		b.Run(string(d), func(b *testing.B) {
			db := storetest.Open(b, d, store.OrgSet)
			log := audit.NewLog(db, audit.OrgTable, nil)
			ctx := context.Background()
			allow := func(recordings.SessionState, [2]int64) error { return nil }
			command(b, db, "me")
			i := 0
			start := func(b *testing.B) recordings.Command {
				i++
				c := newCommand(10_000 + i)
				if err := recordings.StartAudited(ctx, db, log, execChecks(allow), c, execEvent); err != nil {
					b.Fatal(err)
				}
				return *c
			}
			batch := func(seq uint64) recordings.Output {
				return recordings.Output{NextCursor: seq, Chunks: []recordings.Chunk{{Seq: seq, Stream: recordings.StreamStdout, At: time.Now(), Data: []byte(fmt.Sprintf("line %d\n", seq))}}}
			}
			b.Run("exec", func(b *testing.B) {
				for range b.N {
					start(b)
				}
			})
			b.Run("keystroke", func(b *testing.B) {
				c := start(b)
				head := recordings.HeadOf(c)
				typist := recordings.Typist{Type: "user", ID: "1", Name: "u"}
				b.ResetTimer()
				for range b.N {
					next, err := recordings.AppendInputAfter(ctx, db, head, c.SessionID, c.ID, []byte("k"), false, time.Now(), typist)
					if err != nil {
						b.Fatal(err)
					}
					head = recordings.HeadOf(next)
				}
			})
			b.Run("follower batch", func(b *testing.B) {
				c := start(b)
				var err error
				// The first batch writes the search entry; the rest within
				// IndexEvery are the one-statement form.
				if c, err = recordings.AppendFollowed(ctx, db, c, "me", batch(1)); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for n := range b.N {
					if c, err = recordings.AppendFollowed(ctx, db, c, "me", batch(uint64(n)+2)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("end", func(b *testing.B) {
				cs := make([]recordings.Command, b.N)
				for n := range cs {
					cs[n] = start(b)
				}
				exit := 0
				b.ResetTimer()
				for _, c := range cs {
					if _, err := recordings.CompleteFollowed(ctx, db, log, c, "me", batch(1),
						recordings.End{State: recordings.StateExited, ExitCode: &exit, At: time.Now()}, audit.Actor{Type: audit.ActorSystem, Name: "recorder"}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
