package recorder

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

func chunks(from, to uint64, size int) []agentd.Chunk {
	var out []agentd.Chunk
	for i := from; i <= to; i++ {
		out = append(out, agentd.Chunk{ID: i, Stream: "stdout", Data: bytes.Repeat([]byte{'a' + byte(i%26)}, size)})
	}
	return out
}

// TestLiveOutput proves the window clients' polls are answered from: what
// the follower read after a cursor, as agentd would answer it, a waiting
// poll woken by the next read, clients behind the window sent to the
// recording and polls of a command not followed (or whose follower is
// stalled) sent to agentd.
func TestLiveOutput(t *testing.T) {
	t.Parallel()
	f := &Followers{}
	k := liveKey{"acme", 7}
	ctx := context.Background()
	running := func(next uint64, cs []agentd.Chunk) *agentd.SessionResponse {
		return &agentd.SessionResponse{State: agentd.StateRunning, Chunks: cs, NextCursor: next}
	}
	if _, st, _ := f.ReadLive(ctx, "acme", nil, 7, 0, 0); st != LiveUnknown {
		t.Fatalf("a command not followed: %v", st)
	}
	f.publish(k, nil, 0, running(3, chunks(1, 3, 10)))
	cases := []struct {
		name   string
		cursor uint64
		st     LiveStatus
		first  uint64
		n      int
		next   uint64
	}{
		{"from the start", 0, LiveAnswered, 1, 3, 3},
		{"after a cursor", 2, LiveAnswered, 3, 1, 3},
		{"ahead of the follower", 9, LiveUnknown, 0, 0, 0},
	}
	for _, c := range cases {
		resp, st, err := f.ReadLive(ctx, "acme", nil, 7, c.cursor, 0)
		if err != nil || st != c.st {
			t.Fatalf("%s: status %v, %v", c.name, st, err)
		}
		if st == LiveAnswered && (len(resp.Chunks) != c.n || resp.Chunks[0].ID != c.first || resp.NextCursor != c.next || resp.State != agentd.StateRunning) {
			t.Fatalf("%s: %+v", c.name, resp)
		}
	}
	t.Run("a waiting poll wakes with the next read", func(t *testing.T) {
		got := make(chan *agentd.SessionResponse, 1)
		go func() {
			resp, _, _ := f.ReadLive(ctx, "acme", nil, 7, 3, time.Minute)
			got <- resp
		}()
		// Publish until the waiter has taken it (it may start waiting
		// before or after this read).
		f.publish(k, nil, 3, running(4, chunks(4, 4, 10)))
		resp := <-got
		if len(resp.Chunks) != 1 || resp.Chunks[0].ID != 4 {
			t.Fatalf("woken with %+v", resp)
		}
	})
	t.Run("nothing new within the wait", func(t *testing.T) {
		resp, st, err := f.ReadLive(ctx, "acme", nil, 7, 4, time.Millisecond)
		if err != nil || st != LiveAnswered || len(resp.Chunks) != 0 || resp.NextCursor != 4 || resp.State != agentd.StateRunning {
			t.Fatalf("%+v %v %v", resp, st, err)
		}
	})
	t.Run("a client behind the window reads the recording", func(t *testing.T) {
		// Past the window's size, stored chunks leave it.
		big := chunks(5, 12, 2<<20-chunkOverhead)
		f.publish(k, nil, 4, running(12, big))
		f.storedTo(k, 12)
		if _, st, _ := f.ReadLive(ctx, "acme", nil, 7, 1, 0); st != LiveBehind {
			t.Fatalf("cursor 1 after the window moved: %v", st)
		}
		resp, st, _ := f.ReadLive(ctx, "acme", nil, 7, 10, 0)
		if st != LiveAnswered || len(resp.Chunks) != 2 || resp.Chunks[0].ID != 11 {
			t.Fatalf("cursor 10: %v %+v", st, resp)
		}
	})
	t.Run("an answer is capped, the rest said to be more", func(t *testing.T) {
		resp, _, _ := f.ReadLive(ctx, "acme", nil, 7, 8, 0)
		if len(resp.Chunks) != 2 || !resp.More || resp.NextCursor != 10 {
			t.Fatalf("%d chunks, more %v, next %d", len(resp.Chunks), resp.More, resp.NextCursor)
		}
	})
	t.Run("the end comes with the last chunk", func(t *testing.T) {
		exit := 0
		f.publish(k, nil, 12, &agentd.SessionResponse{State: agentd.StateExited, ExitCode: &exit, Chunks: chunks(13, 13, 200), NextCursor: 13})
		resp, _, _ := f.ReadLive(ctx, "acme", nil, 7, 10, 0)
		if resp.State != agentd.StateRunning || !resp.More {
			t.Fatalf("the end said before the output: %+v", resp.State)
		}
		resp, _, _ = f.ReadLive(ctx, "acme", nil, 7, 12, 0)
		if resp.State != agentd.StateExited || resp.More || resp.NextCursor != 13 || *resp.ExitCode != 0 {
			t.Fatalf("last answer %+v", resp)
		}
	})
	t.Run("a stalled follower sends clients to agentd", func(t *testing.T) {
		f.live.stalled(k)
		if _, st, _ := f.ReadLive(ctx, "acme", nil, 7, 12, 0); st != LiveUnknown {
			t.Fatalf("stalled: %v", st)
		}
		f.live.forget(k)
		if f.liveCount() != 0 {
			t.Fatal("forgotten command still has a window")
		}
	})
}

