package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Targets of the gateway (issues 10 and 23).
const (
	TargetExecRatioSQLite   = 1.3                  // gateway exec p50 ≤ 1.3× direct, on SQLite
	TargetExecRatio         = 1.5                  // gateway exec p50 ≤ 1.5× direct, on Postgres
	TargetKeystrokeExtra    = 1 * time.Millisecond // gateway keystroke p50 ≤ direct + 1 ms
	TargetThroughput        = 0.5                  // output with recording ≥ ½ direct
	TargetMemoryGrowth      = 100 << 20            // RSS growth for the idle polls
	TargetFollowedGrowth    = 150 << 20            // RSS growth for 2,000 followed commands
	TargetFollowedCPU       = 0.03                 // CPU while they are quiet, of one core
	TargetFollowedExecRatio = 1.2                  // exec p50 while they run ≤ 1.2× idle
	// releasedWithin is how close to its starting RSS the console must
	// come back after the polls to count as having released them (the
	// transport keeps up to 256 idle connections to agentd).
	releasedWithin = 10 << 20
)

func verdict(ok bool) string {
	if ok {
		return "meets"
	}
	return "MISSES"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// mb formats a size in MiB, the unit the memory targets are set in.
func mb(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func kb(n int64) string { return fmt.Sprintf("%.1f kB", float64(n)/1e3) }

// Print writes every figure of results side by side, each against its
// target.
func Print(w io.Writer, cfg Config, results []*Result) {
	cfg = cfg.withDefaults()
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "\nGatehouse terminal gateway: direct to agentd vs through the gateway (%s)\n", Machine())
	fmt.Fprintf(tw, "figure\tdatabase\tdirect\tgateway\tgateway vs direct\ttarget\n")
	for _, r := range results {
		db := string(r.Dialect)
		dp50, gp50 := Percentile(r.ExecDirect, 50), Percentile(r.ExecGW, 50)
		ratio := float64(gp50) / float64(dp50)
		limit := TargetExecRatio
		if r.Dialect != "postgres" {
			limit = TargetExecRatioSQLite
		}
		target := fmt.Sprintf("≤ %.1f×: %s", limit, verdict(ratio <= limit))
		fmt.Fprintf(tw, "exec `true` to exit, p50 (%d runs)\t%s\t%s\t%s\t%.2f×\t%s\n", len(r.ExecGW), db, ms(dp50), ms(gp50), ratio, target)
		fmt.Fprintf(tw, "exec `true` to exit, p99\t%s\t%s\t%s\t%.2f×\t\n", db, ms(Percentile(r.ExecDirect, 99)), ms(Percentile(r.ExecGW, 99)),
			float64(Percentile(r.ExecGW, 99))/float64(Percentile(r.ExecDirect, 99)))
		if len(r.ExecRecord) > 0 {
			// The floor: what the ratio would be if the gateway cost
			// nothing but the commit that must precede the forward.
			c := Percentile(r.ExecRecord, 50)
			fmt.Fprintf(tw, "  of which the exec's record committed first, p50\t%s\t\t%s\t(direct + commit) ÷ direct = %.2f×\t\n", db, ms(c),
				float64(dp50+c)/float64(dp50))
		}
		kd, kg := Percentile(r.KeyDirect, 50), Percentile(r.KeyGW, 50)
		fmt.Fprintf(tw, "keystroke echo on a PTY, p50 (%d keys)\t%s\t%s\t%s\t+%s\t≤ direct + 1 ms: %s\n", len(r.KeyGW), db, ms(kd), ms(kg), ms(kg-kd),
			verdict(kg-kd <= TargetKeystrokeExtra))
		fmt.Fprintf(tw, "keystroke echo on a PTY, p99\t%s\t%s\t%s\t+%s\t\n", db, ms(Percentile(r.KeyDirect, 99)), ms(Percentile(r.KeyGW, 99)),
			ms(Percentile(r.KeyGW, 99)-Percentile(r.KeyDirect, 99)))
		if len(r.KeyRecord) > 0 {
			fmt.Fprintf(tw, "  of which the keystroke's record committed first, p50\t%s\t\t%s\t\t\n", db, ms(Percentile(r.KeyRecord, 50)))
		}
		for _, o := range r.Outputs {
			rel := o.Gateway.MBps() / o.Direct.MBps()
			target := fmt.Sprintf("≥ %.1f× direct, recording complete: %s", TargetThroughput, verdict(rel >= TargetThroughput && o.Recording.Complete))
			fmt.Fprintf(tw, "output %s, %s, recording on\t%s\t%.0f MiB/s\t%.0f MiB/s\t%.2f×\t%s\n", mib(cfg.OutputBytes), o.Kind, db,
				o.Direct.MBps(), o.Gateway.MBps(), rel, target)
		}
		m := r.Memory
		growth := m.During - m.Before
		kept := m.After - m.Before
		fmt.Fprintf(tw, "console RSS, %d idle long-polls (%d answered)\t%s\tbefore %s\tduring %s\t+%s; after +%s (%s)\t< 100 MiB growth, released: %s\n",
			m.Polls, m.Answered, db, mb(m.Before), mb(m.During), mb(growth), mb(kept), mb(m.After),
			verdict(growth < TargetMemoryGrowth && kept < releasedWithin))
		if f := r.Followed; f != nil {
			g := f.During - f.Before
			fmt.Fprintf(tw, "console RSS, %d followed commands\t%s\tbefore %s\twhile followed %s\t+%s (%s each)\t< 150 MiB growth: %s\n",
				f.N, db, mb(f.Before), mb(f.During), mb(g), kb(g/int64(f.N)), verdict(g < TargetFollowedGrowth))
			fmt.Fprintf(tw, "console CPU while %d followed commands are quiet (%s)\t%s\t\t%.1f %% of a core\t\t< 3 %% of a core: %s\n",
				f.N, f.Window.Round(time.Second), db, 100*f.CPU, verdict(f.CPU < TargetFollowedCPU))
			ip, dp := Percentile(f.ExecIdle, 50), Percentile(f.ExecDuring, 50)
			fmt.Fprintf(tw, "another member's gateway exec `true` p50 while %d followed (%d runs)\t%s\tidle %s\tmeanwhile %s\t%.2f×\t≤ %.1f× idle: %s\n",
				f.N, len(f.ExecDuring), db, ms(ip), ms(dp), float64(dp)/float64(ip), TargetFollowedExecRatio,
				verdict(float64(dp) <= TargetFollowedExecRatio*float64(ip)))
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\nDetails:\n")
	for _, r := range results {
		for _, o := range r.Outputs {
			rc := o.Recording
			ratioStored := 0.0
			if rc.StoredBytes > 0 {
				ratioStored = float64(rc.OutBytes) / float64(rc.StoredBytes)
			}
			fmt.Fprintf(w, "  %s, %s: bytes read by the client: direct %d (dropped %d), gateway %d (dropped %d)\n", r.Dialect, o.Kind,
				o.Direct.Bytes, o.Direct.Dropped, o.Gateway.Bytes, o.Gateway.Dropped)
			fmt.Fprintf(w, "  %s, %s: recording %s, complete: %v; %d bytes recorded in %s of recording_frames bodies (%.1f:1, %d frames); %d bytes dropped; ended %s after the client\n",
				r.Dialect, o.Kind, rc.State, rc.Complete, rc.OutBytes, mb(rc.StoredBytes), ratioStored, rc.Frames, rc.DroppedBytes, rc.Lag.Round(time.Millisecond))
		}
		m := r.Memory
		fmt.Fprintf(w, "  %s, %d long-polls: Go heap in use before %s, during %s, after %s; during: %d goroutines, stacks %s\n", r.Dialect, m.Polls,
			mb(int64(m.HeapBefore)), mb(int64(m.HeapDuring)), mb(int64(m.HeapAfter)), m.Goroutines, mb(int64(m.StackDuring)))
		if f := r.Followed; f != nil {
			fmt.Fprintf(w, "  %s, %d followed commands: Go heap %s per command, %d goroutines; gateway exec p99 idle %s, meanwhile %s; "+
				"direct exec (agentd runs the %d commands) p50 idle %s, meanwhile %s; the exec p50 of the member running them %s (%d runs)\n", r.Dialect, f.N,
				kb(f.HeapPerCommand), f.Goroutines, ms(Percentile(f.ExecIdle, 99)), ms(Percentile(f.ExecDuring, 99)),
				f.N, ms(Percentile(f.DirectIdle, 50)), ms(Percentile(f.DirectDuring, 50)), ms(Percentile(f.LoadDuring, 50)), len(f.LoadDuring))
		}
	}
	for _, r := range results {
		if r.ProfileText != "" {
			fmt.Fprintf(w, "\nDatabase round trips per gateway request on %s (statements counted at the connection pool):\n%s", r.Dialect, r.ProfileText)
		}
	}
}
