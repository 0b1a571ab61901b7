package recorder_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/recorder"
)

// stopped fails the test when f.Stop does not return: a follower kept a
// context Stop does not end. The bound guards against a hang; it is not a
// timing assertion.
func stopped(t *testing.T, f *recorder.Followers) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		f.Stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Stop did not return: a follower outlived it")
	}
}

// TestStartIsOneShot: Start makes the followers ready once; a second call
// is an error, not a new context that the followers started under the
// first would never see cancelled.
func TestStartIsOneShot(t *testing.T) {
	t.Parallel()
	f := &recorder.Followers{}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(context.Background()); !errors.Is(err, recorder.ErrStarted) {
		t.Fatalf("a second Start answered %v, want ErrStarted", err)
	}
	stopped(t, f)
}

// TestStopEndsFollowersAskedForBeforeStart: a follower asked for before
// Start is ended by Stop.
func TestStopEndsFollowersAskedForBeforeStart(t *testing.T) {
	t.Parallel()
	opened := make(chan struct{}, 1)
	f := &recorder.Followers{
		// The follower waits in OpenOrg until its context ends.
		OpenOrg: func(ctx context.Context, _ string) (recorder.Org, func(), error) {
			opened <- struct{}{}
			<-ctx.Done()
			return recorder.Org{}, nil, ctx.Err()
		},
	}
	f.Follow("acme", 1)
	<-opened
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped(t, f)
	if n := f.Active(); n != 0 {
		t.Fatalf("%d followers still running after Stop", n)
	}
}

// TestPendingCreateForgottenOnEveryExit: a create kept to be sent again
// (it holds the command's environment values) is forgotten when its
// follower cannot open the org, and when the followers are stopped before
// it could start.
func TestPendingCreateForgottenOnEveryExit(t *testing.T) {
	t.Parallel()
	req := agentd.CreateSessionRequest{ID: "gh-1", Command: "env", Env: map[string]string{"TOKEN": "secret"}}
	t.Run("the org cannot be opened", func(t *testing.T) {
		t.Parallel()
		f := &recorder.Followers{OpenOrg: func(context.Context, string) (recorder.Org, func(), error) {
			return recorder.Org{}, nil, errors.New("org is away")
		}}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.CreatePending(recorder.Org{Slug: "acme"}, 1, req)
		f.Follow("acme", 1)
		stopped(t, f)
		if n := f.PendingCreates(); n != 0 {
			t.Fatalf("%d creates kept after their follower ended", n)
		}
	})
	t.Run("the followers were stopped", func(t *testing.T) {
		t.Parallel()
		f := &recorder.Followers{}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		stopped(t, f)
		f.CreatePending(recorder.Org{Slug: "acme"}, 1, req)
		f.Follow("acme", 1)
		if n := f.PendingCreates(); n != 0 {
			t.Fatalf("%d creates kept for a follower that never ran", n)
		}
	})
	t.Run("answered", func(t *testing.T) {
		t.Parallel()
		f := &recorder.Followers{}
		org := recorder.Org{Slug: "acme"}
		f.CreatePending(org, 1, req)
		f.CreatePending(recorder.Org{Slug: "other"}, 1, req)
		f.CreateDone(org, 1)
		if n := f.PendingCreates(); n != 1 {
			t.Fatalf("%d creates kept, want only the other org's", n)
		}
	})
}
