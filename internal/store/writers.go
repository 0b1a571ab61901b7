package store

import (
	"context"
	"strings"
	"time"
)

// writers queues the writers of one SQLite handle (one store.Open), so
// each starts as soon as the one before it ends rather than when SQLite's
// busy handler next wakes. It queues transactions and single statements
// sent with ExecContext; a write sent with QueryContext (an INSERT …
// RETURNING outside a transaction) is not queued and meets the busy
// handler, as every writer did before. A writer that has waited busyWait
// goes on without its turn and is left to SQLite's busy timeout: whatever
// holds the turn (a transaction left open by mistake) costs a longer wait
// (up to both), never a deadlock.
type writers struct {
	turn chan struct{}
	wait time.Duration
}

// busyWait matches the pool's SQLite busy_timeout.
const busyWait = 10 * time.Second

func newWriters() writers { return writers{turn: make(chan struct{}, 1), wait: busyWait} }

// acquire waits for the writer's turn and returns what gives it back. It
// fails only when ctx ends first.
func (w writers) acquire(ctx context.Context) (release func(), err error) {
	if w.turn == nil {
		return func() {}, nil
	}
	select {
	case w.turn <- struct{}{}:
		return w.release, nil
	default:
	}
	timer := time.NewTimer(w.wait)
	defer timer.Stop()
	select {
	case w.turn <- struct{}{}:
		return w.release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return func() {}, nil
	}
}

func (w writers) release() { <-w.turn }

// writes tells a statement that may write from one that only reads, by its
// first word; a statement it cannot tell counts as a writer.
func writes(query string) bool {
	q := strings.TrimLeft(query, " \t\r\n(")
	for _, read := range []string{"SELECT", "PRAGMA", "EXPLAIN"} {
		if len(q) >= len(read) && strings.EqualFold(q[:len(read)], read) {
			return false
		}
	}
	return true
}
