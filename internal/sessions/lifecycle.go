package sessions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Target is where a session's commands go: everything the terminal gateway
// needs to forward one operation. AgentdToken is injected by the gateway
// and never shown to clients.
type Target struct {
	Session     Session
	Environment envs.Environment
	// Agent is the session's agent (its execution policy decides every
	// exec).
	Agent       agents.Agent
	AgentdURL   string
	AgentdToken string
	// Workspace is the session's working directory at agentd ("" is
	// agentd's own root inside a sandbox).
	Workspace string
}

// Ensure makes a session a may use ready for a command and says where to
// send it: on first use it creates the sandbox (exactly once, whichever
// replica and however many callers race) or the host workspace; a paused
// sandbox is resumed; a running one has its backend timeout refreshed.
// A running session checked within the refresh interval costs neither a
// backend call nor a database write: only the policy check (and, at most
// once a second per org, a read of config_version: see freshness.go).
func (s *Service) Ensure(ctx context.Context, a *authz.Actor, sessionID int64) (Target, error) {
	return s.EnsureFor(ctx, a, sessionID, nil)
}

// EnsureFor is Ensure for one operation that check decides: check sees the
// session with its agent and environment after the session's own
// authorization and before anything changes, so an operation it refuses
// (a terminal rule, the agent's command policy) neither creates nor
// resumes a sandbox nor makes a workspace through agentd. A nil check
// allows.
func (s *Service) EnsureFor(ctx context.Context, a *authz.Actor, sessionID int64, check func(Target) error) (Target, error) {
	k := s.key(sessionID)
	if c, ok := s.fresh(ctx, k, true); ok {
		if err := s.authorize(ctx, a, c.target.Session, true); err != nil {
			return Target{}, err
		}
		return checked(c.target, check)
	}
	st := s.stampNow(ctx)
	sess, err := s.visible(ctx, a, sessionID, true)
	if err != nil {
		return Target{}, err
	}
	return s.ensure(ctx, a, sess, check, st)
}

// checked returns t when check allows it.
func checked(t Target, check func(Target) error) (Target, error) {
	if check != nil {
		if err := check(t); err != nil {
			return Target{}, err
		}
	}
	return t, nil
}

// Start is Ensure for people: it brings the session up now instead of at
// the first command and returns it.
func (s *Service) Start(ctx context.Context, a *authz.Actor, sessionID int64) (Session, error) {
	t, err := s.Ensure(ctx, a, sessionID)
	return t.Session, err
}

// fresh returns the cached session while it is within its refresh
// interval and its org's agents and environments did not change since it
// was read; for use (Ensure) only one the backend was asked about.
func (s *Service) fresh(ctx context.Context, k cacheKey, use bool) (*cached, bool) {
	c, ok := s.rt().get(k)
	if !ok || s.now().Sub(c.checked) >= c.refresh || (use && c.located) || !s.current(ctx, c.version) {
		return nil, false
	}
	return c, true
}

// ensure is Ensure's slow path, one caller per session in this process at
// a time. sess is the row the caller just read; it is read again only when
// another caller held the gate meanwhile (and may have changed it). st is
// the config version read before sess: what is cached here is valid for it.
func (s *Service) ensure(ctx context.Context, a *authz.Actor, sess Session, check func(Target) error, st stamp) (Target, error) {
	k := s.key(sess.ID)
	g := s.rt().gate(k)
	contended := !g.TryLock()
	if contended {
		if err := g.Lock(ctx, sess.ID, lifecycleLockWait); err != nil {
			return Target{}, err
		}
	}
	defer g.Unlock()
	if c, ok := s.fresh(ctx, k, true); ok {
		return checked(c.target, check)
	}
	var err error
	if sess.SandboxMode == agents.SandboxPerSession {
		// Its backend may be called (created, resumed, refreshed): one
		// lifecycle change of the session at a time, on every replica.
		unlock, err := s.lockAcrossReplicas(ctx, sess.ID)
		if err != nil {
			return Target{}, err
		}
		defer unlock()
		contended = true // another replica may have changed it meanwhile
	}
	if contended {
		if sess, err = s.load(ctx, sess.ID); err != nil {
			return Target{}, err
		}
	}
	if sess.Final() {
		return Target{}, finalError(sess)
	}
	env, ag, err := s.config(ctx, sess)
	if err != nil {
		return Target{}, err
	}
	if _, err := checked(Target{Session: sess, Environment: env, Agent: ag, Workspace: sess.Workspace}, check); err != nil {
		return Target{}, err
	}
	t := Target{Environment: env, Agent: ag}
	if sess.SandboxMode == agents.SandboxPerSession {
		if sess, err = s.ensureSandbox(ctx, a, sess, env, ag); err != nil {
			return Target{}, err
		}
		if t.AgentdURL, err = sandboxAgentdURL(env, sess); err != nil {
			return Target{}, err
		}
	} else {
		if sess.State == StatePending {
			if sess, err = s.makeHostWorkspace(ctx, a, sess, env); err != nil {
				return Target{}, err
			}
		}
		t.AgentdURL = env.URL
	}
	// After the sandbox is up: a new one brings its own token.
	if t.AgentdToken, err = s.agentdToken(env, sess); err != nil {
		return Target{}, err
	}
	t.Session, t.Workspace = sess, sess.Workspace
	// Nothing is forwarded into a workspace until it holds the agent's
	// skills and files (prepare.go).
	if err := s.prepare(ctx, a, t); err != nil {
		return Target{}, err
	}
	if st.ok {
		s.rt().put(k, &cached{target: t, checked: s.now(), refresh: s.rt().refreshEvery(ag.IdleTimeout()), version: st.version})
	}
	return t, nil
}

