// Package gateway is the audited terminal gateway: every operation an
// agent runtime or a person runs in a session's environment goes through
// it, split the same way. Resolve and authorize (resolve.go: the org, the
// session and its environment, the principal, the casbin decision and the
// agent's rules); make it durable (its audit event, or for stdin its
// recording frame: if that cannot be written, nothing is forwarded); then
// forward (forward.go: agentd with the environment's token injected, a
// bounded timeout, agentd's states mapped onto the command's). One file
// per operation: exec.go, poll.go, input.go, kill.go, files.go, write.go,
// resize.go, close.go. Output is recorded by internal/recorder, one
// follower per running command, independent of any client.
package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/recorder"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Sessions is what the gateway needs of the sessions domain.
type Sessions interface {
	// EnsureFor authorizes use of a session, lets check decide the
	// operation, and only then makes the session ready (creating or
	// resuming its sandbox).
	EnsureFor(ctx context.Context, a *authz.Actor, sessionID int64, check func(sessions.Target) error) (sessions.Target, error)
	// Locate authorizes reading a session and says where its agentd is,
	// changing nothing.
	Locate(ctx context.Context, a *authz.Actor, sessionID int64) (sessions.Target, error)
	// LocateForClose authorizes closing a session and says where its
	// agentd is, changing nothing (see EndCommands).
	LocateForClose(ctx context.Context, a *authz.Actor, sessionID int64) (sessions.Target, error)
	ReportUnreachable(ctx context.Context, sessionID int64, cause error) (bool, error)
	ReportReachable(ctx context.Context, sessionID int64) error
}

// Org is one organization as the gateway sees it during one operation.
type Org struct {
	Slug     string
	DB       *gorm.DB
	Audit    *audit.Log
	Sessions Sessions
	// Revoked ends when the org is suspended or deleted: long-polls and
	// followers stop at once. Nil never ends.
	Revoked context.Context
}

// rec is the org as the recorder works in it.
func (o Org) rec() recorder.Org {
	return recorder.Org{Slug: o.Slug, DB: o.DB, Audit: o.Audit, Sessions: o.Sessions, Revoked: o.Revoked}
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
	Followers *recorder.Followers
	// Limits caps the commands running at once per user and per agent
	// (zero values: no cap).
	Limits CommandLimits
	// WriteSlots is how many file writes may run at once on this replica,
	// from spool to agentd, each standing for MaxWriteBytes of temporary
	// disk (0: DefaultWriteSlots), so concurrent uploads cannot fill its
	// disk; one org holds at most half of them.
	WriteSlots int
	// WriteSlotWait is how long a write waits for a free slot before it
	// is refused as busy (0: DefaultWriteSlotWait).
	WriteSlotWait time.Duration
	// spooling counts the writes running (write.go), spoolingOrgs each
	// org's share of them.
	spooling     *semaphore.Weighted
	spoolingOnce sync.Once
	spoolingMu   sync.Mutex
	spoolingOrgs map[string]int
	// resizes holds back the window changes of each command that come
	// within a second of its last recorded one (resize.go).
	resizes resizeWindows
	// attached knows who is attached to which command (attach.go).
	attached attachments
	// inputs knows where the input chain of each command written to here
	// ends, for one-statement keystrokes (stdin.go).
	inputs inputHeads

	// known remembers what never changes about a command (its session and
	// agentd's id for it), so output polls and keystrokes need no
	// database read; settings caches each org's recording settings. Both
	// are keyed by the org's database, never by its slug alone (see
	// knownKey).
	known    sync.Map // knownKey → knownCommand
	nKnown   atomic.Int64
	settings sync.Map // org database (*gorm.DB) → cachedSetting
	polls    pollHub
	clients  envs.AgentdClients // without Followers; else theirs
	Logger   *slog.Logger
	Now      func() time.Time
	// Recorded, when set, is told how long each exec's and keystroke's
	// record took to become durable (its commit, the one wait no cache
	// can take off the hot path), once it is and before agentd hears of
	// the operation: the console's metrics, the benchmark's floor.
	Recorded func(op string, d time.Duration)
	// Asker takes the execs the agent's execution rules hold for a
	// person; nil refuses them (approval_required).
	Asker Asker
	// rules are the agents' execution policies, compiled (rules.go).
	rules checkers
}

