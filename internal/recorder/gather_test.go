package recorder

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/recordings"
)

func chunkText(chunks []agentd.Chunk) string {
	var b strings.Builder
	for _, ch := range chunks {
		if ch.Stream != agentd.StreamExec {
			b.Write(ch.Data)
		}
	}
	return b.String()
}

// TestGatherJoinsWhatFollows: a small batch of a running command waits for
// what follows and is stored with it in one commit; readers get each part
// as it arrives; agentd releases none of it meanwhile (a console that dies
// before the commit loses nothing); a command's end stops the wait.
func TestGatherJoinsWhatFollows(t *testing.T) {
	t.Parallel()
	cl := agentdtest.Client(t)
	ctx := context.Background()
	f := &Followers{Gather: 2 * time.Second}

	start := func(id, command string) {
		t.Helper()
		if _, err := cl.CreateSession(ctx, agentd.CreateSessionRequest{ID: id, Command: command, Stdin: true, Overflow: agentd.OverflowBlock}); err != nil {
			t.Fatal(err)
		}
	}
	// first reads the first batch as a follower does: acknowledging
	// nothing past what is stored (nothing yet).
	first := func(id string) *agentd.SessionResponse {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := cl.ReadAhead(ctx, id, 0, 0, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if chunkText(resp.Chunks) != "" {
				return resp
			}
			if time.Now().After(deadline) {
				t.Fatalf("no output from %s", id)
			}
		}
	}

	t.Run("what follows is joined", func(t *testing.T) {
		start("gather-cat", "cat")
		if err := cl.WriteStdin(ctx, "gather-cat", []byte("one\n"), false); err != nil {
			t.Fatal(err)
		}
		resp := first("gather-cat")
		if !gathering(resp) {
			t.Fatalf("a small batch of a running command is not gathered: %+v", resp)
		}
		go func() {
			for _, line := range []string{"two\n", "three\n"} {
				time.Sleep(50 * time.Millisecond)
				_ = cl.WriteStdin(ctx, "gather-cat", []byte(line), false)
			}
		}()
		var mu sync.Mutex
		var published []string
		joined, stamps := f.gather(ctx, cl, recordings.Command{AgentdID: "gather-cat"}, resp, func(_ uint64, r *agentd.SessionResponse) {
			mu.Lock()
			published = append(published, chunkText(r.Chunks))
			mu.Unlock()
		})
		if got := chunkText(joined.Chunks); got != "one\ntwo\nthree\n" {
			t.Fatalf("joined %q, want the three lines", got)
		}
		if len(stamps) != len(joined.Chunks) {
			t.Fatalf("%d stamps for %d chunks", len(stamps), len(joined.Chunks))
		}
		for i := 1; i < len(stamps); i++ {
			if stamps[i].Before(stamps[i-1]) {
				t.Fatalf("stamps out of order: %v", stamps)
			}
		}
		mu.Lock()
		if strings.Join(published, "") != "two\nthree\n" {
			t.Fatalf("readers were handed %q, want what followed as it came", published)
		}
		mu.Unlock()
		// Nothing was released: a successor reading from what was
		// stored (nothing) gets it all again.
		again, err := cl.Peek(ctx, "gather-cat", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := chunkText(again.Chunks); got != "one\ntwo\nthree\n" {
			t.Fatalf("after gathering, agentd holds %q from the stored cursor, want all of it", got)
		}
	})

	t.Run("the end is joined and ends the wait", func(t *testing.T) {
		start("gather-end", "read line; echo \"$line\"; sleep 0.2; echo last")
		if err := cl.WriteStdin(ctx, "gather-end", []byte("first\n"), false); err != nil {
			t.Fatal(err)
		}
		joined, _ := f.gather(ctx, cl, recordings.Command{AgentdID: "gather-end"}, first("gather-end"), func(uint64, *agentd.SessionResponse) {})
		// The exit came within the window: it is stored in the same
		// commit as the output before it (record completes the command).
		if got := chunkText(joined.Chunks); got != "first\nlast\n" || joined.State != agentd.StateExited || joined.More {
			t.Fatalf("joined %q, state %s (more %v), want both lines and the exit", got, joined.State, joined.More)
		}
		if gathering(joined) {
			t.Fatal("an ended command's batch is still being gathered")
		}
	})
}

// TestAheadWaitFor: a read ahead waits for output only after a small
// batch; after a large one (which may be all agentd can hold
// unacknowledged) it does not, so bulk output never stalls on it.
func TestAheadWaitFor(t *testing.T) {
	small := []agentd.Chunk{{ID: 1, Stream: agentd.StreamStdout, Data: []byte("k")}}
	large := []agentd.Chunk{{ID: 1, Stream: agentd.StreamStdout, Data: make([]byte, gatherBytes)}}
	for _, tc := range []struct {
		name string
		resp agentd.SessionResponse
		want time.Duration
	}{
		{"an echo", agentd.SessionResponse{State: agentd.StateRunning, Chunks: small}, aheadWait},
		{"a full batch", agentd.SessionResponse{State: agentd.StateRunning, Chunks: large}, 0},
		{"more buffered", agentd.SessionResponse{State: agentd.StateRunning, Chunks: small, More: true}, 0},
	} {
		if got := aheadWaitFor(&tc.resp); got != tc.want {
			t.Errorf("%s: wait %v, want %v", tc.name, got, tc.want)
		}
	}
}
