package handlers_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestFollowerKeepsLeaseWhileAgentdAway: a follower waiting for agentd
// (cut off, or not yet started the command) keeps renewing its lease, so
// the row always names a live follower and other replicas' sweeps leave
// the command to it. Found by the chaos run (internal/bench TestChaos): a
// waiting follower let its lease lapse, every replica adopted the command
// and waited on it side by side, and the row named a replica long dead.
func TestFollowerKeepsLeaseWhileAgentdAway(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		const lease = 300 * time.Millisecond
		f := newTerminalFixture(t, d, func(c *config.Config) { c.FollowerLease = lease })
		cut := flakyHostSession(t, f, "cut-off-host")
		// The session's workspace is made at its first command.
		wantStatus(t, "a first command", f.call(http.MethodPost, f.sessionPath("/commands"), "member",
			map[string]any{"command": "true", "wait_ms": 5000}), http.StatusCreated)
		cut.Cut()
		// The exec is recorded, then agentd does not answer: the follower
		// waits for it, resending the create.
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo hello"})
		wantStatus(t, "exec with agentd cut off", r, http.StatusBadGateway)
		ctx := context.Background()
		ten, err := f.e.c.Tenants.Open(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ten.Release)
		var id int64
		if err := ten.DB.WithContext(ctx).Raw("SELECT coalesce(max(id), 0) FROM commands").Scan(&id).Error; err != nil || id == 0 {
			t.Fatalf("the exec's command: %d %v", id, err)
		}
		// Many leases later, the follower still holds a live lease.
		deadline := time.Now().Add(20 * lease)
		for time.Now().Before(deadline) {
			time.Sleep(lease)
		}
		c, err := recordings.Get(ctx, ten.DB, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.Ended() || c.LeaseOwner == "" || c.LeaseUntil == nil || c.LeaseUntil.Before(time.Now()) {
			t.Errorf("after %s with agentd away the command is %s with lease %q until %v: the waiting follower let it lapse",
				20*lease, c.State, c.LeaseOwner, c.LeaseUntil)
		}
		cut.Restore()
	})
}
