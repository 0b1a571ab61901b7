package audit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// clock is a fake time source advancing by step on every call.
type clock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.t
	c.t = c.t.Add(c.step)
	return t
}

// newLog opens a fresh migrated org database of dialect d and its log,
// whose clock starts at 2026-01-01T00:00Z and advances an hour per event.
func newLog(t *testing.T, d store.Dialect) (*audit.Log, *gorm.DB) {
	t.Helper()
	db := storetest.Open(t, d, store.OrgSet)
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), step: time.Hour}
	return audit.NewLog(db, audit.OrgTable, c.now), db
}

func mustAppend(t testing.TB, l *audit.Log, e audit.Event) audit.Event {
	t.Helper()
	got, err := l.Append(context.Background(), e)
	if err != nil {
		t.Fatalf("append %s: %v", e.Action, err)
	}
	return got
}

// seedVaried appends n events cycling through a few actors, actions,
// targets and decisions, with details that mention a command.
func seedVaried(t testing.TB, l *audit.Log, n int) []audit.Event {
	t.Helper()
	actors := []audit.Actor{
		{Type: audit.ActorUser, ID: "u1", Name: "Jane Doe"},
		{Type: audit.ActorUser, ID: "u2", Name: "Janet"},
		{Type: audit.ActorAPIKey, ID: "k1", Name: "ci-bot"},
		{Type: audit.ActorSystem, ID: "system", Name: "scheduler"},
	}
	actions := []string{"agent.create", "agent.exec", "user.login", "user.login_failed", "env.update", "agent_x.odd"}
	targets := []audit.Target{
		{Type: "agent", ID: "ag-1", Name: "web-1"},
		{Type: "agent", ID: "ag-2", Name: "db 2"},
		{Type: "env", ID: "env-1", Name: "prod"},
	}
	commands := []string{"ls -la", "kubectl get pods", "rm -rf /tmp/x", "echo 100%_done", "cat /etc/hosts"}
	out := make([]audit.Event, 0, n)
	for i := 0; i < n; i++ {
		dec := audit.Allow
		if i%7 == 3 {
			dec = audit.Deny
		}
		out = append(out, mustAppend(t, l, audit.Event{
			Actor: actors[i%len(actors)], Action: actions[i%len(actions)], Target: targets[i%len(targets)],
			Decision: dec, SourceIP: "10.0.0.1", UserAgent: "test",
			Details: audit.Details(map[string]any{"command": commands[i%len(commands)], "n": i}),
		}))
	}
	return out
}

func seqs(evs []audit.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

func fmtSeqs(s []int64) string { return fmt.Sprint(s) }