// TestLiveBudget: 50 followed commands each printing 9 MiB keep every
// window together within the budget, stored bytes leaving first, oldest
// first; a poll from cursor 0 of any of them still gets all its output
// (what left the window from the recording, as a late reader does).
func TestLiveBudget(t *testing.T) {
	t.Parallel()
	const (
		commands = 50
		chunk    = 64 << 10
		perCmd   = 9 << 20 / chunk // chunks each command prints
	)
	data := bytes.Repeat([]byte{'x'}, chunk) // shared: the test holds 64 KiB, not 450 MiB
	ctx := context.Background()
	t.Run("stored output", func(t *testing.T) {
		t.Parallel()
		f := &Followers{}
		for id := uint64(1); id <= perCmd; id++ {
			for cmd := int64(1); cmd <= commands; cmd++ {
				k := liveKey{"acme", cmd}
				f.publish(k, nil, id-1, &agentd.SessionResponse{State: agentd.StateRunning, NextCursor: id,
					Chunks: []agentd.Chunk{{ID: id, Stream: agentd.StreamStdout, Data: data}}})
				if held := f.LiveWindow().Held; held > DefaultLiveBudget {
					t.Fatalf("after chunk %d of command %d the windows hold %d bytes, over the budget of %d", id, cmd, held, DefaultLiveBudget)
				}
				f.storedTo(k, id)
			}
		}
		u := f.LiveWindow()
		held, evicted := u.Held, u.Evicted
		if held > DefaultLiveBudget || evicted == 0 {
			t.Fatalf("windows hold %d bytes (budget %d), %d evicted", held, DefaultLiveBudget, evicted)
		}
		if want := int64(commands*perCmd*(chunk+chunkOverhead)) - held; evicted < want-commands*liveWindow {
			t.Fatalf("%d bytes evicted, want at least %d", evicted, want-commands*liveWindow)
		}
		for cmd := int64(1); cmd <= commands; cmd++ {
			// The recording holds every chunk (all were stored).
			cursor, n := uint64(0), 0
			for cursor < perCmd {
				resp, st, err := f.ReadLive(ctx, "acme", nil, cmd, cursor, 0)
				switch {
				case err != nil:
					t.Fatal(err)
				case st == LiveBehind:
					// As the gateway does: read the recording after cursor.
					cursor++
					n++
				case st == LiveAnswered:
					for _, ch := range resp.Chunks {
						if ch.ID != cursor+1 || len(ch.Data) != chunk {
							t.Fatalf("command %d: chunk %d after cursor %d", cmd, ch.ID, cursor)
						}
						cursor = ch.ID
						n++
					}
				default:
					t.Fatalf("command %d at cursor %d: %v", cmd, cursor, st)
				}
			}
			if n != perCmd {
				t.Fatalf("command %d: read %d chunks from cursor 0, want %d", cmd, n, perCmd)
			}
		}
	})
	t.Run("output not stored yet", func(t *testing.T) {
		t.Parallel()
		f := &Followers{LiveBudget: 32 << 20}
		for id := uint64(1); id <= perCmd; id++ {
			for cmd := int64(1); cmd <= commands; cmd++ {
				f.publish(liveKey{"acme", cmd}, nil, id-1, &agentd.SessionResponse{State: agentd.StateRunning, NextCursor: id,
					Chunks: []agentd.Chunk{{ID: id, Stream: agentd.StreamStdout, Data: data}}})
				if held := f.LiveWindow().Held; held > 32<<20 {
					t.Fatalf("windows hold %d bytes, over the budget", held)
				}
			}
		}
		// A client behind the window is sent away (to agentd, which
		// holds what is not stored); the newest output is still served.
		if _, st, _ := f.ReadLive(ctx, "acme", nil, 1, 0, 0); st != LiveBehind {
			t.Fatalf("cursor 0: %v, want behind", st)
		}
		resp, st, _ := f.ReadLive(ctx, "acme", nil, commands, perCmd-1, 0)
		if st != LiveAnswered || len(resp.Chunks) != 1 || resp.Chunks[0].ID != perCmd {
			t.Fatalf("the newest chunk: %v %+v", st, resp)
		}
		for cmd := int64(1); cmd <= commands; cmd++ {
			f.live.forget(liveKey{"acme", cmd})
		}
		if held := f.LiveWindow().Held; held != 0 {
			t.Fatalf("%d bytes held once every window is forgotten", held)
		}
	})
}
