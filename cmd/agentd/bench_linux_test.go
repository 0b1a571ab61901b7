//go:build linux

package main_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// BenchmarkOutputMemory measures agentd's peak RSS (VmHWM of the real
// process) under hostile output patterns nobody polls, for finding 1 of
// issue 17. The target: RSS above the idle baseline stays under 3× the
// ring size per session for any write pattern. Run with -benchtime=1x:
//
//	go test -run '^$' -bench BenchmarkOutputMemory -benchtime=1x ./cmd/agentd/
//
// AGENTD_BENCH_BIN runs another agentd binary instead (e.g. an older build,
// to compare).
func BenchmarkOutputMemory(b *testing.B) {
	const ring = agentd.DefaultRingBytes
	const run = 10 * time.Second
	cases := []struct {
		name     string
		command  string
		sessions int
		wait     bool // wait for each session to end rather than for run
	}{
		{"printf-loop", "while :; do printf x; done", 1, false},
		{"yes", "yes", 1, false},
		{"64-ended-full-rings", fmt.Sprintf("yes | head -c %d", 2*ring), 64, true},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				d := startBenchDaemon(b)
				ctx := ctxFor(b)
				if _, err := d.client.Health(ctx); err != nil {
					b.Fatal(err)
				}
				base := procStatusKB(b, d.cmd.Process.Pid, "VmRSS")
				ids := make([]string, 0, bc.sessions)
				for range bc.sessions {
					req := agentd.CreateSessionRequest{Command: bc.command}
					if bc.wait {
						req.WaitMS = 60000
					}
					resp, err := d.client.CreateSession(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					ids = append(ids, resp.SessionID)
				}
				if !bc.wait {
					time.Sleep(run)
				}
				peak := procStatusKB(b, d.cmd.Process.Pid, "VmHWM")
				for _, id := range ids {
					d.client.Kill(ctx, id)
				}
				// One poll from cursor 0 costs what it returns.
				r, err := d.client.Poll(ctx, ids[0], 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(base)/1024, "base-RSS-MiB")
				b.ReportMetric(float64(peak)/1024, "peak-RSS-MiB")
				b.ReportMetric(float64(peak-base)*1024/float64(ring*bc.sessions), "growth/ring")
				b.ReportMetric(float64(dataBytes(r))/(1<<20), "poll-MiB")
				b.ReportMetric(float64(len(r.Chunks)), "poll-chunks")
			}
		})
	}
}

func dataBytes(r *agentd.SessionResponse) int {
	n := 0
	for _, c := range r.Chunks {
		n += len(c.Data)
	}
	return n
}

// startBenchDaemon starts agentd (or AGENTD_BENCH_BIN) for a benchmark.
func startBenchDaemon(b *testing.B) *daemon {
	if bin := os.Getenv("AGENTD_BENCH_BIN"); bin != "" {
		saved := agentdBin
		agentdBin = bin
		defer func() { agentdBin = saved }()
	}
	return startDaemon(b, "--max-sessions", "100")
}

// procStatusKB reads a kB field of /proc/PID/status.
func procStatusKB(b *testing.B, pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
