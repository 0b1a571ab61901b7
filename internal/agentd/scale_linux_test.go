//go:build linux

package agentd_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// scaleServer is an agentd with n running `sleep 600` sessions (started
// concurrently), tracking them in cgroup mode mode. It returns the client,
// the sessions' leader pids and the server, closed at the end of tb.
func scaleServer(tb testing.TB, mode string, n int, extra string) (*agentd.Client, []int, *agentd.Server) {
	return scaleServerWith(tb, agentd.Config{Cgroup: mode}, n, extra)
}

// scaleServerWith is scaleServer with cfg's Cgroup, Spawner and Subreaper.
func scaleServerWith(tb testing.TB, cfg agentd.Config, n int, extra string) (*agentd.Client, []int, *agentd.Server) {
	tb.Helper()
	const token = "test-token-0123456789"
	srv, err := agentd.NewServer(agentd.Config{Token: token, MaxSessions: n + 16, Cgroup: cfg.Cgroup, KillGrace: time.Second,
		Spawner: cfg.Spawner, Subreaper: cfg.Subreaper})
	if err != nil {
		tb.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	tb.Cleanup(func() {
		srv.Close()
		ts.Close()
	})
	c := agentd.NewClient(ts.URL, token, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pids := make([]int, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: extra + "sleep 600"})
			if err != nil {
				errs <- err
				return
			}
			pids[i] = resp.PID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatalf("start %d sessions: %v", n, err)
	}
	return c, pids, srv
}

// trackingModes are the modes the scale benchmarks compare: without
// cgroups (macOS, Windows, containers without delegation) and with them
// where this machine lets agentd create them.
func trackingModes() []string { return []string{agentd.CgroupOff, agentd.CgroupAuto} }

// BenchmarkExecBesideSessions measures an exec of `true` (create with
// wait_ms until its exit is answered) beside 0 and 2,000 running
// sessions, with and without cgroups, started by agentd itself and by its
// spawner: tracking a session's processes costs the session's own
// processes, not a scan of every session, and with the spawner a start
// does not copy and close the descriptors of every session either. (The
// spawner needs the subreaper, which this benchmark's process then is;
// run it alone.)
//
//	go test -run '^$' -bench BenchmarkExecBesideSessions -benchtime 200x ./internal/agentd/
func BenchmarkExecBesideSessions(b *testing.B) {
	for _, spawner := range []bool{false, true} {
		for _, mode := range trackingModes() {
			for _, idle := range []int{0, 2000} {
				b.Run(fmt.Sprintf("spawner=%t/cgroup=%s/idle=%d", spawner, mode, idle), func(b *testing.B) {
					execBeside(b, agentd.Config{Cgroup: mode, Spawner: spawner, Subreaper: spawner}, idle, 0)
				})
			}
		}
	}
	// Past MaxEndedSessions ended sessions (every exec leaves one for
	// SessionTTL), each start reclaims the oldest: what that costs.
	b.Run(fmt.Sprintf("spawner=true/cgroup=%s/idle=2000/ended=%d", agentd.CgroupAuto, agentd.DefaultMaxEndedSessions+100), func(b *testing.B) {
		execBeside(b, agentd.Config{Cgroup: agentd.CgroupAuto, Spawner: true, Subreaper: true}, 2000, agentd.DefaultMaxEndedSessions+100)
	})
}

// execBeside times execs of `true` on an agentd of cfg running idle
// `sleep`s and holding ended ended sessions.
func execBeside(b *testing.B, cfg agentd.Config, idle, ended int) {
	c, _, _ := scaleServerWith(b, cfg, idle, "")
	timeTrue(b, c, ended)
}

// BenchmarkShutdownBesideSessions measures Close (what SIGTERM runs) with
// 2,000 running `sleep 600` sessions, reported as shutdown-s, and how many
// session process groups were left when it returned (groups-left: Close
// stops waiting after the kill and drain graces plus 2 s, which a loaded
// machine can pass); it fails if any group is still there 30 s later.
//
//	go test -run '^$' -bench BenchmarkShutdownBesideSessions -benchtime 1x ./internal/agentd/
func BenchmarkShutdownBesideSessions(b *testing.B) {
	for _, mode := range trackingModes() {
		b.Run("cgroup="+mode, func(b *testing.B) {
			var total time.Duration
			left := 0
			for range b.N {
				b.StopTimer()
				_, pids, srv := scaleServer(b, mode, 2000, "")
				b.StartTimer()
				start := time.Now()
				srv.Close()
				total += time.Since(start)
				b.StopTimer()
				left += len(groupsLeft(pids))
				deadline := time.Now().Add(30 * time.Second)
				for len(groupsLeft(pids)) > 0 && time.Now().Before(deadline) {
					time.Sleep(100 * time.Millisecond)
				}
				assertGroupsGone(b, pids)
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "shutdown-s")
			b.ReportMetric(float64(left)/float64(b.N), "groups-left")
		})
	}
}

// groupsLeft lists the leaders whose process group still has a live
// (not zombie) process: a killed process that its parent has not reaped
// yet is dead.
func groupsLeft(leaders []int) []int {
	want := make(map[int]bool, len(leaders))
	for _, pid := range leaders {
		want[pid] = true
	}
	entries, _ := os.ReadDir("/proc")
	seen := map[int]bool{}
	for _, e := range entries {
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(st), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(st[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		var pgrp int
		if _, err := fmt.Sscanf(f[2], "%d", &pgrp); err == nil && want[pgrp] {
			seen[pgrp] = true
		}
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	return out
}

// TestCloseEndsEverySessionWithoutCgroups proves that shutting agentd
// down without cgroups ends every process of every running session: each
// session's process group, and a process that left it (setsid) before
// the shutdown.
func TestCloseEndsEverySessionWithoutCgroups(t *testing.T) {
	// Unique to this run: an escapee of another run is not this one's.
	marker := fmt.Sprintf("sleep %d", 7_000_000+os.Getpid())
	_, pids, srv := scaleServer(t, agentd.CgroupOff, 200, "setsid sh -c '"+marker+"' >/dev/null 2>&1 </dev/null & ")
	// The escapees run (one per session) before the shutdown.
	deadline := time.Now().Add(time.Minute)
	for len(processesRunning(marker)) < len(pids) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d escapees started", len(processesRunning(marker)), len(pids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	// Close waits a bounded time for the ends (a loaded machine may pass
	// it); the kills it started must end every group all the same.
	deadline = time.Now().Add(30 * time.Second)
	for len(groupsLeft(pids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	assertGroupsGone(t, pids)
	// Killed escapees are reparented to init, which reaps them.
	deadline = time.Now().Add(30 * time.Second)
	for left := processesRunning(marker); len(left) > 0; left = processesRunning(marker) {
		if time.Now().After(deadline) {
			t.Fatalf("%d escapees outlived the shutdown: %v", len(left), left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertGroupsGone fails unless no live process is left in any leader's
// process group.
func assertGroupsGone(tb testing.TB, leaders []int) {
	tb.Helper()
	for _, pid := range leaders {
		if pid <= 0 {
			tb.Fatalf("a session without a pid: %v", leaders)
		}
	}
	if left := groupsLeft(leaders); len(left) > 0 {
		tb.Fatalf("the process groups of %d session leaders outlived the shutdown: %v", len(left), left)
	}
}

// processesRunning lists the live (not zombie) processes whose command
// line is cmdline.
func processesRunning(cmdline string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ") != cmdline {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && len(st) > i+2 && (st[i+2] == 'Z' || st[i+2] == 'X') {
				continue
			}
		}
		out = append(out, pid)
	}
	return out
}
