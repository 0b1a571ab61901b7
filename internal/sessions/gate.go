package sessions

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// gate is a lock of one session's slow path in this process whose waiters
// give up when their request ends or after a bound, unlike a mutex.
type gate chan struct{}

func newGate() gate { return make(gate, 1) }

// TryLock takes the gate if nobody holds it.
func (g gate) TryLock() bool {
	select {
	case g <- struct{}{}:
		return true
	default:
		return false
	}
}

// Lock takes the gate, waiting at most wait and no longer than ctx: a
// holder still at work past wait is answered 503 session_busy.
func (g gate) Lock(ctx context.Context, id int64, wait time.Duration) error {
	if g.TryLock() {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case g <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return sessionBusy(id, wait)
	}
}

// Unlock lets the gate go.
func (g gate) Unlock() { <-g }

// sessionBusy is the answer to a request that waited wait for another
// lifecycle change of session id in vain.
func sessionBusy(id int64, wait time.Duration) error {
	return apperr.New(apperr.ErrUnavailable, "session_busy",
		"Session %d is being started, paused or resumed by another request that has not finished within %s; try again.", id, wait)
}

// lockSlot takes one of the slots of db's lifecycle locks, waiting at most
// wait and no longer than ctx. A lifecycle lock across replicas holds one
// of the pool's connections for a whole backend call, and its holder needs
// another to read and write the session: at most half the pool's
// connections are held so, or ten concurrent first uses of sandbox
// sessions would take every connection and wait for each other. release
// gives the slot back.
func (r *Runtime) lockSlot(ctx context.Context, db *gorm.DB, id int64, wait time.Duration) (release func(), err error) {
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	open := sqlDB.Stats().MaxOpenConnections
	if open <= 0 {
		return func() {}, nil // no bound to exhaust
	}
	r.mu.Lock()
	if r.lockSlots == nil {
		r.lockSlots = map[*gorm.DB]chan struct{}{}
	}
	slots := r.lockSlots[db]
	if slots == nil {
		slots = make(chan struct{}, maxLockSlots(open))
		r.lockSlots[db] = slots
	}
	r.mu.Unlock()
	if err := gate(slots).Lock(ctx, id, wait); err != nil {
		return nil, err
	}
	return func() { <-slots }, nil
}

// maxLockSlots is how many of a pool of open connections lifecycle locks
// may hold at once.
func maxLockSlots(open int) int { return (open + 1) / 2 }
