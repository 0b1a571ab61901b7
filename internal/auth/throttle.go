package auth

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Throttle slows and then refuses repeated login failures per key (an
// address, or an account). It is per process: with several replicas each
// enforces its own budget, which still bounds guessing to replicas × limit.
type Throttle struct {
	mu      sync.Mutex
	now     func() time.Time
	entries map[string]*throttleEntry
	// FreeFailures are allowed before any delay.
	FreeFailures int
	// LockAfter failures within Window lock the key for LockFor.
	LockAfter int
	Window    time.Duration
	LockFor   time.Duration
	// MaxDelay caps the delay before answering a failed attempt.
	MaxDelay time.Duration
}

type throttleEntry struct {
	failures    int
	first       time.Time
	lockedUntil time.Time
}

// NewThrottle returns a Throttle with production defaults: 3 free
// failures, growing delay, lock for 15 minutes after 10 in 15 minutes.
func NewThrottle(now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	return &Throttle{now: now, entries: map[string]*throttleEntry{},
		FreeFailures: 3, LockAfter: 10, Window: 15 * time.Minute, LockFor: 15 * time.Minute, MaxDelay: 2 * time.Second}
}

// Locked reports whether key is refused right now and until when.
func (t *Throttle) Locked(key string) (bool, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[key]
	if e == nil {
		return false, time.Time{}
	}
	if t.now().Before(e.lockedUntil) {
		return true, e.lockedUntil
	}
	return false, time.Time{}
}

// Fail records a failure and returns how long to delay the answer.
func (t *Throttle) Fail(key string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	e := t.entries[key]
	if e == nil || now.Sub(e.first) > t.Window {
		e = &throttleEntry{first: now}
		t.entries[key] = e
	}
	e.failures++
	if e.failures >= t.LockAfter {
		e.lockedUntil = now.Add(t.LockFor)
	}
	t.gcLocked(now)
	over := e.failures - t.FreeFailures
	if over <= 0 {
		return 0
	}
	d := time.Duration(over) * 250 * time.Millisecond
	if d > t.MaxDelay {
		d = t.MaxDelay
	}
	return d
}

// Succeed clears key's failures.
func (t *Throttle) Succeed(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.entries, key)
}

// gcLocked drops stale entries so the map cannot grow without bound under
// a spray of addresses.
func (t *Throttle) gcLocked(now time.Time) {
	if len(t.entries) < 10000 {
		return
	}
	for k, e := range t.entries {
		if now.Sub(e.first) > t.Window && now.After(e.lockedUntil) {
			delete(t.entries, k)
		}
	}
}

// ErrThrottled is returned by Attempt when a key is locked; ErrBadCredentials
// when the check failed. Both say nothing about whether the account exists.
var (
	ErrThrottled      = errors.New("too many failed attempts")
	ErrBadCredentials = errors.New("bad credentials")
)

// LockedError carries when the lock ends.
type LockedError struct{ Until time.Time }

func (e *LockedError) Error() string {
	return "too many failed attempts until " + e.Until.Format(time.RFC3339)
}

// Unwrap makes errors.Is(err, ErrThrottled) true.
func (e *LockedError) Unwrap() error { return ErrThrottled }

// Attempt runs check unless one of keys is locked. On failure it records
// the failure for every key and waits the growing delay (via sleep) before
// returning ErrBadCredentials; on success it clears the keys.
func (t *Throttle) Attempt(ctx context.Context, keys []string, sleep func(context.Context, time.Duration), check func() (bool, error)) error {
	for _, k := range keys {
		if locked, until := t.Locked(k); locked {
			return &LockedError{Until: until}
		}
	}
	ok, err := check()
	if err != nil {
		return err
	}
	if !ok {
		var delay time.Duration
		for _, k := range keys {
			if d := t.Fail(k); d > delay {
				delay = d
			}
		}
		if delay > 0 && sleep != nil {
			sleep(ctx, delay)
		}
		return ErrBadCredentials
	}
	for _, k := range keys {
		t.Succeed(k)
	}
	return nil
}
