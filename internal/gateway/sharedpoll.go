package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Long-polls of one command from one cursor are alike: whoever asks gets
// the same answer. Many clients watching the same command (people in
// browsers, an agent runtime and its retries) share one request to
// agentd, so a thousand idle watchers cost a thousand waiting requests in
// the console and one at agentd, not a thousand connections and their
// buffers.

type pollKey struct {
	url, id string
	cursor  uint64
}

// sharedPoll is one request to agentd that several polls wait on. It
// lasts while someone waits on it: when the last waiter leaves (its client
// went away, or its own wait ended first), the request is cancelled, so
// clients that open long-polls and hang up cannot leave requests to agentd
// and their goroutines behind for the whole wait.
type sharedPoll struct {
	done chan struct{}
	resp *agentd.SessionResponse
	err  error
	// waiters is guarded by the hub's mutex.
	waiters int
	cancel  context.CancelFunc
}

type pollHub struct {
	mu       sync.Mutex
	inflight map[pollKey]*sharedPoll
}

// peek answers like agentd.Client.Peek(id, cursor, wait), sharing the
// request with concurrent polls of the same command and cursor.
func (g *Gateway) peek(ctx context.Context, t sessions.Target, id string, cursor uint64, wait time.Duration) (*agentd.SessionResponse, error) {
	if wait <= 0 {
		return g.client(t).Peek(ctx, id, cursor, 0)
	}
	deadline := time.Now().Add(wait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	k := pollKey{url: t.AgentdURL, id: id, cursor: cursor}
	for {
		call := g.polls.join(k, deadline, func(shared context.Context, until time.Time) (*agentd.SessionResponse, error) {
			// The request belongs to every waiter: no single client's
			// departure cancels it, only the last one's.
			cctx, cancel := context.WithDeadline(shared, until.Add(g.callTimeout()))
			defer cancel()
			return g.client(t).Peek(cctx, id, cursor, time.Until(until))
		}, context.WithoutCancel(ctx))
		select {
		case <-ctx.Done():
			g.polls.leave(k, call)
			return nil, ctx.Err()
		case <-timer.C:
			g.polls.leave(k, call)
			// A shared request that waits longer is still out, so nothing
			// new came within this poll's wait: say so, as agentd would.
			return &agentd.SessionResponse{SessionID: id, State: agentd.StateRunning, NextCursor: cursor, Chunks: []agentd.Chunk{}}, nil
		case <-call.done:
			g.polls.leave(k, call)
		}
		if call.err != nil || len(call.resp.Chunks) > 0 || call.resp.State != agentd.StateRunning || call.resp.More ||
			call.resp.NextCursor != cursor || !time.Now().Before(deadline.Add(-10*time.Millisecond)) {
			return call.resp, call.err
		}
		// The shared request ended before this poll's wait did, with
		// nothing new: wait on.
	}
}

// join returns the request in flight for k, or starts one with do under
// base; every join is followed by one leave.
func (h *pollHub) join(k pollKey, deadline time.Time, do func(ctx context.Context, until time.Time) (*agentd.SessionResponse, error),
	base context.Context) *sharedPoll {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inflight == nil {
		h.inflight = map[pollKey]*sharedPoll{}
	}
	if c := h.inflight[k]; c != nil {
		c.waiters++
		return c
	}
	ctx, cancel := context.WithCancel(base)
	c := &sharedPoll{done: make(chan struct{}), waiters: 1, cancel: cancel}
	h.inflight[k] = c
	go func() {
		c.resp, c.err = do(ctx, deadline)
		h.mu.Lock()
		if h.inflight[k] == c {
			delete(h.inflight, k)
		}
		h.mu.Unlock()
		cancel()
		close(c.done)
	}()
	return c
}

// leave ends one waiter's interest in c; the last one cancels it. A poll
// that joins after that starts a request of its own.
func (h *pollHub) leave(k pollKey, c *sharedPoll) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.waiters--; c.waiters > 0 {
		return
	}
	if h.inflight[k] == c {
		delete(h.inflight, k)
	}
	c.cancel()
}

// inflightPolls counts the shared requests to agentd out now.
func (h *pollHub) inflightPolls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.inflight)
}
