package console

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Backoff is the wait between attempts to start while a database is
// unavailable: Initial after the first, doubling up to Max.
type Backoff struct {
	Initial, Max time.Duration
}

// DefaultBackoff is what `console serve` waits between attempts.
var DefaultBackoff = Backoff{Initial: time.Second, Max: 30 * time.Second}

// NewWhenReachable is New that waits out a database outage: while New
// fails because the catalog cannot be reached (store.IsUnavailable: the
// server refuses connections, is starting or shutting down, or does not
// answer), it logs the attempt at warn and tries again after a growing
// wait, so a replica restarted during an outage comes up when the
// database does, without an orchestrator's restart loop. Any other
// failure (a wrong password, a missing database, a bad key) is returned
// at once, as is ctx's end.
func NewWhenReachable(ctx context.Context, cfg config.Config, logger *slog.Logger, b Backoff) (*Console, error) {
	if logger == nil {
		logger = slog.Default()
	}
	wait := b.Initial
	for attempt := 1; ; attempt++ {
		c, err := New(ctx, cfg, logger)
		if err == nil {
			if attempt > 1 {
				logger.Info("database reachable; console started", "attempts", attempt)
			}
			return c, nil
		}
		if !store.IsUnavailable(err) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		logger.Warn("database unavailable at start; retrying", "attempt", attempt, "retry_in", wait.String(), "error", err)
		sleepCtx(ctx, wait)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if wait *= 2; wait > b.Max {
			wait = b.Max
		}
	}
}

// Gate serves the console once it is built and, until then, answers for
// a process that is alive but not ready: /healthz 200, /readyz 503
// (status "starting"), anything else 503 database_unavailable with
// Retry-After. The zero Gate is waiting.
type Gate struct {
	h atomic.Pointer[http.Handler]
}

// Open hands every later request to h.
func (g *Gate) Open(h http.Handler) { g.h.Store(&h) }

// ServeHTTP implements http.Handler.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := g.h.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/healthz":
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
	case "/readyz":
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "starting", "catalog": "unreachable",
			"problems": []string{"The console is starting and waits for its catalog database, which is unavailable."}})
	default:
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "database_unavailable",
			"message": "The console is starting and waits for its database; try again in a moment."}})
	}
}
