package proxy

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

// sharedPoll is one request to agentd that several polls wait on.
type sharedPoll struct {
	done     chan struct{}
	deadline time.Time
	resp     *agentd.SessionResponse
	err      error
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
		call := g.polls.join(k, deadline, func(until time.Time) (*agentd.SessionResponse, error) {
			// The request belongs to every waiter: no single client's
			// departure cancels it.
			cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until.Add(g.callTimeout()))
			defer cancel()
			return g.client(t).Peek(cctx, id, cursor, time.Until(until))
		})
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			// A shared request that waits longer is still out, so nothing
			// new came within this poll's wait: say so, as agentd would.
			return &agentd.SessionResponse{SessionID: id, State: agentd.StateRunning, NextCursor: cursor, Chunks: []agentd.Chunk{}}, nil
		case <-call.done:
		}
		if call.err != nil || len(call.resp.Chunks) > 0 || call.resp.State != agentd.StateRunning || call.resp.More ||
			call.resp.NextCursor != cursor || !time.Now().Before(deadline.Add(-10*time.Millisecond)) {
			return call.resp, call.err
		}
		// The shared request ended before this poll's wait did, with
		// nothing new: wait on.
	}
}

// join returns the request in flight for k, or starts one with do.
func (h *pollHub) join(k pollKey, deadline time.Time, do func(until time.Time) (*agentd.SessionResponse, error)) *sharedPoll {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inflight == nil {
		h.inflight = map[pollKey]*sharedPoll{}
	}
	if c := h.inflight[k]; c != nil {
		return c
	}
	c := &sharedPoll{done: make(chan struct{}), deadline: deadline}
	h.inflight[k] = c
	go func() {
		c.resp, c.err = do(deadline)
		h.mu.Lock()
		delete(h.inflight, k)
		h.mu.Unlock()
		close(c.done)
	}()
	return c
}
