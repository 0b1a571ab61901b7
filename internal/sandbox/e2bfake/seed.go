package e2bfake

import (
	"context"
	"fmt"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// SeedSandbox describes a sandbox Seed records directly.
type SeedSandbox struct {
	// TemplateID is a template ID or alias; empty means the first
	// configured template.
	TemplateID string
	Metadata   map[string]string
	// State is running (the default) or paused.
	State sandbox.State
	// StartedAt defaults to the fake's now.
	StartedAt time.Time
	// Timeout is the time to live from StartedAt for a running sandbox
	// (default 15 s, E2B's; negative never times out).
	Timeout time.Duration
	// EndAt overrides the computed end. For a paused sandbox it is when it
	// was paused (default: the fake's now), as E2B reports it.
	EndAt      time.Time
	AutoPause  bool
	AutoResume bool
}

// Seed adds sandboxes cheaply: no request, no process and nothing on disk,
// for tests and benchmarks that need many sandboxes to list, reclaim or
// kill (a reclaim round over 1,000 tagged sandboxes). Through the API they
// behave like any other — listed, fetched, paused, connected, timed out,
// killed — but nothing listens inside, so the proxy answers 502 for them.
// It returns the new IDs in order.
func (s *Server) Seed(sbs ...SeedSandbox) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("e2bfake: seed: the fake is closed")
	}
	now := s.nowLocked()
	ids := make([]string, 0, len(sbs))
	for _, sb := range sbs {
		ref := sb.TemplateID
		if ref == "" {
			ref = s.cfg.Templates[0].ID
		}
		tpl, alias, ok := s.findTemplate(ref)
		if !ok {
			return ids, fmt.Errorf("e2bfake: seed: template %q not found", ref)
		}
		timeout := sb.Timeout
		if timeout == 0 {
			timeout = defaultTimeout
		}
		sp := createSpec{tpl: tpl, alias: alias, timeout: timeout, onTimeout: sandbox.OnTimeoutKill,
			autoResume: sb.AutoResume, metadata: copyMap(sb.Metadata)}
		if sb.AutoPause {
			sp.onTimeout = sandbox.OnTimeoutPause
		}
		b := s.newBox(randomID(10), sp, nopProcess{})
		start := sb.StartedAt
		if start.IsZero() {
			start = now
		}
		switch sb.State {
		case "", sandbox.StateRunning:
			b.endAt = sb.EndAt
		case sandbox.StatePaused:
			b.state, b.endAt = sandbox.StatePaused, sb.EndAt
			if b.endAt.IsZero() {
				b.endAt = now
			}
		default:
			return ids, fmt.Errorf("e2bfake: seed: state %q is not running or paused", sb.State)
		}
		s.addLocked(b, start.UTC())
		ids = append(ids, b.id)
	}
	return ids, nil
}

// NopLauncher starts nothing: sandboxes created through the API get no
// process (the proxy answers 502 for them, but for agentd's rekey, POST
// /v1/token, which it takes with 204 as a fresh agentd would: the console
// rekeys every sandbox it creates before using it). For tests of the API
// and of lifecycle bookkeeping at scale, where a real agentd per sandbox
// would only cost time.
type NopLauncher struct{}

// Launch returns a process that does not exist.
func (NopLauncher) Launch(context.Context, LaunchSpec) (Process, error) { return nopProcess{}, nil }

type nopProcess struct{}

func (nopProcess) Addr() string  { return "" }
func (nopProcess) PID() int      { return 0 }
func (nopProcess) Freeze() error { return nil }
func (nopProcess) Thaw() error   { return nil }
func (nopProcess) Kill() error   { return nil }
