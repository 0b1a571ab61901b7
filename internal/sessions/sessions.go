// Package sessions holds agent sessions: one conversation of one agent for
// one user, with one workspace and, when the agent's sandbox mode is
// per-session, exactly one sandbox that is created on first use, kept
// alive by use, paused by the backend when idle, resumed by the next use
// and reclaimed when it stayed paused too long. In sandbox mode off a
// session is a workspace directory on a host environment.
//
// The sandbox lifecycle is judged from what the backend reports (state and
// timestamps), never from a replica's memory: the in-process cache only
// saves calls on the hot path and is rebuilt from the database and the
// backend at any time.
package sessions

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/envs"
)

// Session states.
const (
	// StatePending: created, no sandbox (or host workspace) yet.
	StatePending = "pending"
	StateRunning = "running"
	StatePaused  = "paused"
	// StateClosed is final: closed by a user or reclaimed; the record stays.
	StateClosed = "closed"
	// StateLost is final: the backend said the sandbox is gone, or
	// agentd stayed unreachable for Runtime.UnreachableWindow.
	StateLost = "lost"
)

// States lists every state, for filters and validation.
var States = []string{StatePending, StateRunning, StatePaused, StateClosed, StateLost}

// Metadata keys every Gatehouse sandbox carries; the reclaimer lists by
// MetaOrg and finds a half-created sandbox by MetaSession.
const (
	MetaOrg     = "gatehouse.org"
	MetaSession = "gatehouse.session"
	MetaAgent   = "gatehouse.agent"
	MetaUser    = "gatehouse.user"
	// MetaHostMount is CubeSandbox's reserved key through which a session
	// with a persistent workspace asks for its host directory: a JSON
	// array of {hostPath, mountPath, readOnly}.
	MetaHostMount = "host-mount"
)

// Session is one agent session as stored.
type Session struct {
	ID            int64 `gorm:"primaryKey"`
	AgentID       int64
	UserID        *int64
	Subject       string
	CreatedBy     string
	EnvironmentID *int64
	TemplateID    *int64
	SandboxMode   string
	State         string
	Reason        string
	SandboxID     string
	SandboxDomain string
	Workspace     string
	// WorkspaceMount is the host directory mounted at Workspace inside
	// every sandbox of the session ("" when the workspace lives and dies
	// with the sandbox). Fixed when the session is created, so editing the
	// environment never moves an existing workspace.
	WorkspaceMount string
	// BackendState is the sandbox state the backend reported last, at
	// BackendSeenAt.
	BackendState    string
	BackendSeenAt   *time.Time
	Version         int64
	CreateToken     string
	CreateStartedAt *time.Time
	CreateAttempts  int
	AgentdFailures  int `gorm:"column:agentd_failures"`
	// UnreachableSince is when the current run of failed calls to the
	// session's agentd began; nil while it answers.
	UnreachableSince *time.Time
	// LastUnreachableAt is the run's latest failure: one long after it
	// starts a new run (isolated failures never add up to a loss).
	LastUnreachableAt *time.Time
	// ClosingAt is when a close of the session began: from then on no
	// command starts in it.
	ClosingAt *time.Time
	// SealedAgentdToken is the sandbox's own agentd token (sealed; see
	// sandboxtoken.go), AgentdTokenKind which token the sandbox takes:
	// TokenPerSandbox, TokenTemplate, or "" (a host session, no sandbox).
	SealedAgentdToken string `gorm:"column:sealed_agentd_token"`
	AgentdTokenKind   string `gorm:"column:agentd_token_kind"`

	CreatedAt  time.Time
	StartedAt  *time.Time
	LastUsedAt *time.Time
	ClosedAt   *time.Time
	UpdatedAt  time.Time

	// AgentName and AgentDepartmentID are read with the session (a join)
	// for display and authorization; they are the agent's, not stored
	// here.
	AgentName         string `gorm:"->;column:agent_name"`
	AgentDepartmentID *int64 `gorm:"->;column:agent_department_id"`
}

// TableName binds Session to its table.
func (Session) TableName() string { return "sessions" }

// Final reports whether no transition leaves the state.
func (s Session) Final() bool { return s.State == StateClosed || s.State == StateLost }

// AuditTarget names a session in the audit log.
func AuditTarget(s Session) audit.Target {
	name := s.AgentName
	if name == "" {
		name = "agent " + strconv.FormatInt(s.AgentID, 10)
	}
	return audit.Target{Type: "session", ID: strconv.FormatInt(s.ID, 10), Name: name + " #" + strconv.FormatInt(s.ID, 10)}
}

