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

// entryLocked returns key's entry in the current window, starting a new
// one when the window has passed. t.mu must be held.
func (t *Throttle) entryLocked(key string, now time.Time) *throttleEntry {
	e := t.entries[key]
	if e == nil || now.Sub(e.first) > t.Window && !now.Before(e.lockedUntil) {
		e = &throttleEntry{first: now}
		t.entries[key] = e
	}
	return e
}

// countLocked counts one failure against e. t.mu must be held.
func (t *Throttle) countLocked(e *throttleEntry, now time.Time) {
	e.failures++
	if e.failures >= t.LockAfter {
		e.lockedUntil = now.Add(t.LockFor)
	}
}

// delayFor is the growing delay after failures.
func (t *Throttle) delayFor(failures int) time.Duration {
	over := failures - t.FreeFailures
	if over <= 0 {
		return 0
	}
	d := time.Duration(over) * 250 * time.Millisecond
	if d > t.MaxDelay {
		d = t.MaxDelay
	}
	return d
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

// LoginKeys are the two budgets one sign-in attempt is counted against.
type LoginKeys struct {
	// Address is the client's address: it limits how many accounts one
	// address may try. A success never clears it, or an attacker's own
	// valid sign-in every few guesses would reset it.
	Address string
	// Account is the account tried: it limits guesses at one password,
	// from any address. Its own successful sign-in clears it.
	Account string
}

// Attempt runs check unless a key is locked. The attempt is counted as a
// failure against both keys before check runs (reserve), so concurrent
// guesses cannot all pass the lock while the slow password hash runs;
// once check answers it is settled: a failure stays counted and waits the
// growing delay (via sleep) before returning ErrBadCredentials; a success
// clears the account's count and takes back only this attempt's
// reservation from the address.
func (t *Throttle) Attempt(ctx context.Context, keys LoginKeys, sleep func(context.Context, time.Duration), check func() (bool, error)) error {
	addr, acct, err := t.reserve(keys)
	if err != nil {
		return err
	}
	ok, err := check()
	if err != nil {
		// Not an answer about the password: take the reservation back.
		t.release(keys, addr, acct, false)
		return err
	}
	if !ok {
		if d := t.delayFor(max(addr.failures, acct.failures)); d > 0 && sleep != nil {
			sleep(ctx, d)
		}
		return ErrBadCredentials
	}
	t.release(keys, addr, acct, true)
	return nil
}

// reserve refuses a locked key, else counts the attempt against both keys
// in one step under the lock, and returns their entries as counted.
func (t *Throttle) reserve(keys LoginKeys) (addr, acct throttleEntry, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	a, b := t.entryLocked(keys.Address, now), t.entryLocked(keys.Account, now)
	for _, e := range []*throttleEntry{a, b} {
		if now.Before(e.lockedUntil) {
			return throttleEntry{}, throttleEntry{}, &LockedError{Until: e.lockedUntil}
		}
	}
	t.countLocked(a, now)
	t.countLocked(b, now)
	t.gcLocked(now)
	return *a, *b, nil
}

// release takes one attempt's reservation back: from both keys after an
// error, from the address after a success (whose account is cleared). A
// lock that only this reservation caused is lifted with it.
func (t *Throttle) release(keys LoginKeys, addr, acct throttleEntry, success bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	refund := func(key string, counted throttleEntry) {
		e := t.entries[key]
		if e == nil || !e.first.Equal(counted.first) || e.failures == 0 {
			return // a new window began meanwhile: nothing of ours is left
		}
		e.failures--
		if e.failures < t.LockAfter {
			e.lockedUntil = time.Time{}
		}
	}
	refund(keys.Address, addr)
	if success {
		delete(t.entries, keys.Account)
		return
	}
	refund(keys.Account, acct)
}
