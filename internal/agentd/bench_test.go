//go:build unix

package agentd_test

import (
	"context"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// BenchmarkStartToExit measures a full round trip of `true` with wait_ms:
// request, fork/exec, exit, drain, response.
func BenchmarkStartToExit(b *testing.B) {
	url, token := agentdtest.Start(b)
	timeTrue(b, agentd.NewClient(url, token, nil), 0)
}

// timeTrue times b.N execs of `true` through c (after warm more, and one
// to warm the connection), reported as p50-ms and p99-ms.
func timeTrue(b *testing.B, c *agentd.Client, warm int) {
	ctx := context.Background()
	req := agentd.CreateSessionRequest{Command: "true", WaitMS: 10000}
	for range warm + 1 {
		if _, err := c.CreateSession(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		resp, err := c.CreateSession(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		if resp.State != agentd.StateExited {
			b.Fatalf("state %s", resp.State)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkOutputThroughput reads 256 MiB of stdout through the client, with
// backpressure so no byte is dropped.
func BenchmarkOutputThroughput(b *testing.B) {
	const size = 256 << 20
	url, token := agentdtest.Start(b)
	c := agentd.NewClient(url, token, nil)
	ctx := context.Background()
	b.SetBytes(size)
	b.ReportAllocs()
	for range b.N {
		resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{
			Command:  "head -c 268435456 /dev/zero",
			Overflow: agentd.OverflowBlock,
		})
		if err != nil {
			b.Fatal(err)
		}
		var n int
		final, err := c.Follow(ctx, resp.SessionID, 0, func(r *agentd.SessionResponse) error {
			if r.Truncated {
				b.Fatalf("dropped %d bytes", r.DroppedBytes)
			}
			for _, ch := range r.Chunks {
				n += len(ch.Data)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		if n != size || final.State != agentd.StateExited {
			b.Fatalf("read %d bytes, state %s", n, final.State)
		}
	}
}

// BenchmarkIdleSessionMemory measures agentd's own heap per idle session
// (children excluded: they are separate processes).
func BenchmarkIdleSessionMemory(b *testing.B) {
	const sessions = 1000
	for range b.N {
		b.StopTimer()
		srv, err := agentd.NewServer(agentd.Config{Token: "test-token-0123456789", MaxSessions: sessions, KillGrace: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		url := benchHTTPServer(b, srv)
		c := agentd.NewClient(url, "test-token-0123456789", nil)
		ctx := context.Background()
		if _, err := c.Health(ctx); err != nil {
			b.Fatal(err)
		}
		before, stackBefore := heapInUse()
		threadsBefore := runtime.NumGoroutine()
		b.StartTimer()
		for range sessions {
			if _, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 1000"}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		after, stackAfter := heapInUse()
		b.ReportMetric(float64(after-before)/sessions, "heap-bytes/session")
		b.ReportMetric(float64(stackAfter-stackBefore)/sessions, "stack-bytes/session")
		b.ReportMetric(float64(runtime.NumGoroutine()-threadsBefore)/sessions, "goroutines/session")
		b.ReportMetric(float64(osThreads()), "os-threads")
		srv.Close()
	}
}

// heapInUse returns live heap bytes (after GC) and goroutine stack bytes.
func heapInUse() (heap, stack int64) {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), int64(m.StackInuse)
}

// osThreads counts the process's threads (0 where /proc is missing).
func osThreads() int {
	entries, _ := os.ReadDir("/proc/self/task")
	return len(entries)
}