// Defaults of the process-wide Runtime.
const (
	DefaultRefreshEvery = 5 * time.Second
	// DefaultUnreachableWindow is how long a session's agentd may fail
	// every call before the session is lost: long enough for a network
	// blip, a restarting agentd or a rescheduled pod.
	DefaultUnreachableWindow = time.Minute
	DefaultCreateLease       = 2 * time.Minute
	DefaultHostDir           = "gatehouse-sessions"
)

// Runtime is what a console process keeps across requests for the
// sessions of every org: the hot-path cache, the per-session gate that
// lets one caller of a process create a sandbox while the others wait, and
// the settings. One per process; Services are made per request over it.
type Runtime struct {
	// RefreshEvery bounds how often a running session's backend timeout is
	// refreshed (and its row re-read); it is further capped at a tenth of
	// the agent's idle timeout.
	RefreshEvery time.Duration
	// UnreachableWindow is how long every call to a session's agentd must
	// fail, with no success in between, before the session is lost
	// (0: DefaultUnreachableWindow). A backend that says the sandbox is
	// gone makes it lost at once.
	UnreachableWindow time.Duration
	// CreateLease is how long a replica's "creating" marker holds off the
	// others; after it a crashed creator's marker is taken over.
	CreateLease time.Duration
	// HostDir is the directory under a host environment's workspace root
	// that holds one workspace per session (sandbox mode off).
	HostDir string
	// SandboxWorkspace is the working directory inside a sandbox ("" is
	// agentd's own root there).
	SandboxWorkspace string
	// Limits caps the sessions open at once per user and per agent (zero
	// values: no cap).
	Limits Limits
	// Now is the clock (the backend's reported times are compared with
	// it).
	Now func() time.Time
	// ConfigCheckEvery is how often the cache reads an org's
	// config_version (0: DefaultConfigCheckEvery): another replica's change
	// of an agent or environment applies here within it. See freshness.go.
	ConfigCheckEvery time.Duration

	mu    sync.Mutex
	cache map[cacheKey]*cached
	gates map[cacheKey]gate
	// lockSlots bounds, per org database, the lifecycle locks held at
	// once (see lockSlot).
	lockSlots map[*gorm.DB]chan struct{}
	config    configVersions
	// reachable is when each session's failures were last cleared (or
	// found clear) by this process: ReportReachable writes at most once a
	// second per session.
	reachable map[cacheKey]time.Time
}

// unreachable notes a failure of k: the next answer clears it at once.
func (r *Runtime) unreachable(k cacheKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.reachable, k)
}

// reachableDue reports whether k's failures may be cleared now (at most
// once a second), and notes that they are.
func (r *Runtime) reachableDue(k cacheKey) bool {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if at, ok := r.reachable[k]; ok && now.Sub(at) < time.Second {
		return false
	}
	if r.reachable == nil || len(r.reachable) >= maxCached {
		r.reachable = map[cacheKey]time.Time{}
	}
	r.reachable[k] = now
	return true
}

// cacheKey names a session of one org database. It holds the database
// handle (Service.Pool): an org deleted and created again under the same
// slug has a new database whose session ids start over, and must not find
// the old org's sessions and the machines they ran on. The slug is kept
// for ForgetOrg.
type cacheKey struct {
	db  *gorm.DB
	org string
	id  int64
}

// cached is a session known to be usable as of checked.
type cached struct {
	target  Target
	checked time.Time
	refresh time.Duration
	// located marks a target Locate read from the database without asking
	// the backend: it serves reads (output polls, the recorder), not
	// Ensure, which must still resume or refresh the sandbox.
	located bool
	// version is the org's config_version read before the target's rows;
	// once the org's version moves on, the entry is a miss.
	version int64
}

// NewRuntime returns a runtime with the defaults.
func NewRuntime() *Runtime { return &Runtime{} }

func (r *Runtime) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}

func (r *Runtime) refreshEvery(idle time.Duration) time.Duration {
	d := r.RefreshEvery
	if d <= 0 {
		d = DefaultRefreshEvery
	}
	if idle > 0 && idle/10 < d {
		d = idle / 10
	}
	return d
}

func (r *Runtime) unreachableWindow() time.Duration {
	if r.UnreachableWindow > 0 {
		return r.UnreachableWindow
	}
	return DefaultUnreachableWindow
}

