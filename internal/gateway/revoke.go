package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
)

// RecheckEvery is how often an idle terminal or a waiting long-poll
// checks its credential again: a revocation reaches it within this.
const RecheckEvery = time.Second

// WatchPrincipal returns ctx ended, with recheck's error as its cause, as
// soon as recheck fails; it checks every RecheckEvery. A nil recheck never
// ends it. Call stop when done.
func WatchPrincipal(ctx context.Context, recheck func(context.Context) (*authz.Actor, error)) (watched context.Context, stop func()) {
	watched, cancel := context.WithCancelCause(ctx)
	if recheck == nil {
		return watched, func() { cancel(context.Canceled) }
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(RecheckEvery)
		defer t.Stop()
		for {
			select {
			case <-watched.Done():
				return
			case <-t.C:
				_, err := recheck(watched)
				if revocation(err) && watched.Err() == nil {
					cancel(err)
					return
				}
				// Anything else (the database away for a moment) is not
				// a revocation: check again on the next tick.
			}
		}
	}()
	// stop waits for the watcher: its recheck reads the request it was
	// made for, which must not be used once the request is over.
	return watched, func() {
		cancel(context.Canceled)
		<-exited
	}
}

// revocation reports an error that says the credential or the access no
// longer stands.
func revocation(err error) bool {
	return errors.Is(err, apperr.ErrUnauthorized) || errors.Is(err, apperr.ErrForbidden) || errors.Is(err, apperr.ErrNotFound)
}

// EndedBy is the error that ended ctx when it was a revocation or another
// failure to report (not a plain cancel); nil otherwise.
func EndedBy(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) {
		return nil
	}
	return cause
}
