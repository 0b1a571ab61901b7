//go:build linux

package agentd_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// BenchmarkExecReporting measures what exec reporting costs a shell that
// starts many short processes (a build's pattern): each op runs, on two
// agentds side by side, a session whose shell starts execBenchProcs
// /bin/true one after the other, to its end with all its output (and
// records) read: one agentd with --exec-reporting off, one reporting every
// exec to the session. The two alternate (which goes first too), so a
// busy machine slows both alike; it reports each one's time per process
// and the slowdown in percent (the target is at most 10 %).
//
//	go test -run '^$' -bench BenchmarkExecReporting -benchtime 40x ./internal/agentd/
func BenchmarkExecReporting(b *testing.B) {
	const execBenchProcs = 200
	cmd := `i=0; while [ $i -lt ` + strconv.Itoa(execBenchProcs) + ` ]; do /bin/true; i=$((i+1)); done`
	off := agentdtest.Client(b, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.ExecReporting = agentd.ExecReportingDisabled }))
	on := agentdtest.Client(b)
	ctx := context.Background()
	records := 0
	run := func(c *agentd.Client) time.Duration {
		start := time.Now()
		resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: cmd, Overflow: agentd.OverflowBlock, ExecRecords: true})
		if err != nil {
			b.Fatal(err)
		}
		count := func(r *agentd.SessionResponse) error {
			for _, ch := range r.Chunks {
				if ch.Stream == agentd.StreamExec {
					recs, err := agentd.ParseExecRecords(ch.Data)
					if err != nil {
						return err
					}
					records += len(recs)
				}
			}
			return nil
		}
		if err := count(resp); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Follow(ctx, resp.SessionID, resp.NextCursor, count); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var tOff, tOn time.Duration
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			tOff += run(off)
			tOn += run(on)
		} else {
			tOn += run(on)
			tOff += run(off)
		}
		i++
	}
	procs := float64(i * execBenchProcs)
	b.ReportMetric(float64(tOff.Nanoseconds())/procs, "off-ns/proc")
	b.ReportMetric(float64(tOn.Nanoseconds())/procs, "on-ns/proc")
	b.ReportMetric(100*(float64(tOn)/float64(tOff)-1), "slowdown-%")
	b.ReportMetric(float64(records)/float64(i), "records/op")
}
