//go:build unix

package agentd_test

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// testCtx bounds a test's client calls; far above any expected duration.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newClient(t *testing.T, opts ...agentdtest.Option) *agentd.Client {
	t.Helper()
	return agentdtest.Client(t, opts...)
}

// streams collects a session's output per stream.
type streams struct {
	stdout, stderr, pty bytes.Buffer
	dropped             uint64
}

func (s *streams) add(r *agentd.SessionResponse) error {
	s.dropped += r.DroppedBytes
	for _, c := range r.Chunks {
		switch c.Stream {
		case agentd.StreamStdout:
			s.stdout.Write(c.Data)
		case agentd.StreamStderr:
			s.stderr.Write(c.Data)
		case agentd.StreamPTY:
			s.pty.Write(c.Data)
		}
	}
	return nil
}

// waitOutput polls until the accumulated PTY output contains want, returning
// the cursor after it.
func waitOutput(t *testing.T, c *agentd.Client, id string, cursor uint64, out *streams, want string) uint64 {
	t.Helper()
	ctx := testCtx(t)
	for !strings.Contains(out.pty.String()+out.stdout.String(), want) {
		r, err := c.Poll(ctx, id, cursor, 5*time.Second)
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		out.add(r)
		cursor = r.NextCursor
		if r.State != agentd.StateRunning && len(r.Chunks) == 0 && !strings.Contains(out.pty.String()+out.stdout.String(), want) {
			t.Fatalf("session ended (%s) before output %q; got %q", r.State, want, out.pty.String()+out.stdout.String())
		}
	}
	return cursor
}

// processGone reports whether pid no longer runs (absent or a zombie that
// nobody in this container reaps).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return os.IsNotExist(err)
	}
	// The state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z' || stat[i+2] == 'X'
	}
	return false
}

// eventually retries cond for up to 20 seconds; it does not judge speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newHTTPServer serves srv on an httptest server closed with the test.
func newHTTPServer(t *testing.T, srv *agentd.Server) string {
	t.Helper()
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close()
		ts.Close()
	})
	return ts.URL
}

// benchHTTPServer is newHTTPServer for benchmarks.
func benchHTTPServer(b *testing.B, srv *agentd.Server) string {
	b.Helper()
	ts := httptest.NewServer(srv.Handler())
	b.Cleanup(func() {
		srv.Close()
		ts.Close()
	})
	return ts.URL
}