func finalError(sess Session) error {
	return apperr.New(apperr.ErrConflict, "session_"+sess.State, "Session %d is %s (%s); start a new session.", sess.ID, sess.State, sess.Reason)
}

// CodeEnvironmentGone is the error code of a session whose environment was
// deleted: nothing can run in it any more.
const CodeEnvironmentGone = "session_environment_gone"

// config reads the session's environment and agent as the session's
// configuration grants them.
func (s *Service) config(ctx context.Context, sess Session) (envs.Environment, agents.Agent, error) {
	if sess.EnvironmentID == nil {
		return envs.Environment{}, agents.Agent{}, apperr.New(apperr.ErrConflict, CodeEnvironmentGone,
			"The environment of session %d was deleted.", sess.ID)
	}
	env, err := s.Envs.Get(ctx, systemReader(), *sess.EnvironmentID)
	if err != nil {
		return env, agents.Agent{}, err
	}
	ag, err := s.Agents.Get(ctx, systemReader(), sess.AgentID)
	return env, ag, err
}

// Timings says when a session a may see pauses when idle and, paused, is
// reclaimed: its agent's idle timeout and reclaim window. The agent is read
// as the system: a may see the session without being allowed to read its
// agent, and learns only these two durations.
func (s *Service) Timings(ctx context.Context, a *authz.Actor, sess Session) (idle, reclaim time.Duration, err error) {
	if err := s.authorize(ctx, a, sess, false); err != nil {
		return 0, 0, err
	}
	ag, err := s.Agents.Get(ctx, systemReader(), sess.AgentID)
	if err != nil {
		return 0, 0, err
	}
	return ag.IdleTimeout(), ag.ReclaimAfter(), nil
}

// sandboxAgentdURL is where agentd answers in the session's sandbox. The
// URL, and with it the injected agentd token, is built from what the
// backend answered (on create or on resume): an id or domain that is not a
// plain name could steer it elsewhere, and is refused.
func sandboxAgentdURL(env envs.Environment, sess Session) (string, error) {
	sb := sandbox.Sandbox{ID: sess.SandboxID, Domain: sess.SandboxDomain}
	if !sandbox.SafeAddress(sb) {
		return "", errBadSandboxAddress()
	}
	return addressing(env).AgentdURL(sb), nil
}

func errBadSandboxAddress() error {
	return apperr.New(apperr.ErrUpstream, "backend_bad_sandbox", "The sandbox backend answered a sandbox id or domain that is not a plain name; the sandbox was not used.")
}

func addressing(e envs.Environment) sandbox.Addressing {
	return sandbox.Addressing{Scheme: e.SandboxScheme, Domain: e.SandboxDomain, ProxyBaseURL: e.ProxyBaseURL}
}

// ensureSandbox brings a per-session sandbox up: created when pending,
// connected (resumed, timeout refreshed) otherwise.
func (s *Service) ensureSandbox(ctx context.Context, a *authz.Actor, sess Session, env envs.Environment, ag agents.Agent) (Session, error) {
	b, err := s.Envs.Backend(env)
	if err != nil {
		return sess, err
	}
	if sess.State == StatePending {
		sess, err = s.createSandbox(ctx, a, sess, env, b, ag)
		if err != nil {
			return sess, s.startFailed(ctx, env, err)
		}
		if sess.State != StatePending {
			if err := s.Envs.ClearStartFailure(ctx, env, s.Audit); err != nil {
				slog.Default().Warn("mark an environment healthy again after a sandbox started", "org", s.Org, "environment", env.ID, "error", err)
			}
			return sess, nil
		}
	}
	if sess.Final() {
		return sess, finalError(sess)
	}
	return s.connect(ctx, a.AuditActor(), sess, b, ag, "resumed on use")
}