// Operations Recorded is told of.
const (
	RecordedExec  = "exec"
	RecordedStdin = "stdin"
)

// recorded tells Recorded that op's record took since start.
func (g *Gateway) recorded(op string, start time.Time) {
	if g.Recorded != nil {
		g.Recorded(op, time.Since(start))
	}
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

// revokedErr is what an operation the org's revocation ended answers: the
// revocation's own cause (suspended, deleted, shutting down), or nil while
// the org stands.
func revokedErr(org Org) error {
	if org.Revoked == nil || org.Revoked.Err() == nil {
		return nil
	}
	cause := context.Cause(org.Revoked)
	var ae *apperr.Error
	if errors.As(cause, &ae) {
		return cause
	}
	return apperr.New(apperr.ErrSuspended, "org_suspended", "The organization was suspended.")
}

// knownKey names a command of one org database. It holds the database
// handle rather than the slug: an org deleted and created again under the
// same slug has a new database whose command ids start over, and must not
// find the old org's facts.
type knownKey struct {
	db *gorm.DB
	id int64
}

type knownCommand struct {
	sessionID int64
	agentdID  string
	tty       bool
}

// maxKnown bounds the command cache; past it the cache starts over.
const maxKnown = 100_000

func (g *Gateway) remember(org Org, c recordings.Command) {
	if g.nKnown.Add(1) > maxKnown {
		g.known.Clear()
		g.nKnown.Store(1)
	}
	g.known.Store(knownKey{org.DB, c.ID}, knownCommand{sessionID: c.SessionID, agentdID: c.AgentdID, tty: c.TTY})
}

func (g *Gateway) recall(org Org, id int64) (knownCommand, bool) {
	v, ok := g.known.Load(knownKey{org.DB, id})
	if !ok {
		return knownCommand{}, false
	}
	return v.(knownCommand), true
}

// settingTTL bounds how long another replica's change of an org's
// recording settings takes to apply here (this replica's own changes apply
// at once).
const settingTTL = 5 * time.Second

type cachedSetting struct {
	slug         string
	stdinContent bool
	at           time.Time
}

// stdinContent is the org's recording choice for stdin, cached.
func (g *Gateway) stdinContent(ctx context.Context, org Org) (bool, error) {
	if v, ok := g.settings.Load(org.DB); ok {
		if c := v.(cachedSetting); time.Since(c.at) < settingTTL {
			return c.stdinContent, nil
		}
	}
	on, err := recordings.StdinContent(ctx, org.DB)
	if err != nil {
		return false, err
	}
	// One entry per org: those of the org's earlier databases (a pool
	// closed when idle, an org deleted and created again) go.
	g.forgetSettings(org.Slug)
	g.settings.Store(org.DB, cachedSetting{slug: org.Slug, stdinContent: on, at: time.Now()})
	return on, nil
}

// SettingsChanged drops an org's cached recording settings.
func (g *Gateway) SettingsChanged(org string) { g.forgetSettings(org) }

// ForgetOrg drops what the gateway caches for org slug; the console calls
// it when the org is suspended or deleted. The command cache is keyed by
// the org's database, which a re-created org does not share: its entries
// are never found again and go when that cache starts over.
func (g *Gateway) ForgetOrg(org string) { g.forgetSettings(org) }

func (g *Gateway) forgetSettings(org string) {
	g.settings.Range(func(k, v any) bool {
		if v.(cachedSetting).slug == org {
			g.settings.Delete(k)
		}
		return true
	})
}
