package bench_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/bench"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// benchStacks stands up, per database, a console whose member has a
// session on a host environment served by a real in-process agentd,
// everything set up through the JSON API (see package bench).
func benchStacks(b *testing.B) map[store.Dialect]*bench.Stack {
	b.Helper()
	ad, err := bench.StartAgentd(b.TempDir(), false)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ad.Close)
	out := map[store.Dialect]*bench.Stack{}
	for _, d := range storetest.Dialects {
		o := bench.Options{DataDir: b.TempDir(), Agentd: ad, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if d == store.Postgres {
			o.PostgresDSN = storetest.AdminDSN(b)
		}
		s, err := bench.Start(context.Background(), o)
		if err != nil {
			b.Fatalf("%s: %v", d, err)
		}
		b.Cleanup(s.Close)
		out[d] = s
	}
	return out
}

// timed runs op b.N times and reports its p50 and p99 next to ns/op.
func timed(b *testing.B, op func() (time.Duration, error)) {
	b.Helper()
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		d, err := op()
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, d)
	}
	b.StopTimer()
	b.ReportMetric(float64(bench.Percentile(ds, 50))/1e6, "p50-ms")
	b.ReportMetric(float64(bench.Percentile(ds, 99))/1e6, "p99-ms")
}

// eachPath runs fn as a sub-benchmark per database and path (direct to
// agentd, through the gateway).
func eachPath(b *testing.B, fn func(b *testing.B, p bench.Path)) {
	stacks := benchStacks(b)
	for _, d := range storetest.Dialects {
		s := stacks[d]
		for _, p := range []bench.Path{bench.DirectPath{C: s.Direct}, bench.GatewayPath{S: s}} {
			b.Run(string(d)+"/"+p.Name(), func(b *testing.B) { fn(b, p) })
		}
	}
}

// BenchmarkExec runs `true` to its exit, direct to agentd and through the
// gateway (targets: gateway p50 at most 1.3× direct on SQLite, 1.5× on Postgres).
func BenchmarkExec(b *testing.B) {
	ctx := context.Background()
	eachPath(b, func(b *testing.B, p bench.Path) {
		timed(b, func() (time.Duration, error) { return bench.ExecTrue(ctx, p) })
	})
}

// BenchmarkKeystroke types into `cat` on a PTY and waits for each echo
// with a long-poll (target: gateway p50 at most direct + 1 ms).
func BenchmarkKeystroke(b *testing.B) {
	ctx := context.Background()
	eachPath(b, func(b *testing.B, p bench.Path) {
		ty, err := bench.NewTypist(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = ty.Close(ctx) }()
		timed(b, func() (time.Duration, error) { return ty.Key(ctx) })
	})
}

// BenchmarkFollowedCommands follows 200 quiet `sleep`s per database (the
// bench command's figure uses 2,000) and reports the console's memory
// and CPU per followed command and exec latency meanwhile against idle
// (targets for 2,000: < 150 MiB growth, < 3 % of a core, exec p50 within
// 20 % of idle).
func BenchmarkFollowedCommands(b *testing.B) {
	ctx := context.Background()
	stacks := benchStacks(b)
	for _, d := range storetest.Dialects {
		b.Run(string(d), func(b *testing.B) {
			for range b.N {
				f, err := stacks[d].FollowedCommands(ctx, 200, 5*time.Second, 30)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(f.During-f.Before)/float64(f.N)/1e3, "rss-kB/cmd")
				b.ReportMetric(float64(f.HeapPerCommand)/1e3, "heap-kB/cmd")
				b.ReportMetric(100*f.CPU, "cpu-%core")
				b.ReportMetric(float64(bench.Percentile(f.ExecDuring, 50))/float64(bench.Percentile(f.ExecIdle, 50)), "exec-p50-vs-idle")
			}
		})
	}
}