// startFailed marks env degraded when its backend failed to create a
// session's sandbox, with the backend's reason (the page of the
// environment shows it, and its probes keep it until a sandbox starts),
// and says in the error what the person can do. Other failures (the
// database, a canceled request) pass as they are.
func (s *Service) startFailed(ctx context.Context, env envs.Environment, err error) error {
	var ae *apperr.Error
	if !errors.As(err, &ae) || ae.Code != "backend_error" {
		return err
	}
	if rerr := s.Envs.RecordStartFailure(context.WithoutCancel(ctx), env, s.Audit, ae.Message); rerr != nil {
		slog.Default().Warn("mark an environment degraded after a failed sandbox start", "org", s.Org, "environment", env.ID, "error", rerr)
	}
	return apperr.WithCause(apperr.New(apperr.ErrUnavailable, "backend_error",
		"%s Environment %q is marked degraded with this reason. Whoever manages it can look at its page (Test connection, and the backend's own log); once it is fixed, start the session again: nothing was created.",
		ae.Message, env.Name), err)
}

// connect resumes a paused sandbox or refreshes a running one's timeout
// (one backend call either way) and records what the backend said.
func (s *Service) connect(ctx context.Context, actor audit.Actor, sess Session, b sandbox.Backend, ag agents.Agent, why string) (Session, error) {
	sb, err := b.Connect(ctx, sess.SandboxID, ag.IdleTimeout())
	if errors.Is(err, sandbox.ErrNotFound) {
		return sess, s.sandboxGone(ctx, sess)
	}
	if err != nil {
		return sess, backendError("resume the session's sandbox", err)
	}
	if sb.Domain != "" && !sandbox.SafeAddress(sandbox.Sandbox{ID: sess.SandboxID, Domain: sb.Domain}) {
		return sess, errBadSandboxAddress() // not stored: see sandboxAgentdURL
	}
	now := s.now()
	seen := map[string]any{"backend_state": string(sandbox.StateRunning), "backend_seen_at": now, "last_used_at": now}
	if sb.Domain != "" {
		seen["sandbox_domain"] = sb.Domain
	}
	if sess.State == StatePaused || sb.Resumed {
		reason := why
		if sess.State == StateRunning {
			reason = why + " (the backend had paused it when idle)"
		}
		return s.transition(ctx, sess, []string{StatePaused, StateRunning}, StateRunning, reason, actor, "session.resume", seen, nil)
	}
	if err := s.DB.WithContext(ctx).Table("sessions").Where("id = ? AND state = ?", sess.ID, StateRunning).Updates(seen).Error; err != nil {
		return sess, fmt.Errorf("record sandbox state: %w", err)
	}
	sess.BackendState, sess.BackendSeenAt, sess.LastUsedAt = string(sandbox.StateRunning), &now, &now
	if sb.Domain != "" {
		sess.SandboxDomain = sb.Domain
	}
	return sess, nil
}

