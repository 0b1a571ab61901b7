//go:build linux

package agentd_test

import (
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TestSessionPidsLimit covers the optional per-session limits of finding
// 3: where the pids controller can be delegated to agentd's cgroup, a
// session cannot start more than pids.max processes; where it cannot,
// agentd refuses to start rather than run without the limit it was given.
// The limit itself is checked in the subtest "cgroup", which skips (and
// says why) where the controller is not available.
func TestSessionPidsLimit(t *testing.T) {
	t.Parallel()
	srv, err := agentd.NewServer(agentd.Config{Token: "test-token-0123456789", SessionPidsMax: 8})
	if err != nil && !strings.Contains(err.Error(), "cgroup") {
		t.Fatalf("NewServer with a pids limit: %v; want a cgroup error", err)
	}
	t.Run("cgroup", func(t *testing.T) {
		if err != nil {
			t.Skipf("pids controller not available to agentd here, so the limit is refused and not tested: %v", err)
		}
		c := agentd.NewClient(newHTTPServer(t, srv), "test-token-0123456789", nil)
		res, err := c.Run(testCtx(t), agentd.CreateSessionRequest{
			Command: "n=0; for i in $(seq 20); do sleep 5 & n=$((n+1)); done 2>/dev/null; jobs -p | wc -l",
			WaitMS:  10000,
		})
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(res.Stdout)) == "20" {
			t.Fatalf("20 background processes started under pids.max 8")
		}
	})
}