func (r *Runtime) createLease() time.Duration {
	if r.CreateLease > 0 {
		return r.CreateLease
	}
	return DefaultCreateLease
}

func (r *Runtime) hostDir() string {
	if r.HostDir != "" {
		return r.HostDir
	}
	return DefaultHostDir
}

func (r *Runtime) get(k cacheKey) (*cached, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.cache[k]
	return c, ok
}

// maxCached bounds the cache; past it, stale entries and idle gates are
// dropped (sessions closed by another replica are never forgotten here
// otherwise).
const maxCached = 10_000

func (r *Runtime) put(k cacheKey, c *cached) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cache == nil {
		r.cache = map[cacheKey]*cached{}
	}
	r.cache[k] = c
	if len(r.cache) > maxCached || len(r.gates) > maxCached {
		r.pruneLocked(c.checked)
	}
}

// pruneLocked drops cache entries past their refresh time and gates nobody
// holds. A caller still waiting on a dropped gate is safe: the database
// marker, not the gate, makes creation exactly-once.
func (r *Runtime) pruneLocked(now time.Time) {
	for k, c := range r.cache {
		if now.Sub(c.checked) >= c.refresh {
			delete(r.cache, k)
		}
	}
	for k, g := range r.gates {
		if g.TryLock() {
			g.Unlock()
			delete(r.gates, k)
		}
	}
}

// forget drops a cached session, so the next use reads the database (and
// the backend) again.
func (r *Runtime) forget(k cacheKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.cache, k)
}

// gate serializes the slow path of one session inside this process, so
// fifty concurrent first uses cost one creation attempt here; the database
// marker serializes across processes.
func (r *Runtime) gate(k cacheKey) gate {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gates == nil {
		r.gates = map[cacheKey]gate{}
	}
	g := r.gates[k]
	if g == nil {
		g = newGate()
		r.gates[k] = g
	}
	return g
}

// Service manages one org's sessions. It is cheap to make per request; the
// Runtime it points to is shared by the process.
type Service struct {
	DB *gorm.DB
	// Pool is the org's open database, the key of the process caches: set
	// it when DB is a transaction (or any other session) made from it, so
	// the service finds what the org's other services cached. Nil means DB.
	Pool   *gorm.DB
	Envs   *envs.Service
	Agents *agents.Service
	// Org is the org's slug, written into every sandbox's metadata.
	Org string
	// Audit receives every change the service makes (required: a change
	// is never left unrecorded).
	Audit *audit.Log
	// RT is the process's runtime, shared by every Service of every org
	// (the console's handlers, the gateway and the reclaimer); nil caches
	// nothing.
	RT *Runtime
	// Decorate adds request details (source address, user agent) to the
	// audit events the service writes; nil leaves them as they are.
	Decorate func(*audit.Event)
}

// rt is the process's runtime; without one (a one-off service) every call
// gets a fresh runtime with the defaults: nothing is cached, which is
// correct, only slower.
func (s *Service) rt() *Runtime {
	if s.RT == nil {
		return NewRuntime()
	}
	return s.RT
}

func (s *Service) now() time.Time { return s.rt().now() }

func (s *Service) key(id int64) cacheKey { return cacheKey{db: s.pool(), org: s.Org, id: id} }

// systemReader is the actor the service reads configuration as: an
// agent's environments and template are what the agent grants its users,
// whether or not they may see them directly.
func systemReader() *authz.Actor { return authz.System("sessions") }

// sessionQuery reads sessions with their agent's name and department.
func (s *Service) sessionQuery(ctx context.Context) *gorm.DB {
	return s.DB.WithContext(ctx).Table("sessions").
		Select("sessions.*, agents.name AS agent_name, agents.department_id AS agent_department_id").
		Joins("JOIN agents ON agents.id = sessions.agent_id")
}

// load reads one session, whoever asks.
func (s *Service) load(ctx context.Context, id int64) (Session, error) {
	var out []Session
	if err := s.sessionQuery(ctx).Where("sessions.id = ?", id).Limit(1).Find(&out).Error; err != nil {
		return Session{}, fmt.Errorf("read session: %w", err)
	}
	if len(out) == 0 {
		return Session{}, apperr.New(apperr.ErrNotFound, "session_not_found", "No session with id %d exists.", id)
	}
	return out[0], nil
}