// createSandbox creates the session's sandbox, exactly once: a
// conditional update takes the session's "creating" marker (on Postgres
// and SQLite alike the update is atomic), the winner creates and attaches,
// the others wait for it. A marker older than the create lease is a
// crashed creator's and is taken over; a create whose outcome is unknown
// (timeout after the backend accepted it) is looked up by its
// gatehouse.session tag, here and on every later attempt, never repeated
// blindly. Before anything else reaches the sandbox its agentd is given a
// token of its own (rekeyOrReplace). It returns the session as stored
// afterwards.
func (s *Service) createSandbox(ctx context.Context, a *authz.Actor, sess Session, env envs.Environment, b sandbox.Backend, ag agents.Agent) (Session, error) {
	token := randomToken()
	wait := 20 * time.Millisecond
	for {
		now := s.now()
		res := s.DB.WithContext(ctx).Table("sessions").
			Where("id = ? AND state = ? AND (create_token = '' OR create_started_at < ?)", sess.ID, StatePending, now.Add(-s.rt().createLease())).
			Updates(map[string]any{"create_token": token, "create_started_at": now, "create_attempts": gorm.Expr("create_attempts + 1"),
				"version": gorm.Expr("version + 1"), "updated_at": now})
		if res.Error != nil {
			return sess, fmt.Errorf("claim sandbox creation: %w", res.Error)
		}
		cur, err := s.load(ctx, sess.ID)
		if err != nil {
			return sess, err
		}
		if res.RowsAffected == 1 {
			sess = cur
			break
		}
		if cur.State != StatePending {
			return cur, nil
		}
		// Another caller (here or in another replica) is creating it.
		select {
		case <-ctx.Done():
			return cur, fmt.Errorf("wait for the sandbox being created: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 500*time.Millisecond)
	}
	sb, adopted, err := s.createOrFind(ctx, sess, b, ag)
	if err != nil {
		s.releaseClaim(sess.ID, token)
		return sess, err
	}
	sb, adopted, rk, err := s.rekeyOrReplace(ctx, env, sess, b, ag, sb, adopted)
	if err != nil {
		s.releaseClaim(sess.ID, token)
		return sess, err
	}
	return s.attach(ctx, a.AuditActor(), sess, token, sb, adopted, b, rk)
}

// createOrFind creates the sandbox, or finds the one an earlier attempt
// (or this one, when the answer was lost) created.
func (s *Service) createOrFind(ctx context.Context, sess Session, b sandbox.Backend, ag agents.Agent) (sandbox.Sandbox, bool, error) {
	if sess.CreateAttempts > 1 {
		if sb, ok, err := s.findByTag(ctx, sess, b, ag); err != nil || ok {
			return sb, ok, err
		}
	}
	req, err := s.createRequest(ctx, sess, ag)
	if err != nil {
		return sandbox.Sandbox{}, false, err
	}
	sb, err := b.Create(ctx, req)
	if err == nil {
		return sb, false, nil
	}
	if !sandbox.OutcomeUnknown(err) {
		return sb, false, backendError("create the session's sandbox", err)
	}
	// The backend may have created it: look before anyone tries again.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if found, ok, ferr := s.findByTag(lctx, sess, b, ag); ferr == nil && ok {
		return found, true, nil
	}
	return sb, false, backendError("create the session's sandbox", err)
}

// createRequest is what the backend is asked for the session's sandbox.
func (s *Service) createRequest(ctx context.Context, sess Session, ag agents.Agent) (sandbox.CreateRequest, error) {
	tpl, err := s.Envs.GetTemplate(ctx, systemReader(), deref64(sess.TemplateID))
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	user := sess.Subject
	if sess.UserID != nil {
		user = strconv.FormatInt(*sess.UserID, 10)
	}
	req := sandbox.CreateRequest{
		TemplateID:     tpl.BackendTemplateID,
		TimeoutSeconds: int(ag.IdleTimeout() / time.Second),
		AutoPause:      true,
		AutoResume:     true,
		Metadata: map[string]string{MetaOrg: s.Org, MetaSession: strconv.FormatInt(sess.ID, 10),
			MetaAgent: strconv.FormatInt(sess.AgentID, 10), MetaUser: user},
	}
	if sess.WorkspaceMount != "" {
		req.Metadata[MetaHostMount] = hostMount(sess)
	}
	return req, nil
}

// hostMount is the host-mount value of a session with a persistent
// workspace: its host directory, writable, at its workspace.
func hostMount(sess Session) string {
	type mount struct {
		HostPath  string `json:"hostPath"`
		MountPath string `json:"mountPath"`
		ReadOnly  bool   `json:"readOnly"`
	}
	b, _ := json.Marshal([]mount{{HostPath: sess.WorkspaceMount, MountPath: sess.Workspace}})
	return string(b)
}

// findByTag looks for the session's sandbox by its tags; extra ones
// (should a backend ever have made two) are killed.
func (s *Service) findByTag(ctx context.Context, sess Session, b sandbox.Backend, ag agents.Agent) (sandbox.Sandbox, bool, error) {
	list, err := b.List(ctx, sandbox.ListFilter{Metadata: map[string]string{MetaOrg: s.Org, MetaSession: strconv.FormatInt(sess.ID, 10)}})
	if err != nil {
		return sandbox.Sandbox{}, false, backendError("look up the session's sandbox", err)
	}
	if len(list) == 0 {
		return sandbox.Sandbox{}, false, nil
	}
	for _, extra := range list[1:] {
		_ = b.Kill(ctx, extra.ID)
	}
	sb, err := b.Connect(ctx, list[0].ID, ag.IdleTimeout())
	if errors.Is(err, sandbox.ErrNotFound) {
		return sandbox.Sandbox{}, false, nil
	}
	if err != nil {
		return sandbox.Sandbox{}, false, backendError("resume the session's sandbox", err)
	}
	return sb, true, nil
}

// releaseClaim drops this caller's creating marker after a failed create,
// so the next use tries again at once.
func (s *Service) releaseClaim(id int64, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.DB.WithContext(ctx).Table("sessions").Where("id = ? AND create_token = ?", id, token).
		Updates(map[string]any{"create_token": "", "create_started_at": nil}).Error
}

// attach records the created sandbox on the session with its audit event;
// when the claim was lost meanwhile (the session was closed, or a stalled
// creator's lease taken over) the sandbox is killed, never left behind.
func (s *Service) attach(ctx context.Context, actor audit.Actor, sess Session, token string, sb sandbox.Sandbox, adopted bool, b sandbox.Backend, rk rekeyed) (Session, error) {
	if !sandbox.SafeAddress(sb) {
		// Never used (see sandboxAgentdURL): kill it rather than leave it.
		if err := b.Kill(context.WithoutCancel(ctx), sb.ID); err != nil {
			slog.Default().Warn("kill a sandbox with an unusable address", "org", s.Org, "session", sess.ID, "error", err)
		}
		s.releaseClaim(sess.ID, token)
		return sess, errBadSandboxAddress()
	}
	now := s.now()
	reason := "sandbox created on first use"
	if adopted {
		reason = "sandbox found by its gatehouse.session tag after an earlier create's answer was lost"
	}
	set := map[string]any{"state": StateRunning, "reason": reason, "sandbox_id": sb.ID, "sandbox_domain": sb.Domain, "create_token": "",
		"started_at": now, "last_used_at": now, "backend_state": string(sandbox.StateRunning), "backend_seen_at": now,
		"agentd_failures": 0, "unreachable_since": nil, "version": gorm.Expr("version + 1"), "updated_at": now,
		"sealed_agentd_token": rk.sealed, "agentd_token_kind": rk.kind}
	// Attach even if the caller left: the sandbox exists now.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	err := s.DB.WithContext(dctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Table("sessions").Where("id = ? AND state = ? AND create_token = ?", sess.ID, StatePending, token).Updates(set)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return errMoved
		}
		attached := sess
		attached.SandboxID = sb.ID
		return s.record(dctx, tx, attached, actor, "session.start", StatePending, StateRunning, reason, map[string]any{"adopted": adopted, "agentd_token": rk.kind})
	})
	if err != nil {
		if kerr := b.Kill(dctx, sb.ID); kerr != nil && !errors.Is(kerr, sandbox.ErrNotFound) {
			err = errors.Join(err, fmt.Errorf("kill the unattached sandbox %s: %w", sb.ID, kerr))
		}
		if errors.Is(err, errMoved) {
			cur, lerr := s.load(ctx, sess.ID)
			if lerr != nil {
				return sess, lerr
			}
			if cur.Final() {
				return cur, finalError(cur)
			}
			if startedMeanwhile(cur) {
				// Another first use attached its sandbox: this one's is
				// killed, and the caller uses the session as it is.
				s.rt().forget(s.key(sess.ID))
				return cur, nil
			}
			return cur, apperr.New(apperr.ErrConflict, "session_state_changed", "Session %d changed while its sandbox was created; try again.", sess.ID)
		}
		return sess, fmt.Errorf("attach sandbox %s: %w", sb.ID, err)
	}
	s.rt().forget(s.key(sess.ID))
	return s.load(ctx, sess.ID)
}

