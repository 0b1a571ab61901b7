package bench_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/bench"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// BenchmarkConcurrentFileReads reads a 60 MiB file four times at once
// through the gateway (GET .../files, which passes agentd's body on) and
// reports how far the console's Go heap grew above its level before the
// reads (peak-heap-growth-MB), sampled while they run. The console,
// agentd and the clients share this process; all three stream, so the
// growth is their copy buffers, not the files (issue 21 measured 4 × 60 MB
// reads growing a console holding each file from ~100 to ~535 MB).
func BenchmarkConcurrentFileReads(b *testing.B) {
	const size, readers = 60 << 20, 4
	ctx := context.Background()
	stacks := benchStacks(b)
	for _, d := range storetest.Dialects {
		s := stacks[d]
		b.Run(string(d), func(b *testing.B) {
			if _, out, err := (bench.GatewayPath{S: s}).Exec(ctx, agentd.CreateSessionRequest{
				Command: fmt.Sprintf("head -c %d /dev/zero > big.bin", size), WaitMS: 30000}); err != nil || out.State != agentd.StateExited {
				b.Fatalf("write the file: %v (%s)", err, out.State)
			}
			url := fmt.Sprintf("%s/api/v1/orgs/%s/sessions/%d/files?path=big.bin", s.URL, s.Org, s.Session)
			var peak uint64
			b.ResetTimer()
			for range b.N {
				peak = max(peak, heapGrowthDuring(b, func() {
					var wg sync.WaitGroup
					for range readers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							if n, err := readFile(ctx, s, url); err != nil || n != size {
								b.Errorf("read %d bytes: %v", n, err)
							}
						}()
					}
					wg.Wait()
				}))
			}
			b.StopTimer()
			b.ReportMetric(float64(peak)/1e6, "peak-heap-growth-MB")
			b.SetBytes(size * readers)
		})
	}
}

// heapGrowthDuring runs fn and returns the most the heap in use grew
// above its level before fn, sampled every 2 ms while fn runs.
func heapGrowthDuring(b *testing.B, fn func()) uint64 {
	b.Helper()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(done)
	<-sampled
	return peak - base
}

// readFile reads url through the console as the member and returns how
// many bytes arrived.
func readFile(ctx context.Context, s *bench.Stack, url string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+s.Key)
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return io.Copy(io.Discard, resp.Body)
}
