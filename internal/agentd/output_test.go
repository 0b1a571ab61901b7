//go:build unix

package agentd_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) []byte {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return []byte(b.String())
}

// checker verifies that a poller's view is an honest account of full: every
// chunk lands exactly where the dropped-byte counts say it must.
type checker struct {
	full    []byte
	off     int
	lastID  uint64
	dropped uint64
}

func (c *checker) add(t *testing.T, r *agentd.SessionResponse) {
	t.Helper()
	if r.Truncated != (r.DroppedBytes > 0) {
		t.Fatalf("truncated=%v with dropped_bytes=%d", r.Truncated, r.DroppedBytes)
	}
	c.off += int(r.DroppedBytes)
	c.dropped += r.DroppedBytes
	for i, ch := range r.Chunks {
		if ch.ID <= c.lastID {
			t.Fatalf("chunk %d seen after chunk %d", ch.ID, c.lastID)
		}
		if i > 0 && ch.ID != r.Chunks[i-1].ID+1 {
			t.Fatalf("gap inside one response: %d after %d", ch.ID, r.Chunks[i-1].ID)
		}
		if i == 0 && !r.Truncated && c.lastID != 0 && ch.ID != c.lastID+1 {
			t.Fatalf("chunks %d..%d lost without truncation", c.lastID+1, ch.ID-1)
		}
		c.lastID = ch.ID
		end := c.off + len(ch.Data)
		if end > len(c.full) || !bytes.Equal(c.full[c.off:end], ch.Data) {
			t.Fatalf("chunk %d does not match the output at offset %d", ch.ID, c.off)
		}
		c.off = end
	}
	if len(r.Chunks) > 0 && r.NextCursor != c.lastID {
		t.Fatalf("next_cursor %d; want %d", r.NextCursor, c.lastID)
	}
}

func TestRingOverflowReportsTruncation(t *testing.T) {
	t.Parallel()
	const ringBytes = 4096
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.RingBytes = ringBytes }))
	ctx := testCtx(t)
	// Reading "start" before the rest is written makes it its own first
	// chunk (chunks grow only while unread), so a cursor of 1 has seen
	// exactly 5 bytes.
	full := append([]byte("start"), seqOutput(20000)...)
	stdinPath := filepath.Join(t.TempDir(), "go")
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{
		Command: fmt.Sprintf("printf start; while [ ! -e %s ]; do sleep 0.01; done; seq 1 20000", stdinPath),
	})
	if err != nil {
		t.Fatal(err)
	}
	var first streams
	waitOutput(t, c, resp.SessionID, 0, &first, "start")
	if err := os.WriteFile(stdinPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if resp, err = c.Follow(ctx, resp.SessionID, 1, nil); err != nil {
		t.Fatal(err)
	}
	if resp.State != agentd.StateExited {
		t.Fatalf("state %s", resp.State)
	}
	tests := []struct {
		name   string
		cursor uint64
	}{
		{"from the start", 0},
		{"from an evicted chunk", 1},
		{"from the newest chunk", resp.NextCursor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := c.Poll(ctx, resp.SessionID, tt.cursor, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for _, ch := range r.Chunks {
				got += len(ch.Data)
			}
			if tt.cursor == resp.NextCursor {
				if got != 0 || r.Truncated {
					t.Fatalf("at the head: %d bytes, truncated %v", got, r.Truncated)
				}
				return
			}
			if !r.Truncated || got > ringBytes || got == 0 {
				t.Fatalf("truncated %v with %d bytes kept", r.Truncated, got)
			}
			var seen uint64
			if tt.cursor == 1 {
				seen = 5
			}
			if seen+r.DroppedBytes+uint64(got) != uint64(len(full)) {
				t.Fatalf("seen %d + dropped %d + kept %d != total %d", seen, r.DroppedBytes, got, len(full))
			}
			ck := checker{full: full, off: int(seen), lastID: tt.cursor}
			ck.add(t, r)
		})
	}
	if _, err := c.Poll(ctx, resp.SessionID, resp.NextCursor+1, 0); err == nil {
		t.Fatal("a cursor ahead of the output was accepted")
	}
}

func TestConcurrentPollersSeeConsistentSequences(t *testing.T) {
	t.Parallel()
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.RingBytes = 8 << 10 }))
	ctx := testCtx(t)
	const n = 30000
	full := seqOutput(n)
	// Print in bursts so output keeps arriving while the pollers run.
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{
		Command: fmt.Sprintf("i=0; while [ $i -lt %d ]; do seq $((i+1)) $((i+1000)); i=$((i+1000)); sleep 0.01; done", n),
	})
	if err != nil {
		t.Fatal(err)
	}
	pollers := []struct {
		name  string
		pause time.Duration
	}{
		{"eager", 0},
		{"slow", 30 * time.Millisecond},
		{"very slow", 150 * time.Millisecond},
	}
	var wg sync.WaitGroup
	results := make([]checker, len(pollers))
	for i, p := range pollers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ck := &results[i]
			ck.full = full
			cursor := uint64(0)
			for {
				r, err := c.Poll(ctx, resp.SessionID, cursor, 2*time.Second)
				if err != nil {
					t.Errorf("%s: %v", p.name, err)
					return
				}
				ck.add(t, r)
				cursor = r.NextCursor
				if r.State != agentd.StateRunning {
					return
				}
				time.Sleep(p.pause)
			}
		}()
	}
	wg.Wait()
	for i, ck := range results {
		if ck.off != len(full) {
			t.Errorf("%s: accounted for %d of %d bytes", pollers[i].name, ck.off, len(full))
		}
	}
}

func TestBlockingOverflowLosesNothing(t *testing.T) {
	t.Parallel()
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.RingBytes = 4096 }))
	res, err := c.Run(testCtx(t), agentd.CreateSessionRequest{Command: "seq 1 200000", Overflow: agentd.OverflowBlock})
	if err != nil {
		t.Fatal(err)
	}
	if res.DroppedBytes != 0 || !bytes.Equal(res.Stdout, seqOutput(200000)) {
		t.Fatalf("dropped %d bytes, got %d bytes", res.DroppedBytes, len(res.Stdout))
	}
}
