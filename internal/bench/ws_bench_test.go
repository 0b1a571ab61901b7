package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/bench"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// BenchmarkKeystrokeWebSocket types into `cat` on a PTY through the JSON
// API (POST stdin, then a long-poll for the echo; "gateway") and through the browser
// terminal's WebSocket, on SQLite and Postgres (target: the WebSocket's
// p50 at most the JSON API's + 2 ms):
//
//	go test ./internal/bench/ -run '^$' -bench KeystrokeWebSocket -benchtime 500x
func BenchmarkKeystrokeWebSocket(b *testing.B) {
	ctx := context.Background()
	stacks := benchStacks(b)
	for _, d := range storetest.Dialects {
		s := stacks[d]
		for _, p := range []bench.Path{bench.GatewayPath{S: s}, &bench.WSPath{S: s}} {
			b.Run(string(d)+"/"+p.Name(), func(b *testing.B) {
				ty, err := bench.NewTypist(ctx, p)
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = ty.Close(ctx) }()
				timed(b, func() (time.Duration, error) { return ty.Key(ctx) })
			})
		}
	}
}
