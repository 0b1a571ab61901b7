//go:build unix

package agentd_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// Regression tests for issue 17 (agentd under hostile commands) that need
// no separate agentd process; the process-level ones are in cmd/agentd.

// TestPollCostsWhatItReturns covers finding 1: however many chunks are
// buffered, one response carries at most the poll byte cap, and a reader
// that continues from next_cursor while more is set gets everything.
func TestPollCostsWhatItReturns(t *testing.T) {
	t.Parallel()
	const pollBytes = 64 << 10
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) {
		cfg.RingBytes = 1 << 20
		cfg.PollBytes = pollBytes
	}))
	ctx := testCtx(t)
	// 20000 lines, written one write(2) each: without coalescing every
	// line would be a chunk.
	full := seqOutput(20000)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "seq 1 20000 | while read -r l; do echo \"$l\"; done", WaitMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if resp.State != agentd.StateExited {
		t.Fatalf("state %s", resp.State)
	}
	if size := dataBytes(resp); size > pollBytes || !resp.More {
		t.Fatalf("create answered %d bytes (more %v); want at most %d and more", size, resp.More, pollBytes)
	}
	// All output fits the ring, so the whole of it arrives, in pieces.
	ck := checker{full: full}
	cursor, polls := uint64(0), 0
	for {
		r, err := c.Poll(ctx, resp.SessionID, cursor, 0)
		if err != nil {
			t.Fatal(err)
		}
		polls++
		if size := dataBytes(r); size > pollBytes {
			t.Fatalf("a poll answered %d bytes; the cap is %d", size, pollBytes)
		}
		ck.add(t, r)
		cursor = r.NextCursor
		if !r.More {
			break
		}
	}
	if ck.off != len(full) || ck.dropped != 0 {
		t.Fatalf("read %d of %d bytes, %d dropped", ck.off, len(full), ck.dropped)
	}
	if polls < 2 {
		t.Fatalf("%d polls for %d bytes with a %d-byte cap", polls, len(full), pollBytes)
	}
	// Few chunks hold the many writes: each chunk costs overhead.
	if ck.lastID > uint64(len(full)/64) {
		t.Fatalf("%d chunks for %d bytes: small writes were not coalesced", ck.lastID, len(full))
	}
	// Run (and so Follow) gathers everything despite the cap.
	res, err := c.Run(ctx, agentd.CreateSessionRequest{Command: "seq 1 20000", WaitMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, full) {
		t.Fatalf("Run collected %d bytes; want %d", len(res.Stdout), len(full))
	}
}

func dataBytes(r *agentd.SessionResponse) int {
	n := 0
	for _, c := range r.Chunks {
		n += len(c.Data)
	}
	return n
}

// TestHugeWaitMSWaits covers finding 9's overflow: a wait_ms so large that
// multiplying it overflowed must still wait (up to the 60 s maximum)
// instead of answering at once.
func TestHugeWaitMSWaits(t *testing.T) {
	t.Parallel()
	url, token := agentdtest.Start(t)
	status, body := do(t, "POST", url+"/v1/sessions", token, `{"command":"sleep 0.3; echo done","wait_ms":9223372036854776}`)
	if status != http.StatusCreated || !strings.Contains(string(body), `"state":"exited"`) {
		t.Fatalf("status %d body %s; want a finished session", status, body)
	}
}

// TestFetchRefusesPrivateRedirects covers finding 10: a download may not be
// redirected to loopback, link-local or metadata addresses unless allowed.
func TestFetchRefusesPrivateRedirects(t *testing.T) {
	t.Parallel()
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("internal"))
	}))
	t.Cleanup(target.Close)
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		to := map[string]string{
			"/loopback":  target.URL,
			"/localhost": strings.Replace(target.URL, "127.0.0.1", "localhost", 1),
			"/metadata":  "http://169.254.169.254/latest/meta-data/",
			"/mapped":    strings.Replace(target.URL, "127.0.0.1", "[::ffff:127.0.0.1]", 1),
		}[r.URL.Path]
		http.Redirect(w, r, to, http.StatusFound)
	}))
	t.Cleanup(src.Close)
	strict := newClient(t, agentdtest.WithRoot(t.TempDir()))
	allowing := newClient(t, agentdtest.WithRoot(t.TempDir()), agentdtest.WithConfig(func(cfg *agentd.Config) {
		cfg.FetchAllowPrivateRedirects = true
	}))
	for _, path := range []string{"/loopback", "/localhost", "/metadata", "/mapped"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			_, err := strict.Fetch(testCtx(t), agentd.FetchRequest{URL: src.URL + path, Path: "x"})
			var e *agentd.Error
			if !errors.As(err, &e) || e.Code != agentd.CodeFetchFailed || !strings.Contains(e.Message, "refused") {
				t.Fatalf("redirect followed or failed otherwise: %v", err)
			}
		})
	}
	// The initial URL may be loopback (the caller chose it), and the flag
	// allows redirects there.
	if _, err := strict.Fetch(testCtx(t), agentd.FetchRequest{URL: target.URL, Path: "direct"}); err != nil {
		t.Fatalf("direct loopback fetch: %v", err)
	}
	if _, err := allowing.Fetch(testCtx(t), agentd.FetchRequest{URL: src.URL + "/loopback", Path: "x"}); err != nil {
		t.Fatalf("with FetchAllowPrivateRedirects: %v", err)
	}
}

// TestHardLinkPolicy covers finding 10's hard links: a command's hard link
// to a file outside the root is served by default (the command could read
// the file itself; see docs/agentd-protocol.md) and refused with
// RefuseHardLinks.
func TestHardLinkPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		refuse bool
		want   error
	}{
		{"default", false, nil},
		{"refused", true, agentd.ErrPathOutsideRoot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root, outside := confinedRoot(t)
			c := newClient(t, agentdtest.WithRoot(root), agentdtest.WithConfig(func(cfg *agentd.Config) {
				cfg.RefuseHardLinks = tt.refuse
			}))
			ctx := testCtx(t)
			res, err := c.Run(ctx, agentd.CreateSessionRequest{Command: fmt.Sprintf("ln %s linked", filepath.Join(outside, "secret.txt")), WaitMS: 10000})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("ln: %v %+v", err, res)
			}
			data, _, err := c.ReadFile(ctx, "linked", 0, 0)
			if !errors.Is(err, tt.want) || (tt.want == nil && string(data) != "secret") {
				t.Fatalf("read: %q %v; want error %v", data, err, tt.want)
			}
			// Files with one link stay readable either way.
			if _, _, err := c.ReadFile(ctx, "hello.txt", 0, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFIFOIsRefused covers finding 6 in-process: a FIFO is refused at
// once, not opened for a writer that never comes.
func TestFIFOIsRefused(t *testing.T) {
	t.Parallel()
	root, _ := confinedRoot(t)
	c := newClient(t, agentdtest.WithRoot(root))
	if _, _, err := c.ReadFile(testCtx(t), "fifo", 0, 0); !errors.Is(err, agentd.ErrBadRequest) {
		t.Fatalf("fifo read: %v; want bad_request", err)
	}
	if _, err := os.Stat(filepath.Join(root, "fifo")); err != nil {
		t.Fatal(err)
	}
}
