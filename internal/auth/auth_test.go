package auth_test

import (
	"context"
	"errors"
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
	keys := []string{"ip:1", "acct:a"}
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
	if err := th.Attempt(context.Background(), []string{"ip:2", "acct:b"}, sleep, ok); err != nil {
		t.Fatalf("other keys: %v", err)
	}
	now = now.Add(th.LockFor + time.Second)
	if err := th.Attempt(context.Background(), keys, sleep, ok); err != nil {
		t.Fatalf("after the lock: %v", err)
	}
}