// CreateInput starts a session.
type CreateInput struct {
	AgentID int64
	// EnvironmentID chooses one of the agent's allowed environments; nil
	// or 0 takes the agent's default.
	EnvironmentID *int64
	// Record writes the creation's audit record in the creating
	// transaction (nil: none), so the session and its record commit
	// together. The checks before it run outside that transaction: a
	// policy check may read the database on another connection, and on
	// SQLite a burst of creates would otherwise hold every pooled
	// connection waiting for the writer that needs one more.
	Record func(tx *gorm.DB, sess Session) error
}

// create stores a pending session of agent ag for a.
func (s *Service) create(ctx context.Context, a *authz.Actor, ag agents.Agent, in CreateInput) (Session, error) {
	envID := ag.DefaultEnvironmentID
	if in.EnvironmentID != nil && *in.EnvironmentID != 0 {
		envID = *in.EnvironmentID
	}
	v := apperr.Validation()
	if !slices.Contains(ag.EnvironmentIDs, envID) {
		v.Add("environment_id", "Environment %d is not one of the environments agent %q may use.", envID, ag.Name)
		return Session{}, v
	}
	e, err := s.Envs.Get(ctx, systemReader(), envID)
	if err != nil {
		return Session{}, err
	}
	switch ag.SandboxMode {
	case agents.SandboxPerSession:
		if e.Kind != envs.KindSandbox {
			v.Add("environment_id", "Agent %q gives every session its own sandbox: choose a sandbox environment, not host %q.", ag.Name, e.Name)
		} else if ag.TemplateID == nil {
			v.Add("agent_id", "Agent %q has no sandbox template; ask its owner to choose one.", ag.Name)
		} else if t, err := s.Envs.GetTemplate(ctx, systemReader(), *ag.TemplateID); err != nil {
			return Session{}, err
		} else if t.EnvironmentID != e.ID {
			v.Add("environment_id", "Agent %q's template lives in another sandbox environment than %q.", ag.Name, e.Name)
		}
	default:
		if e.Kind != envs.KindHost {
			v.Add("environment_id", "Agent %q runs sessions directly on a host (sandbox mode off): choose a host environment, not %q.", ag.Name, e.Name)
		}
	}
	if err := v.Err(); err != nil {
		return Session{}, err
	}
	now := s.now()
	sess := Session{AgentID: ag.ID, Subject: a.Subject, CreatedBy: a.Name, EnvironmentID: &e.ID, SandboxMode: ag.SandboxMode,
		State: StatePending, Reason: "created by " + a.Name, CreatedAt: now, UpdatedAt: now}
	if a.UserID != 0 {
		uid := a.UserID
		sess.UserID = &uid
	}
	if ag.SandboxMode == agents.SandboxPerSession {
		sess.TemplateID = ag.TemplateID
		sess.Workspace = s.rt().SandboxWorkspace
	}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Counted in the creating transaction, so a burst of creates
		// cannot overshoot the caps; a refusal writes nothing.
		if err := s.checkOpen(ctx, tx, a, ag); err != nil {
			return err
		}
		if err := tx.Omit("AgentName", "AgentDepartmentID").Create(&sess).Error; err != nil {
			return err
		}
		// Both kinds of workspace are named after the session's id.
		if ag.SandboxMode != agents.SandboxPerSession {
			sess.Workspace = hostWorkspace(e, s.rt().hostDir(), sess.ID)
		} else {
			// Without a mount the workspace lives in the sandbox; the
			// creation's record is written either way.
			m, ok, err := e.WorkspaceMountFor(s.Org, sess.ID)
			if err != nil {
				return err
			}
			if ok {
				sess.Workspace, sess.WorkspaceMount = m.MountPath, m.HostPath
			}
		}
		err := tx.Table("sessions").Where("id = ?", sess.ID).
			Updates(map[string]any{"workspace": sess.Workspace, "workspace_mount": sess.WorkspaceMount}).Error
		if err != nil || in.Record == nil {
			return err
		}
		named := sess
		named.AgentName, named.AgentDepartmentID = ag.Name, ag.DepartmentID
		return in.Record(tx, named)
	})
	if err != nil {
		return Session{}, fmt.Errorf("save session: %w", err)
	}
	sess.AgentName, sess.AgentDepartmentID = ag.Name, ag.DepartmentID
	return sess, nil
}

