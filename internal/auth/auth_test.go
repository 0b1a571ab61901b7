package auth_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/auth"
)

func TestNewPasswordHash(t *testing.T) {
	t.Parallel()
	cur, err := auth.HashPassword("the-current-password")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, current, next, badField string
	}{
		{"ok", "the-current-password", "a-brand-new-password", ""},
		{"wrong current", "not-it-at-all", "a-brand-new-password", "current"},
		{"too short", "the-current-password", "short", "new"},
		{"unchanged", "the-current-password", "the-current-password", "new"},
	}
	for _, tc := range cases {
		h, err := auth.NewPasswordHash(cur, tc.current, tc.next)
		var ve *apperr.ValidationError
		switch {
		case tc.badField == "" && (err != nil || !auth.CheckPassword(h, tc.next)):
			t.Errorf("%s: hash %q, err %v", tc.name, h, err)
		case tc.badField != "" && (!errors.As(err, &ve) || ve.Fields[tc.badField] == ""):
			t.Errorf("%s: err %v, want a validation error on %s", tc.name, err, tc.badField)
		}
	}
	// An unknown account (empty hash) never matches, whatever is typed.
	if _, err := auth.NewPasswordHash("", "", "a-brand-new-password"); err == nil {
		t.Error("changed the password of an account without one")
	}
}

func TestThrottle(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	th := auth.NewThrottle(func() time.Time { return now })
	var slept []time.Duration
	sleep := func(_ context.Context, d time.Duration) { slept = append(slept, d) }
	fail := func() (bool, error) { return false, nil }
	keys := auth.LoginKeys{Address: "ip:1", Account: "acct:a"}
	for i := 0; i < th.LockAfter; i++ {
		if err := th.Attempt(context.Background(), keys, sleep, fail); !errors.Is(err, auth.ErrBadCredentials) {
			t.Fatalf("failure %d: %v", i+1, err)
		}
	}
	if len(slept) != th.LockAfter-th.FreeFailures || slept[len(slept)-1] <= slept[0] {
		t.Fatalf("delays %v: want growing delays after %d free failures", slept, th.FreeFailures)
	}
	// Locked now, even with the right password; other keys are not.
	ok := func() (bool, error) { return true, nil }
	if err := th.Attempt(context.Background(), keys, sleep, ok); !errors.Is(err, auth.ErrThrottled) {
		t.Fatalf("locked key: %v", err)
	}
	if err := th.Attempt(context.Background(), auth.LoginKeys{Address: "ip:2", Account: "acct:b"}, sleep, ok); err != nil {
		t.Fatalf("other keys: %v", err)
	}
	now = now.Add(th.LockFor + time.Second)
	if err := th.Attempt(context.Background(), keys, sleep, ok); err != nil {
		t.Fatalf("after the lock: %v", err)
	}
}

// TestThrottleAddressSurvivesSuccess is finding 4 of the attack run: one
// valid sign-in every few attempts must not reset the address's budget.
func TestThrottleAddressSurvivesSuccess(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	th := auth.NewThrottle(func() time.Time { return now })
	fail := func() (bool, error) { return false, nil }
	ok := func() (bool, error) { return true, nil }
	tried := 0
	for i := 0; ; i++ {
		var err error
		if i%3 == 2 {
			err = th.Attempt(context.Background(), auth.LoginKeys{Address: "ip:1", Account: "acct:mine"}, nil, ok)
		} else {
			err = th.Attempt(context.Background(), auth.LoginKeys{Address: "ip:1", Account: fmt.Sprintf("acct:victim%d", i)}, nil, fail)
			if errors.Is(err, auth.ErrBadCredentials) {
				tried++
			}
		}
		if errors.Is(err, auth.ErrThrottled) {
			break
		}
		if i > 100 {
			t.Fatalf("the address tried %d accounts without being locked", tried)
		}
	}
	if tried != th.LockAfter {
		t.Fatalf("the address was locked after %d failures, want %d", tried, th.LockAfter)
	}
	// The own account's success cleared its own count, nothing else.
	// (Locked's second result is the end of the lock, zero when unlocked.)
	if locked, until := th.Locked("acct:mine"); locked || !until.IsZero() {
		t.Fatalf("the attacker's own account is locked (%v, until %v)", locked, until)
	}
	if locked, until := th.Locked("ip:1"); !locked || !until.Equal(now.Add(th.LockFor)) {
		t.Fatalf("the address: locked %v until %v, want locked until %v", locked, until, now.Add(th.LockFor))
	}
}

// TestThrottleCountsBeforeTheCheck is finding 5: concurrent wrong
// passwords for one account are counted before the slow check, so no more
// than LockAfter of them are ever checked.
func TestThrottleCountsBeforeTheCheck(t *testing.T) {
	t.Parallel()
	th := auth.NewThrottle(nil)
	const guesses = 19
	release := make(chan struct{})
	var checked atomic.Int64
	var wg sync.WaitGroup
	results := make(chan error, guesses)
	for i := 0; i < guesses; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results <- th.Attempt(context.Background(), auth.LoginKeys{Address: fmt.Sprintf("ip:%d", i), Account: "acct:victim"}, nil, func() (bool, error) {
				checked.Add(1)
				<-release // the slow hash: every guess is in flight at once
				return false, nil
			})
		}(i)
	}
	// Every guess has either reached the check or been refused.
	for int(checked.Load())+len(results) < guesses {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	close(results)
	throttled := 0
	for err := range results {
		if errors.Is(err, auth.ErrThrottled) {
			throttled++
		}
	}
	if n := checked.Load(); n != int64(th.LockAfter) || throttled != guesses-th.LockAfter {
		t.Fatalf("%d guesses checked and %d refused, want %d checked", n, throttled, th.LockAfter)
	}
}

// TestThrottleErrorsTakeTheReservationBack: a check that fails for another
// reason (the database is down) is not counted as a wrong password.
func TestThrottleErrorsTakeTheReservationBack(t *testing.T) {
	t.Parallel()
	th := auth.NewThrottle(nil)
	keys := auth.LoginKeys{Address: "ip:1", Account: "acct:a"}
	down := errors.New("database down")
	for i := 0; i < 3*th.LockAfter; i++ {
		if err := th.Attempt(context.Background(), keys, nil, func() (bool, error) { return false, down }); !errors.Is(err, down) {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	if err := th.Attempt(context.Background(), keys, nil, func() (bool, error) { return true, nil }); err != nil {
		t.Fatalf("after errors only: %v", err)
	}
}