// makeHostWorkspace creates a host session's workspace directory through
// agentd and marks the session running.
func (s *Service) makeHostWorkspace(ctx context.Context, a *authz.Actor, sess Session, env envs.Environment) (Session, error) {
	c, err := s.Envs.Agentd(env)
	if err != nil {
		return sess, err
	}
	cmd := "mkdir -p -- " + shellQuote(sess.Workspace)
	if env.OS == "windows" {
		cmd = `if not exist "` + sess.Workspace + `" mkdir "` + sess.Workspace + `"`
	}
	res, err := c.Run(ctx, agentd.CreateSessionRequest{Command: cmd, WaitMS: 10_000, TimeoutMS: 30_000})
	if err != nil {
		var ae *agentd.Error
		if errors.As(err, &ae) && ae.Status < 500 {
			return sess, apperr.New(apperr.ErrUnavailable, "agentd_error", "Could not create the session's workspace on %q: %v", env.Name, err)
		}
		return sess, apperr.WithCause(apperr.New(apperr.ErrUpstream, "environment_unreachable",
			"Could not create the session's workspace on %q: %s; try again shortly.", env.Name, failure(err)), err)
	}
	if res.State != agentd.StateExited || res.ExitCode != 0 {
		return sess, apperr.New(apperr.ErrUnavailable, "workspace_error", "Could not create the session's workspace %q on %q: %s",
			sess.Workspace, env.Name, strings.TrimSpace(string(res.Stderr)))
	}
	now := s.now()
	started, err := s.transition(ctx, sess, []string{StatePending}, StateRunning, "workspace "+sess.Workspace+" ready on "+env.Name, a.AuditActor(),
		"session.start", map[string]any{"started_at": now, "last_used_at": now}, nil)
	if err != nil && startedMeanwhile(started) {
		// A first use on another replica started it: what this one wanted.
		return started, nil
	}
	return started, err
}

