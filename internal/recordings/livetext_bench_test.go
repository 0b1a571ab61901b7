package recordings

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// BenchmarkLiveIndexBatch measures what indexing output for search as it
// is stored costs a follower batch: AppendOutput of one batch of 4 KiB of
// coloured log lines, with the search entry growing from empty to the cap
// (64 batches a command, then a new command). every_batch: batches a
// second apart, each one written to the index (the cost of one index
// write); throttled: batches in a burst, written at most once per
// IndexEvery; off: a command whose index is capped already (no indexing).
// every_batch minus off is the cost of one index write.
func BenchmarkLiveIndexBatch(b *testing.B) {
	ctx := context.Background()
	var line strings.Builder
	for line.Len() < 4096-80 {
		fmt.Fprintf(&line, "\x1b[32mINFO\x1b[0m worker %d processed request id=%x in 12ms\r\n", line.Len(), line.Len()*7919)
	}
	batch := []byte(line.String())
	for _, d := range []store.Dialect{store.SQLite, store.Postgres} {
		for _, mode := range []string{"every_batch", "throttled", "off"} {
			b.Run(fmt.Sprintf("%s/%s", d, mode), func(b *testing.B) {
				db := storetest.Open(b, d, store.OrgSet)
				id := seedFrames(b, db, 0, 0, 0)
				newCommand := func() {
					c := Command{SessionID: 1, AgentdID: fmt.Sprintf("gh-bench-%d", time.Now().UnixNano()), Command: "tail -f app.log",
						ActorType: "user", ActorID: "1", StartedAt: time.Now().UTC(), State: StateRunning, LeaseOwner: "me"}
					if mode == "off" {
						c.TextCursor = `{"capped":true}`
					}
					if err := db.Create(&c).Error; err != nil {
						b.Fatal(err)
					}
					id = c.ID
				}
				newCommand()
				lease := time.Now().Add(time.Hour)
				base := time.Now()
				seq := uint64(0)
				for b.Loop() {
					if seq == 64 {
						b.StopTimer()
						newCommand()
						seq = 0
						b.StartTimer()
					}
					seq++
					at := time.Now()
					if mode == "every_batch" {
						at = base.Add(time.Duration(seq) * IndexEvery)
					}
					out := Output{Chunks: []Chunk{{Seq: seq, Stream: StreamPTY, At: at, Data: batch}}}
					if _, err := AppendOutput(ctx, db, id, "me", out, lease); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
