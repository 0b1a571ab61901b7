package gateway

import (
	"context"
	"sync"

	"github.com/gatehouse/gatehouse/internal/recordings"
)

// inputHeads remembers, per command this replica wrote stdin to (or
// started), where its input chain ends, so the next keystroke is stored
// in one statement (recordings.AppendInputAfter) without reading the
// command first. Keyed by the org's database like the command cache
// (knownKey). An entry may be stale (another replica wrote, two writes
// here raced): the statement then touches nothing and the locking path
// decides, so a stale entry costs a round trip, never a wrong frame.
type inputHeads struct {
	mu sync.Mutex
	m  map[knownKey]recordings.InputHead
}

// maxInputHeads bounds the cache; past it the cache starts over (a cold
// entry only costs the locking path once).
const maxInputHeads = 100_000

func (h *inputHeads) load(k knownKey) (recordings.InputHead, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.m[k]
	return v, ok
}

// store records c's head, unless an entry further along the chain is
// there already (two writes here finishing out of order).
func (h *inputHeads) store(k knownKey, c recordings.Command) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || len(h.m) >= maxInputHeads {
		h.m = map[knownKey]recordings.InputHead{}
	}
	if old, ok := h.m[k]; ok && old.Seq > c.InSeq {
		return
	}
	h.m[k] = recordings.HeadOf(c)
}

func (h *inputHeads) forget(k knownKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, k)
}

// appendInput records one stdin write before it is forwarded: in one
// round trip after the head this replica knows, else reading the command
// under its lock (cold cache, another replica wrote, the command ended,
// which that path refuses as a conflict).
func (g *Gateway) appendInput(ctx context.Context, org Org, typist recordings.Typist, sessionID, commandID int64, data []byte, eof bool) (recordings.Command, error) {
	k := knownKey{db: org.DB, id: commandID}
	var c recordings.Command
	var err error
	if head, ok := g.inputs.load(k); ok {
		c, err = recordings.AppendInputAfter(ctx, org.DB, head, sessionID, commandID, data, eof, g.now(), typist)
	} else {
		c, err = recordings.AppendInput(ctx, org.DB, sessionID, commandID, data, eof, g.now(), typist)
	}
	if err != nil || c.Ended() {
		g.inputs.forget(k)
		return c, err
	}
	g.inputs.store(k, c)
	return c, nil
}