// startedMeanwhile reports whether a session a start found moved on is
// running now: another first use started it, and the caller may use it.
func startedMeanwhile(cur Session) bool {
	return cur.State == StateRunning && (cur.SandboxMode != agents.SandboxPerSession || cur.SandboxID != "")
}

func shellQuote(p string) string { return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'" }

func randomToken() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func deref64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// backendOf is the backend of a session's environment, with its agent.
func (s *Service) backendOf(ctx context.Context, sess Session) (sandbox.Backend, agents.Agent, error) {
	env, ag, err := s.config(ctx, sess)
	if err != nil {
		return nil, ag, err
	}
	b, err := s.Envs.Backend(env)
	return b, ag, err
}

// sandboxGone makes sess lost because its sandbox no longer exists and
// says so to the caller.
func (s *Service) sandboxGone(ctx context.Context, sess Session) error {
	if err := s.markLost(ctx, sess.ID, "its sandbox "+sess.SandboxID+" no longer exists at the backend"); err != nil {
		return err
	}
	return apperr.New(apperr.ErrConflict, "session_lost", "Session %d is lost: its sandbox no longer exists at the backend. Start a new session.", sess.ID)
}

// usableSandbox loads a per-session session a may use for verb (pause,
// resume), refusing host sessions.
func (s *Service) usableSandbox(ctx context.Context, a *authz.Actor, id int64, verb string) (Session, error) {
	sess, err := s.visible(ctx, a, id, true)
	if err != nil {
		return sess, err
	}
	if sess.SandboxMode != agents.SandboxPerSession {
		return sess, apperr.New(apperr.ErrConflict, "session_no_sandbox", "Session %d runs on a host and has no sandbox to %s.", id, verb)
	}
	return sess, nil
}

// lifecycleLockWait bounds how long a lifecycle change waits for another
// one of the same session (a pause, a resume, an exec's start or resume):
// longer than a backend call takes.
const lifecycleLockWait = 60 * time.Second

// lockLifecycle serializes the lifecycle changes of one session that call
// its backend: an exec arriving during a pause waits for it and then
// resumes the sandbox; a pause arriving during an exec's start waits for
// the start. It holds the process's gate of the session and, on Postgres,
// an advisory lock of it across replicas; whoever holds it reads the
// session again before acting.
func (s *Service) lockLifecycle(ctx context.Context, id int64) (unlock func(), err error) {
	g := s.rt().gate(s.key(id))
	if err := g.Lock(ctx, id, lifecycleLockWait); err != nil {
		return nil, err
	}
	unlockDB, err := s.lockAcrossReplicas(ctx, id)
	if err != nil {
		g.Unlock()
		return nil, err
	}
	return func() {
		unlockDB()
		g.Unlock()
	}, nil
}

// lockAcrossReplicas is lockLifecycle's advisory lock (nothing on SQLite,
// which is single-node: the process's gate suffices).
func (s *Service) lockAcrossReplicas(ctx context.Context, id int64) (unlock func(), err error) {
	if store.DialectOfDB(s.DB) != store.Postgres {
		return func() {}, nil
	}
	release, err := s.rt().lockSlot(ctx, s.pool(), id, lifecycleLockWait)
	if err != nil {
		return nil, err
	}
	key := store.LockKey(fmt.Sprintf("gatehouse-session-lifecycle:%s:%d", s.Org, id))
	unlockDB, ok, err := store.AdvisoryLock(ctx, s.DB, key, lifecycleLockWait)
	if err != nil || !ok {
		release()
		if err == nil {
			err = sessionBusy(id, lifecycleLockWait)
		}
		return nil, err
	}
	return func() {
		unlockDB()
		release()
	}, nil
}

// Pause snapshots a running per-session sandbox a may use. It waits for a
// lifecycle change of the session under way (see lockLifecycle).
func (s *Service) Pause(ctx context.Context, a *authz.Actor, id int64) (Session, error) {
	if _, err := s.usableSandbox(ctx, a, id, "pause"); err != nil {
		return Session{}, err
	}
	unlock, err := s.lockLifecycle(ctx, id)
	if err != nil {
		return Session{}, err
	}
	defer unlock()
	sess, err := s.usableSandbox(ctx, a, id, "pause")
	if err != nil {
		return sess, err
	}
	if sess.State != StateRunning {
		return sess, apperr.New(apperr.ErrConflict, "session_not_running", "Session %d is %s, not running.", id, sess.State)
	}
	b, _, err := s.backendOf(ctx, sess)
	if err != nil {
		return sess, err
	}
	s.rt().forget(s.key(id))
	err = b.Pause(ctx, sess.SandboxID)
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return sess, s.sandboxGone(ctx, sess)
	case err != nil && !errors.Is(err, sandbox.ErrAlreadyPaused):
		return sess, backendError("pause the session's sandbox", err)
	}
	now := s.now()
	return s.transition(ctx, sess, []string{StateRunning}, StatePaused, "paused by "+a.Name, a.AuditActor(), "session.pause",
		map[string]any{"backend_state": string(sandbox.StatePaused), "backend_seen_at": now}, nil)
}

