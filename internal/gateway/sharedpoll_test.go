package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// TestAbandonedPollsEndAtAgentd: long-polls whose clients hang up leave no
// request waiting at agentd. Before the fix the shared request outlived its
// last waiter for the whole wait (up to 60 s), so a client opening polls
// with ever new cursors and hanging up at once piled up goroutines and
// connections to agentd at no cost to itself. Polls that stay share one
// request, as before.
func TestAbandonedPollsEndAtAgentd(t *testing.T) {
	const token = "test-token-0123456789abcdef"
	srv, err := agentd.NewServer(agentd.Config{Token: token, Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var open, peeks atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			peeks.Add(1)
			open.Add(1)
			defer open.Add(-1)
		}
		srv.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	ctx := context.Background()
	c := agentd.NewClient(ts.URL, token, ts.Client())
	const n = 5
	for i := range n {
		if _, err := c.CreateSession(ctx, agentd.CreateSessionRequest{ID: fmt.Sprintf("quiet-%d", i), Command: "sleep 60"}); err != nil {
			t.Fatal(err)
		}
	}
	g := &Gateway{HTTP: ts.Client()}
	target := sessions.Target{AgentdURL: ts.URL, AgentdToken: token}

	t.Run("polls that hang up", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range n {
			pctx, cancel := context.WithCancel(ctx)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = g.peek(pctx, target, fmt.Sprintf("quiet-%d", i), 0, time.Minute)
			}()
			// Hang up once the request is out.
			for peeks.Load() <= int64(i) {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}
		wg.Wait()
		if got := g.polls.inflightPolls(); got != 0 {
			t.Fatalf("%d shared requests outlived their clients", got)
		}
		deadline := time.Now().Add(20 * time.Second)
		for open.Load() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d requests still wait at agentd for clients that hung up", open.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	t.Run("polls that stay share one request", func(t *testing.T) {
		before := peeks.Load()
		var wg sync.WaitGroup
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := g.peek(ctx, target, "quiet-0", 0, 300*time.Millisecond)
				if err != nil || out.State != agentd.StateRunning {
					t.Errorf("poll: %+v %v", out, err)
				}
			}()
		}
		wg.Wait()
		if got := peeks.Load() - before; got < 1 || got > 5 {
			t.Errorf("10 concurrent polls of one command and cursor made %d requests to agentd", got)
		}
	})
}
