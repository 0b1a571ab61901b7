package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// Memory is the console's resident memory around a burst of idle
// long-polls.
type Memory struct {
	Polls int
	// Before, During and After are VmRSS of this process: before the
	// polls, while all of them wait, and after they ended (after a GC
	// that returns freed memory to the system).
	Before, During, After int64
	// HeapBefore, HeapDuring and HeapAfter are the Go heap in use.
	HeapBefore, HeapDuring, HeapAfter uint64
	// StackDuring is the memory of goroutine stacks while they wait.
	StackDuring uint64
	Goroutines  int
	// Answered counts the polls that ended with 200 once the command was
	// killed.
	Answered int
}

// IdlePolls starts `sleep` through the gateway, holds n long-polls of its
// output open (wait_ms 30000) and reads the process's RSS while they wait
// and after they end. The polls are raw HTTP requests written on n
// connections with no goroutine or buffer behind them, so the client side
// adds next to nothing to the process's memory.
func (s *Stack) IdlePolls(ctx context.Context, n int) (Memory, error) {
	m := Memory{Polls: n}
	gw := GatewayPath{S: s}
	id, _, err := gw.Exec(ctx, agentd.CreateSessionRequest{Command: "sleep 300"})
	if err != nil {
		return m, err
	}
	// Read the baseline with the command running and its follower started.
	time.Sleep(200 * time.Millisecond)
	m.Before, m.HeapBefore = settledRSS()
	u, err := url.Parse(s.URL)
	if err != nil {
		return m, err
	}
	q := url.Values{"cursor": {"0"}, "wait_ms": {"30000"}}
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: application/json\r\n\r\n",
		s.sessionPath("/commands/%s/output?%s", id, q.Encode()), u.Host, s.Key)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			return m, fmt.Errorf("open long-poll %d: %w", len(conns)+1, err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte(req)); err != nil {
			return m, fmt.Errorf("send long-poll %d: %w", len(conns), err)
		}
	}
	// Wait until every poll is inside the handler and the goroutine count
	// stops moving (each has reached agentd).
	if err := s.waitPolls(ctx, n); err != nil {
		return m, err
	}
	m.Goroutines = runtime.NumGoroutine()
	m.During = rss()
	if s.HeapProfile != "" {
		runtime.GC() // the profile shows the heap as of the last collection
		if err := writeHeapProfile(s.HeapProfile); err != nil {
			return m, err
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.HeapDuring, m.StackDuring = ms.HeapInuse, ms.StackInuse
	if err := gw.Kill(ctx, id); err != nil {
		return m, err
	}
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			if resp.StatusCode == http.StatusOK {
				m.Answered++
			}
			_ = resp.Body.Close()
		}
		_ = c.Close()
	}
	conns = nil
	// Let the server notice the closed connections and the transport's
	// idle connections to agentd time out of use.
	time.Sleep(time.Second)
	m.After, m.HeapAfter = settledRSS()
	return m, nil
}

// waitPolls waits until n output polls are in the handler and the number
// of goroutines has been steady for half a second.
func (s *Stack) waitPolls(ctx context.Context, n int) error {
	deadline := time.Now().Add(60 * time.Second)
	last, steady := 0, time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		g := runtime.NumGoroutine()
		if g != last {
			last, steady = g, time.Now()
		}
		if s.Profile.inFlight("output poll") >= n && time.Since(steady) > 500*time.Millisecond {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d long-polls arrived", s.Profile.inFlight("output poll"), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settledRSS collects garbage, returns freed memory to the system and
// reads VmRSS and the heap in use.
func settledRSS() (int64, uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return rss(), ms.HeapInuse
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return f.Close()
}

// rss is this process's resident set size in bytes (0 where /proc is
// missing).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if rest, ok := strings.CutPrefix(string(line), "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