// Resume resumes a paused per-session sandbox a may use. It waits for a
// lifecycle change of the session under way (see lockLifecycle).
func (s *Service) Resume(ctx context.Context, a *authz.Actor, id int64) (Session, error) {
	if _, err := s.usableSandbox(ctx, a, id, "resume"); err != nil {
		return Session{}, err
	}
	unlock, err := s.lockLifecycle(ctx, id)
	if err != nil {
		return Session{}, err
	}
	defer unlock()
	sess, err := s.usableSandbox(ctx, a, id, "resume")
	if err != nil {
		return sess, err
	}
	switch sess.State {
	case StateRunning:
		return sess, nil
	case StatePaused:
	default:
		return sess, apperr.New(apperr.ErrConflict, "session_not_paused", "Session %d is %s, not paused.", id, sess.State)
	}
	b, ag, err := s.backendOf(ctx, sess)
	if err != nil {
		return sess, err
	}
	s.rt().forget(s.key(id))
	return s.connect(ctx, a.AuditActor(), sess, b, ag, "resumed by "+a.Name)
}

// Close ends a session a may use and kills its sandbox; the record stays.
// When the backend cannot be reached the session is closed anyway and the
// reclaimer kills the sandbox (closed sessions' sandboxes are orphans).
func (s *Service) Close(ctx context.Context, a *authz.Actor, id int64) (Session, error) {
	return s.CloseLeaving(ctx, a, id, nil)
}

// LeftRunning is a command a session's close could not end (agentd
// refused to kill it): the close records it, and the session's reason
// names it, unless the kill of the session's sandbox ended it after all.
type LeftRunning struct {
	CommandID int64  `json:"command_id"`
	Reason    string `json:"reason"`
}

// CloseLeaving is Close after the gateway ended the session's commands,
// with those it could not end: session.close lists them (not_ended) and
// the session's reason says how many, for its page.
func (s *Service) CloseLeaving(ctx context.Context, a *authz.Actor, id int64, left []LeftRunning) (Session, error) {
	sess, err := s.visible(ctx, a, id, true)
	if err != nil {
		return sess, err
	}
	if sess.Final() {
		return sess, nil
	}
	reason := "closed by " + a.Name
	details := map[string]any{}
	killed := false
	if sess.SandboxID != "" {
		if kerr := s.killSandbox(ctx, sess); kerr != nil {
			reason += "; killing its sandbox failed, the reclaimer will retry"
			details["kill_error"] = failure(kerr)
		} else {
			details["killed"], killed = true, true
		}
	}
	if len(left) > 0 && !killed {
		details["not_ended"] = left
		ids := make([]string, len(left))
		for i, l := range left {
			ids[i] = "#" + strconv.FormatInt(l.CommandID, 10)
		}
		reason += fmt.Sprintf("; %d command(s) could not be ended and may still run in the environment (%s): agentd refused to kill them",
			len(left), strings.Join(ids, ", "))
	}
	s.rt().forget(s.key(id))
	return s.transition(ctx, sess, []string{StatePending, StateRunning, StatePaused, StateLost}, StateClosed, reason, a.AuditActor(),
		"session.close", map[string]any{"backend_state": ""}, details)
}

