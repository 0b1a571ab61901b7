package envs_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/store"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// refused is what a database that is down answers a new connection.
func refused() error {
	return fmt.Errorf("failed to connect: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
}

// TestCheckerSkipsWithoutDatabase: without the catalog the checker skips
// the whole round and says so, touching no org; an org whose database is
// down is skipped alone (and said so) while the others are checked.
func TestCheckerSkipsWithoutDatabase(t *testing.T) {
	t.Parallel()
	f := setup(t, store.SQLite)
	base, tok, _ := startAgentd(t)
	e := f.mustCreate(t, hostInput("h", base, tok))
	log := audit.NewLog(f.db, audit.OrgTable, nil)
	var released, opened atomic.Int64
	open := orgDeps(f, log, &released)
	logs := &syncBuffer{}
	c := &envs.Checker{
		ListOrgs: func(context.Context) ([]string, error) { return nil, refused() },
		OpenOrg: func(ctx context.Context, slug string) (envs.OrgDeps, error) {
			opened.Add(1)
			if slug == "down" {
				return envs.OrgDeps{}, refused()
			}
			return open(ctx, slug)
		},
		Timeout: 5 * time.Second,
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
	}
	c.Round(context.Background())
	if opened.Load() != 0 || !strings.Contains(logs.String(), "round skipped, database unavailable") || !strings.Contains(logs.String(), "database=catalog") {
		t.Fatalf("without the catalog: %d orgs opened; log:\n%s", opened.Load(), logs)
	}
	if got := statusOf(t, f, e.ID).HealthStatus; got != envs.HealthUnknown {
		t.Fatalf("a skipped round recorded %q", got)
	}

	c.ListOrgs = func(context.Context) ([]string, error) { return []string{"down", testOrg}, nil }
	c.Round(context.Background())
	if got := statusOf(t, f, e.ID).HealthStatus; got != envs.HealthHealthy {
		t.Errorf("the reachable org was not checked: %q", got)
	}
	if !strings.Contains(logs.String(), "org skipped this round, database unavailable") || !strings.Contains(logs.String(), `database="org down"`) {
		t.Errorf("the skipped org is not reported; log:\n%s", logs)
	}
	if released.Load() != 1 {
		t.Errorf("released %d times, want 1", released.Load())
	}
}
