// Package proxy is the audited terminal gateway: every operation an agent
// runtime or a person runs in a session's environment goes through it.
// Each operation is split the same way: resolve and authorize (resolve.go:
// the org, the session and its environment, the principal, the casbin
// decision and the agent's command policy), make it durable (its audit
// event, or for stdin its recording chunk; if that cannot be written,
// nothing is forwarded), then forward (forward.go: agentd with the
// environment's token injected, a bounded timeout, agentd's states mapped
// onto the command's). Output is recorded by a follower per running command
// (follower.go), independent of any client.
package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Sessions is what the gateway needs of the sessions domain.
type Sessions interface {
	// Ensure authorizes use of a session and makes it ready (creating or
	// resuming its sandbox).
	Ensure(ctx context.Context, a *authz.Actor, sessionID int64) (sessions.Target, error)
	// Locate authorizes reading a session and says where its agentd is,
	// changing nothing.
	Locate(ctx context.Context, a *authz.Actor, sessionID int64) (sessions.Target, error)
	ReportUnreachable(ctx context.Context, sessionID int64, cause error) (bool, error)
	ReportReachable(ctx context.Context, sessionID int64) error
}

// Org is one organization as the gateway sees it during one operation.
type Org struct {
	Slug     string
	DB       *gorm.DB
	Audit    *audit.Log
	Sessions Sessions
	// Done is closed when the org is suspended or deleted: long-polls end.
	Done <-chan struct{}
}

// Meta is what the audit log records about the caller's connection.
type Meta struct {
	SourceIP  string
	UserAgent string
}

// Gateway forwards terminal operations. One per process.
type Gateway struct {
	// HTTP reaches agentd (in sandboxes and on hosts).
	HTTP *http.Client
	// CallTimeout bounds every forwarded call but long-polls, which are
	// bounded by their wait.
	CallTimeout time.Duration
	// Followers records the output of running commands.
	Followers *Followers
	// Terminals are the open browser terminals.
	Terminals Terminals
	Logger    *slog.Logger
	Now       func() time.Time
}

func (g *Gateway) now() time.Time {
	if g.Now != nil {
		return g.Now().UTC()
	}
	return time.Now().UTC()
}

func (g *Gateway) logger() *slog.Logger {
	if g.Logger != nil {
		return g.Logger
	}
	return slog.Default()
}

func (g *Gateway) callTimeout() time.Duration {
	if g.CallTimeout > 0 {
		return g.CallTimeout
	}
	return 15 * time.Second
}

func event(a *authz.Actor, m Meta, action string, target audit.Target, details any) audit.Event {
	return audit.Event{Actor: a.AuditActor(), SourceIP: m.SourceIP, UserAgent: m.UserAgent, Action: action, Target: target,
		Decision: audit.Allow, Details: audit.Details(details)}
}