func (s *Service) killSandbox(ctx context.Context, sess Session) error {
	b, _, err := s.backendOf(ctx, sess)
	if err != nil {
		return err
	}
	if err := b.Kill(ctx, sess.SandboxID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		return err
	}
	return nil
}

// markLost makes a session lost with reason, as the system, and kills its
// sandbox if one is left. A session already closed or lost stays as it is.
// For the gateway and the reclaimer, which hold the session already.
func (s *Service) markLost(ctx context.Context, sessionID int64, reason string) error {
	sess, err := s.load(ctx, sessionID)
	if err != nil {
		return err
	}
	s.rt().forget(s.key(sessionID))
	if sess.Final() {
		return nil
	}
	if _, err := s.transition(ctx, sess, []string{StatePending, StateRunning, StatePaused}, StateLost, reason, SystemActor(), "session.lost", nil, nil); err != nil {
		if errors.Is(err, apperr.ErrConflict) {
			return nil
		}
		return err
	}
	if sess.SandboxID != "" {
		_ = s.killSandbox(ctx, sess)
	}
	return nil
}

// ReportUnreachable is the gateway's (or the recorder's) word that a call
// to the session's agentd got no answer, or a 5xx one (cause says how).
// Only a session whose agentd fails every call for Runtime.UnreachableWindow
// is lost, however many calls failed meanwhile: a network blip or an agentd
// restart leaves the session and its commands running. A sandbox the
// backend says is gone makes the session lost at once; one the backend
// shows paused is left for the next use to resume. It reports whether the
// session is now lost.
func (s *Service) ReportUnreachable(ctx context.Context, sessionID int64, cause error) (bool, error) {
	now := s.now()
	// A failure more than half a window after the run's last one starts a
	// new run: "unreachable for the window" means failures all along it,
	// not two isolated ones an hour apart.
	gap := s.rt().unreachableWindow() / 2
	res := s.DB.WithContext(ctx).Table("sessions").Where("id = ? AND state = ?", sessionID, StateRunning).
		Updates(map[string]any{"agentd_failures": gorm.Expr("agentd_failures + 1"), "last_unreachable_at": now,
			"unreachable_since": gorm.Expr("CASE WHEN unreachable_since IS NULL OR last_unreachable_at IS NULL OR last_unreachable_at < ? THEN ? ELSE unreachable_since END",
				now.Add(-gap), now)})
	if res.Error != nil {
		return false, fmt.Errorf("record agentd failure: %w", res.Error)
	}
	s.rt().forget(s.key(sessionID))
	s.rt().unreachable(s.key(sessionID))
	if res.RowsAffected == 0 {
		return false, nil
	}
	sess, err := s.load(ctx, sessionID)
	if err != nil {
		return false, err
	}
	msg := "unknown error"
	if cause != nil {
		msg = clip.String(failure(cause), 200)
	}
	if sess.SandboxMode == agents.SandboxPerSession && sess.SandboxID != "" {
		b, _, err := s.backendOf(ctx, sess)
		if err != nil {
			return false, err
		}
		info, err := b.Get(ctx, sess.SandboxID)
		switch {
		case errors.Is(err, sandbox.ErrNotFound):
			return true, s.markLost(ctx, sessionID, "the sandbox backend says the sandbox is gone (agentd: "+msg+")")
		case err == nil && info.State != sandbox.StateRunning:
			return false, nil // paused: the next use resumes it
		}
		// Running, or the backend is away too: judged by the window.
	}
	if sess.UnreachableSince == nil || now.Sub(*sess.UnreachableSince) < s.rt().unreachableWindow() {
		return false, nil
	}
	reason := fmt.Sprintf("agentd did not answer for %s (since %s; last: %s)", s.rt().unreachableWindow(),
		sess.UnreachableSince.UTC().Format(time.RFC3339), msg)
	return true, s.markLost(ctx, sessionID, reason)
}

// ReportReachable is the gateway's word that agentd answered: it ends a
// run of failures. It writes only when failures were recorded.
func (s *Service) ReportReachable(ctx context.Context, sessionID int64) error {
	// Another replica may have recorded failures this one's cache does not
	// show: the conditional update runs whatever the cache says, at most
	// once a second per session here.
	if !s.rt().reachableDue(s.key(sessionID)) {
		return nil
	}
	res := s.DB.WithContext(ctx).Table("sessions").Where("id = ? AND (agentd_failures > 0 OR unreachable_since IS NOT NULL)", sessionID).
		Updates(map[string]any{"agentd_failures": 0, "unreachable_since": nil, "last_unreachable_at": nil})
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected > 0 {
		s.rt().forget(s.key(sessionID))
	}
	return nil
}
