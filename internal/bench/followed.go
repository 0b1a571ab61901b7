package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// Followed is the console's cost of following many quiet commands: n
// `sleep`s started through the gateway, each followed (and recorded) by
// the console until it ends.
type Followed struct {
	N int
	// Before and During are VmRSS before the commands started and while
	// all of them are followed (each after a GC that returns freed
	// memory).
	Before, During int64
	// HeapPerCommand is the Go heap in use per followed command, and
	// Goroutines how many goroutines the process had while following.
	HeapPerCommand int64
	Goroutines     int
	// CPU is the console's CPU time over Window while the commands are
	// followed and nothing else happens, as a fraction of one core.
	CPU    float64
	Window time.Duration
	// ExecIdle and ExecDuring time gateway execs of `true` (by a member
	// other than the one running the n) before the commands started and
	// while they are followed; DirectIdle and DirectDuring the same direct
	// to agentd (interleaved with them), which tells agentd's own slowdown
	// (it runs the n commands) from the console's.
	ExecIdle, ExecDuring     []time.Duration
	DirectIdle, DirectDuring []time.Duration
	// LoadDuring times gateway execs by the member running the n while
	// they run: their cap check counts their running commands, up to
	// the cap.
	LoadDuring []time.Duration
}

// FollowedCommands starts n `sleep`s through the gateway (as the stack's
// Load runtime: another member, another agent), waits until the console
// follows all of them, and measures its memory, its CPU over window while
// they are quiet, and the main member's exec latency meanwhile against
// before. The commands are killed at the end.
func (s *Stack) FollowedCommands(ctx context.Context, n int, window time.Duration, execs int) (Followed, error) {
	f := Followed{N: n, Window: window}
	gw, load, direct := GatewayPath{S: s}, GatewayPath{S: s, As: &s.Load}, DirectPath{s.Direct}
	var err error
	execGW := func() (time.Duration, error) { return ExecTrue(ctx, gw) }
	execDirect := func() (time.Duration, error) { return ExecTrue(ctx, direct) }
	if f.DirectIdle, f.ExecIdle, err = timePairs(ctx, execs, execDirect, execGW, nil); err != nil {
		return f, err
	}
	s.settle(ctx)
	var heapBefore uint64
	f.Before, heapBefore = settledRSS()
	ids := make([]string, 0, n)
	defer func() {
		// Killed however the measurement ended; their followers record
		// the ends.
		kctx := context.WithoutCancel(ctx)
		for _, id := range ids {
			_ = load.Kill(kctx, id)
		}
		s.settle(kctx)
	}()
	for range n {
		id, _, err := load.Exec(ctx, agentd.CreateSessionRequest{Command: "sleep 3600"})
		if err != nil {
			return f, fmt.Errorf("start followed command %d: %w", len(ids)+1, err)
		}
		ids = append(ids, id)
	}
	if err := s.waitFollowed(ctx, n); err != nil {
		return f, err
	}
	f.Goroutines = runtime.NumGoroutine()
	var heapDuring uint64
	f.During, heapDuring = settledRSS()
	f.HeapPerCommand = (int64(heapDuring) - int64(heapBefore)) / int64(n)
	cpu0, t0 := cpuTime(), time.Now()
	select {
	case <-ctx.Done():
		return f, ctx.Err()
	case <-time.After(window):
	}
	f.CPU = (cpuTime() - cpu0).Seconds() / time.Since(t0).Seconds()
	stopCPU, err := s.cpuProfile(".followed")
	if err != nil {
		return f, err
	}
	f.DirectDuring, f.ExecDuring, err = timePairs(ctx, execs, execDirect, execGW, nil)
	stopCPU()
	if err != nil {
		return f, err
	}
	for range max(execs/4, 1) {
		d, err := ExecTrue(ctx, load)
		if err != nil {
			return f, err
		}
		f.LoadDuring = append(f.LoadDuring, d)
	}
	return f, nil
}

// waitFollowed waits until n commands are followed and the goroutine
// count has been steady for a second.
func (s *Stack) waitFollowed(ctx context.Context, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	last, steady := 0, time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		g := runtime.NumGoroutine()
		if g != last {
			last, steady = g, time.Now()
		}
		active := s.Console.Gateway.Followers.Active()
		if active >= n && time.Since(steady) > time.Second {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d commands followed after 2 minutes", active, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cpuTime is this process's user and system CPU time so far (0 where
// /proc is missing).
func cpuTime() time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields count from after
	// its closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	// utime and stime are fields 14 and 15 of the whole line, in clock
	// ticks (100 a second on Linux).
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
