package sessions

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// TestGateWaitersGiveUp: a waiter on a held gate ends with its request
// (its context) or, past the wait, with 503 session_busy; once the gate
// is let go the next caller takes it.
func TestGateWaitersGiveUp(t *testing.T) {
	g := newGate()
	if !g.TryLock() || g.TryLock() {
		t.Fatal("TryLock on a new gate, then on a held one")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Lock(ctx, 7, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled waiter: %v", err)
	}
	var ae *apperr.Error
	if err := g.Lock(context.Background(), 7, time.Millisecond); !errors.As(err, &ae) || ae.Code != "session_busy" {
		t.Errorf("a waiter past its wait: %v", err)
	}
	g.Unlock()
	if err := g.Lock(context.Background(), 7, time.Millisecond); err != nil {
		t.Errorf("a free gate: %v", err)
	}
}

func TestMaxLockSlots(t *testing.T) {
	for open, want := range map[int]int{1: 1, 2: 1, 6: 3, 10: 5, 11: 6} {
		if got := maxLockSlots(open); got != want {
			t.Errorf("maxLockSlots(%d) = %d, want %d", open, got, want)
		}
	}
}