// hostWorkspace is a session's directory on a host: one per session under
// the environment's workspace root (relative to agentd's root or working
// directory when the environment names none).
func hostWorkspace(e envs.Environment, dir string, id int64) string {
	name := strconv.FormatInt(id, 10)
	if e.OS == "windows" {
		root := strings.TrimRight(e.WorkspaceRoot, `\`)
		if root == "" {
			return dir + `\` + name
		}
		return root + `\` + dir + `\` + name
	}
	if e.WorkspaceRoot == "" {
		return path.Join(dir, name)
	}
	return path.Join(e.WorkspaceRoot, dir, name)
}

// ListFilter narrows a listing; zero values do not filter.
type ListFilter struct {
	AgentID int64
	UserID  int64
	State   string
	// CreatedAfter and CreatedBefore bound the creation time.
	CreatedAfter  time.Time
	CreatedBefore time.Time
	// Before is the paging cursor: sessions with a smaller id (newest
	// first).
	Before int64
	// IDs, when not nil, keeps only these sessions (none when empty):
	// for callers that know which sessions they want, like the E2B list,
	// and still need them filtered by who may see them.
	IDs []int64
	// Limit is the page size (default 50, at most 200).
	Limit int
}

// Page is one page of sessions, newest first; Next is the cursor of the
// next page (0 when this is the last).
type Page struct {
	Items []Session
	Next  int64
}

// transition moves sess from one of from to to in one transaction with its
// audit event, re-checking the state inside (another replica may have
// moved it). It returns the session as stored afterwards.
func (s *Service) transition(ctx context.Context, sess Session, from []string, to, reason string, actor audit.Actor, action string,
	updates map[string]any, details map[string]any) (Session, error) {
	now := s.now()
	set := map[string]any{"state": to, "reason": clip.String(reason, 500), "updated_at": now, "version": gorm.Expr("version + 1")}
	for k, v := range updates {
		set[k] = v
	}
	if to == StateClosed || to == StateLost {
		set["closed_at"] = now
		set["create_token"] = ""
	}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Table("sessions").Where("id = ? AND state IN ?", sess.ID, from).Updates(set)
		if res.Error != nil {
			return fmt.Errorf("update session: %w", res.Error)
		}
		if res.RowsAffected == 0 {
			return errMoved
		}
		return s.record(ctx, tx, sess, actor, action, sess.State, to, reason, details)
	})
	s.rt().forget(s.key(sess.ID))
	if err != nil {
		if errors.Is(err, errMoved) {
			cur, lerr := s.load(ctx, sess.ID)
			if lerr != nil {
				return sess, lerr
			}
			return cur, apperr.New(apperr.ErrConflict, "session_state_changed",
				"Session %d is %s now (%s); it changed while this request ran.", sess.ID, cur.State, cur.Reason)
		}
		return sess, err
	}
	return s.load(ctx, sess.ID)
}

// errMoved says a conditional update found the session in another state.
var errMoved = errors.New("session moved on")

// record appends a session event in tx.
func (s *Service) record(ctx context.Context, tx *gorm.DB, sess Session, actor audit.Actor, action, from, to, reason string, details map[string]any) error {
	d := map[string]any{"before": map[string]any{"state": from}, "after": map[string]any{"state": to}, "reason": reason}
	if sess.SandboxID != "" {
		d["sandbox_id"] = sess.SandboxID
	}
	for k, v := range details {
		d[k] = v
	}
	ev := audit.Event{Actor: actor, Action: action, Target: AuditTarget(sess), Decision: audit.Allow, Details: audit.Details(d)}
	if s.Decorate != nil && actor.Type != audit.ActorSystem {
		s.Decorate(&ev)
	}
	_, err := s.Audit.AppendTx(ctx, tx, ev)
	return err
}

// SystemActor is how the reclaimer and the lost-session checks appear in
// the audit log.
func SystemActor() audit.Actor {
	return audit.Actor{Type: audit.ActorSystem, ID: "system", Name: "sandbox-lifecycle"}
}

// backendError says what was attempted at the sandbox backend; the
// backend's message carries no credentials, and a failure to reach it is
// said without the backend's address (the log keeps the whole error).
func backendError(what string, err error) error {
	return apperr.WithCause(apperr.New(apperr.ErrUnavailable, "backend_error", "Could not %s at the sandbox backend: %s", what, failure(err)), err)
}

// failure is err as a caller may read it. A call that failed in transport
// names the address it called (an environment's agentd, a sandbox, the
// backend's API) in its text; that is said in words instead, as the
// gateway does, so a session's user never learns an address through it.
func failure(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err.Error()
	}
	var dns *net.DNSError
	switch {
	case ue.Timeout():
		return "it did not answer in time"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "it refused the connection"
	case errors.As(err, &dns):
		return "its host name does not resolve"
	}
	return "it could not be reached"
}
