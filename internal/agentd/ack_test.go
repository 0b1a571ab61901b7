//go:build unix

package agentd_test

import (
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// TestPeekReleasesNothing: in blocking mode a reader that only peeks
// (a person watching) never lets agentd drop output; the acknowledging
// reader (the recorder) gets every byte.
func TestPeekReleasesNothing(t *testing.T) {
	t.Parallel()
	c := agentdtest.Client(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.RingBytes = 64 << 10 }))
	ctx := testCtx(t)
	const total = 1 << 20
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "head -c 1048576 /dev/zero | tr '\\0' a", Overflow: agentd.OverflowBlock})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.SessionID
	// A watcher racing ahead: it sees what is buffered, and the command
	// stays held back because nobody acknowledged it.
	peeked := uint64(0)
	for i := 0; i < 20; i++ {
		p, err := c.Peek(ctx, id, peeked, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if p.NextCursor > peeked {
			peeked = p.NextCursor
		}
		if p.Truncated {
			t.Fatal("peeking made agentd drop output")
		}
	}
	if p, _ := c.Peek(ctx, id, 0, 0); p.State != agentd.StateRunning {
		t.Fatalf("the command finished (%s) with only peekers: output was released", p.State)
	}
	// The recorder reads from the start and gets all of it.
	got := 0
	cursor := uint64(0)
	for {
		p, err := c.Poll(ctx, id, cursor, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if p.Truncated {
			t.Fatal("the acknowledging reader lost output")
		}
		for _, ch := range p.Chunks {
			got += len(ch.Data)
		}
		cursor = p.NextCursor
		if p.State != agentd.StateRunning && !p.More {
			break
		}
	}
	if got != total {
		t.Fatalf("recorder read %d bytes, want %d", got, total)
	}
}

// TestReadAheadReleasesOnlyWhatWasStored: a recorder reading ahead with
// ack_to keeps the chunks past ack_to held (a second reader from ack_to
// still gets them, nothing dropped), and the command only finishes once
// the recorder has acknowledged everything.
func TestReadAheadReleasesOnlyWhatWasStored(t *testing.T) {
	t.Parallel()
	c := agentdtest.Client(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.RingBytes = 64 << 10 }))
	ctx := testCtx(t)
	const total = 1 << 20
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "head -c 1048576 /dev/zero | tr '\\0' a", Overflow: agentd.OverflowBlock})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.SessionID
	// Read far ahead while acknowledging nothing past 0: the ring fills and
	// the command stays held.
	ahead := uint64(0)
	for i := 0; i < 20; i++ {
		p, err := c.ReadAhead(ctx, id, ahead, 0, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if p.Truncated {
			t.Fatal("reading ahead made agentd drop output")
		}
		ahead = max(ahead, p.NextCursor)
	}
	if p, _ := c.Peek(ctx, id, 0, 0); p.State != agentd.StateRunning || len(p.Chunks) == 0 || p.Chunks[0].ID != 1 {
		t.Fatalf("after reading ahead with ack_to=0: state %s, first chunk %v; want running with chunk 1 still held", p.State, p.Chunks)
	}
	// The recorder, one batch behind: it acknowledges what it read the
	// time before, and gets every byte.
	got, cursor, stored := 0, uint64(0), uint64(0)
	for {
		p, err := c.ReadAhead(ctx, id, cursor, stored, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if p.Truncated {
			t.Fatal("the reading-ahead recorder lost output")
		}
		for _, ch := range p.Chunks {
			got += len(ch.Data)
		}
		stored, cursor = cursor, p.NextCursor
		if p.State != agentd.StateRunning && !p.More {
			break
		}
	}
	if got != total {
		t.Fatalf("recorder read %d bytes, want %d", got, total)
	}
}
