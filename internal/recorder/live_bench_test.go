package recorder

import (
	"context"
	"fmt"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// BenchmarkLiveWindow sizes DefaultLiveBudget: 2,000 followed commands, a
// tenth of them printing bulk output (64 KiB chunks) and the rest
// interactive (128-byte echoes), every chunk stored as it comes. After each
// chunk a reader of that command polls from a typical lag (1 MiB behind a
// bulk command, 4 KiB behind an interactive one). It reports the share of
// those polls the window answers (the rest read the recording), the
// window's bytes, and the cost of a chunk's publish, store and poll.
//
//	go test -run '^$' -bench BenchmarkLiveWindow -benchtime 400000x ./internal/recorder/
func BenchmarkLiveWindow(b *testing.B) {
	const commands = 2000
	bulk := make([]byte, 64<<10)
	echo := make([]byte, 128)
	for _, mib := range []int64{64, 128, 256, 512, 1024} {
		b.Run(fmt.Sprintf("budget=%dMiB", mib), func(b *testing.B) {
			f := &Followers{LiveBudget: mib << 20}
			next := make([]uint64, commands)
			var bulkHit, bulkAsked, echoHit, echoAsked int
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				cmd := i % commands
				data, lag := echo, uint64(32)
				if cmd%10 == 0 {
					data, lag = bulk, 16
				}
				k := liveKey{"acme", int64(cmd)}
				id := next[cmd] + 1
				f.publish(k, nil, next[cmd], &agentd.SessionResponse{State: agentd.StateRunning, NextCursor: id,
					Chunks: []agentd.Chunk{{ID: id, Stream: agentd.StreamStdout, Data: data}}})
				f.storedTo(k, id)
				next[cmd] = id
				if id <= lag {
					continue
				}
				_, st, _ := f.ReadLive(ctx, "acme", nil, int64(cmd), id-lag, 0)
				if cmd%10 == 0 {
					bulkAsked++
					if st == LiveAnswered {
						bulkHit++
					}
				} else {
					echoAsked++
					if st == LiveAnswered {
						echoHit++
					}
				}
			}
			u := f.LiveWindow()
			held, evicted := u.Held, u.Evicted
			b.ReportMetric(float64(held)/(1<<20), "held-MiB")
			b.ReportMetric(float64(evicted)/(1<<20), "evicted-MiB")
			if bulkAsked > 0 {
				b.ReportMetric(100*float64(bulkHit)/float64(bulkAsked), "bulk-hit-%")
			}
			if echoAsked > 0 {
				b.ReportMetric(100*float64(echoHit)/float64(echoAsked), "echo-hit-%")
			}
		})
	}
}
