package sessions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/store"
)

// RoundStats counts what a reclaim round saw and did.
type RoundStats struct {
	Orgs int
	// Listed is how many tagged sandboxes the backends reported.
	Listed int
	// Reclaimed: paused longer than the agent's reclaim window, killed,
	// session closed.
	Reclaimed int
	// Orphans: tagged sandboxes of closed, lost, unknown or other
	// sessions, killed.
	Orphans int
	// Lost: sessions whose sandbox disappeared.
	Lost int
	// Synced: sessions whose state followed the backend's (paused by its
	// idle timeout, resumed by traffic).
	Synced int
	// Skipped: environments or orgs not judged this round (backend or
	// database unavailable, or another replica holds the org).
	Skipped int
	Errors  int
}

func (r *RoundStats) add(o RoundStats) {
	r.Orgs += o.Orgs
	r.Listed += o.Listed
	r.Reclaimed += o.Reclaimed
	r.Orphans += o.Orphans
	r.Lost += o.Lost
	r.Synced += o.Synced
	r.Skipped += o.Skipped
	r.Errors += o.Errors
}

// OrgDeps is what the reclaimer needs of one org while it works on it.
type OrgDeps struct {
	Sessions *Service
	Release  func()
}

// Reclaimer runs the reclaim round for every active org. With several
// console replicas on Postgres an advisory lock per org lets one replica
// do an org per round. It keeps no memory between rounds: every decision
// comes from the backend's reported state and timestamps and the
// database, so a restarted console decides as the old one would have.
type Reclaimer struct {
	ListOrgs func(ctx context.Context) ([]string, error)
	OpenOrg  func(ctx context.Context, slug string) (OrgDeps, error)
	// Interval between rounds (default 60 s) when Tick is nil.
	Interval time.Duration
	// Tick, when set, drives the rounds instead of a ticker (tests own it).
	Tick <-chan time.Time
	// Stats, when set, receives each round's counts.
	Stats  chan<- RoundStats
	Logger *slog.Logger
}

// DefaultReclaimInterval is how often the round runs by default.
const DefaultReclaimInterval = 60 * time.Second

// Run runs a round at start and on every tick until ctx ends.
func (r *Reclaimer) Run(ctx context.Context) {
	tick := r.Tick
	if tick == nil {
		every := r.Interval
		if every <= 0 {
			every = DefaultReclaimInterval
		}
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		st := r.Round(ctx)
		if r.Stats != nil {
			select {
			case r.Stats <- st:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}

func (r *Reclaimer) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

// Round works through every org once. Without the catalog the round is
// skipped; an org whose database is down is skipped alone.
func (r *Reclaimer) Round(ctx context.Context) RoundStats {
	var total RoundStats
	slugs, err := r.ListOrgs(ctx)
	if err != nil {
		if store.IsUnavailable(err) {
			r.logger().Warn("reclaim: round skipped, database unavailable", "database", "catalog", "error", err)
		} else {
			r.logger().Warn("reclaim: list orgs", "error", err)
		}
		total.Skipped++
		return total
	}
	for _, slug := range slugs {
		if ctx.Err() != nil {
			break
		}
		st, err := r.ReclaimOrg(ctx, slug)
		total.add(st)
		if err != nil {
			total.Skipped++
			if store.IsUnavailable(err) {
				r.logger().Warn("reclaim: org skipped this round, database unavailable", "org", slug, "error", err)
				continue
			}
			r.logger().Warn("reclaim failed", "org", slug, "error", err)
		}
	}
	return total
}

func reclaimLockKey(slug string) int64 { return store.LockKey("gatehouse-reclaim:" + slug) }

// ReclaimOrg runs one org's round unless another replica holds its lock.
func (r *Reclaimer) ReclaimOrg(ctx context.Context, slug string) (RoundStats, error) {
	deps, err := r.OpenOrg(ctx, slug)
	if err != nil {
		return RoundStats{}, err
	}
	defer deps.Release()
	unlock, ok, err := store.TryAdvisoryLock(ctx, deps.Sessions.DB, reclaimLockKey(slug))
	if err != nil {
		return RoundStats{}, err
	}
	if !ok {
		return RoundStats{Skipped: 1}, nil
	}
	defer unlock()
	st, err := deps.Sessions.Reclaim(ctx, r.logger())
	st.Orgs = 1
	return st, err
}

// action is one decision of a round, taken after a re-check.
type action struct {
	env    envs.Environment
	b      sandbox.Backend
	info   sandbox.Info
	sess   *Session
	kind   string // reclaim, orphan, paused, resumed, lost
	reason string
}

// Reclaim runs the org's round: for every sandbox environment it lists the
// org's tagged sandboxes and acts on each (see RoundStats); sessions whose
// sandbox is missing from a complete list (and from a direct look-up) are
// lost. An environment whose list fails is not judged this round. Every
// action is audited as the system. For the reclaimer, as the system.
func (s *Service) Reclaim(ctx context.Context, log *slog.Logger) (RoundStats, error) {
	var st RoundStats
	if log == nil {
		log = slog.Default()
	}
	all, err := s.Envs.List(ctx, systemReader())
	if err != nil {
		return st, err
	}
	windows, err := s.reclaimWindows(ctx)
	if err != nil {
		return st, err
	}
	var acts []action
	for _, env := range all {
		if env.Kind != envs.KindSandbox {
			continue
		}
		b, err := s.Envs.Backend(env)
		if err != nil {
			st.Skipped++
			continue
		}
		listed := s.now()
		infos, err := b.List(ctx, sandbox.ListFilter{Metadata: map[string]string{MetaOrg: s.Org}})
		if err != nil {
			// Nothing is judged from a list that failed.
			log.Warn("reclaim: list sandboxes failed; environment skipped this round", "org", s.Org, "environment", env.ID, "error", err)
			st.Skipped++
			continue
		}
		st.Listed += len(infos)
		envActs, err := s.judge(ctx, env, b, infos, listed, windows)
		if err != nil {
			return st, err
		}
		acts = append(acts, envActs...)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	var firstErr error
	for _, act := range acts {
		wg.Add(1)
		sem <- struct{}{}
		go func(act action) {
			defer wg.Done()
			defer func() { <-sem }()
			done, err := s.act(ctx, act)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				st.Errors++
				log.Warn("reclaim: action failed", "org", s.Org, "action", act.kind, "sandbox_id", act.info.ID, "error", err)
				if store.IsUnavailable(err) && firstErr == nil {
					firstErr = err
				}
				return
			}
			if !done {
				return
			}
			switch act.kind {
			case "reclaim":
				st.Reclaimed++
			case "orphan":
				st.Orphans++
			case "lost":
				st.Lost++
			default:
				st.Synced++
			}
		}(act)
	}
	wg.Wait()
	return st, firstErr
}

// reclaimWindows reads every agent's reclaim-after-pause setting, by id.
func (s *Service) reclaimWindows(ctx context.Context) (map[int64]agents.Agent, error) {
	var rows []agents.Agent
	if err := s.DB.WithContext(ctx).Select("id, reclaim_after_seconds").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read agents: %w", err)
	}
	out := make(map[int64]agents.Agent, len(rows))
	for _, r := range rows {
		out[r.ID] = r
	}
	return out, nil
}

// judge decides what to do with one environment's tagged sandboxes.
func (s *Service) judge(ctx context.Context, env envs.Environment, b sandbox.Backend, infos []sandbox.Info, listed time.Time,
	windows map[int64]agents.Agent) ([]action, error) {
	now := s.now()
	ids := make([]int64, 0, len(infos))
	for _, in := range infos {
		if id, err := strconv.ParseInt(in.Metadata[MetaSession], 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	bySession, err := s.sessionsByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	var acts []action
	seen := map[string]bool{}
	for _, in := range infos {
		seen[in.ID] = true
		act := action{env: env, b: b, info: in}
		id, perr := strconv.ParseInt(in.Metadata[MetaSession], 10, 64)
		sess, ok := bySession[id]
		switch {
		case perr != nil || !ok:
			act.kind, act.reason = "orphan", "its session is unknown"
		case sess.EnvironmentID == nil || *sess.EnvironmentID != env.ID:
			act.kind, act.reason = "orphan", "its session belongs to another environment"
		case sess.Final():
			act.kind, act.reason = "orphan", "its session is "+sess.State
		case sess.State == StatePending:
			claimed := sess.CreateToken != "" && sess.CreateStartedAt != nil && now.Sub(*sess.CreateStartedAt) < s.rt().createLease()
			if claimed || now.Sub(in.StartedAt) < s.rt().createLease() {
				continue // being created right now
			}
			act.kind, act.reason = "orphan", "it was never attached to its session"
		case sess.SandboxID != in.ID:
			act.kind, act.reason = "orphan", "its session has another sandbox ("+sess.SandboxID+")"
		case in.State == sandbox.StatePaused && !in.EndAt.IsZero():
			window := windows[sess.AgentID].ReclaimAfter() // an unknown agent: the default
			pausedFor := now.Sub(in.EndAt)
			switch {
			case pausedFor > window:
				act.kind = "reclaim"
				act.reason = fmt.Sprintf("reclaimed: paused for %s, longer than the agent's reclaim window of %s", pausedFor.Round(time.Second), window)
			case sess.State == StateRunning:
				act.kind, act.reason = "paused", "paused by the backend after the idle timeout"
			default:
				continue
			}
		case in.State == sandbox.StateRunning && sess.State == StatePaused:
			act.kind, act.reason = "resumed", "resumed at the backend (traffic woke it)"
		default:
			continue
		}
		if ok {
			cp := sess
			act.sess = &cp
		}
		acts = append(acts, act)
	}
	// Sessions whose sandbox is missing from this complete list. Only
	// those attached before the list was taken are judged.
	var live []Session
	if err := s.sessionQuery(ctx).Where("sessions.environment_id = ? AND sessions.state IN ? AND sessions.sandbox_id <> '' AND sessions.started_at < ?",
		env.ID, []string{StateRunning, StatePaused}, listed).Find(&live).Error; err != nil {
		return nil, fmt.Errorf("read live sessions: %w", err)
	}
	for _, sess := range live {
		if seen[sess.SandboxID] {
			continue
		}
		cp := sess
		acts = append(acts, action{env: env, b: b, info: sandbox.Info{ID: sess.SandboxID}, sess: &cp, kind: "lost",
			reason: "its sandbox " + sess.SandboxID + " disappeared at the backend"})
	}
	return acts, nil
}

// sessionsByID reads the sessions with the given ids.
func (s *Service) sessionsByID(ctx context.Context, ids []int64) (map[int64]Session, error) {
	out := make(map[int64]Session, len(ids))
	for start := 0; start < len(ids); start += 500 {
		end := min(start+500, len(ids))
		var list []Session
		if err := s.sessionQuery(ctx).Where("sessions.id IN ?", ids[start:end]).Find(&list).Error; err != nil {
			return nil, fmt.Errorf("read sessions: %w", err)
		}
		for _, x := range list {
			out[x.ID] = x
		}
	}
	return out, nil
}

// act re-checks a decision against the backend where it kills, then takes
// it with its audit record. It reports whether anything was done.
func (s *Service) act(ctx context.Context, act action) (bool, error) {
	switch act.kind {
	case "orphan":
		if err := act.b.Kill(ctx, act.info.ID); err != nil {
			if errors.Is(err, sandbox.ErrNotFound) {
				return false, nil
			}
			return false, err
		}
		_, err := s.Audit.Append(ctx, audit.Event{Actor: SystemActor(), Action: "sandbox.kill", Decision: audit.Allow,
			Target:  audit.Target{Type: "sandbox", ID: act.info.ID, Name: act.env.Name},
			Details: audit.Details(map[string]any{"reason": "orphan: " + act.reason, "session": act.info.Metadata[MetaSession], "environment_id": act.env.ID})})
		return true, err
	case "reclaim":
		// Re-check: a use may have resumed it since the list.
		cur, err := act.b.Get(ctx, act.info.ID)
		if errors.Is(err, sandbox.ErrNotFound) {
			return s.lost(ctx, *act.sess, "its sandbox "+act.info.ID+" disappeared at the backend")
		}
		if err != nil {
			return false, err
		}
		if cur.State != sandbox.StatePaused || !cur.EndAt.Equal(act.info.EndAt) {
			return false, nil
		}
		if err := act.b.Kill(ctx, act.info.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			return false, err
		}
		to, reason, updates := StateClosed, act.reason, map[string]any{"backend_state": ""}
		details := map[string]any{"paused_at": act.info.EndAt}
		if act.sess.WorkspaceMount != "" {
			// The workspace is on the host: only the sandbox is gone, and
			// the next use creates a new one over the same files.
			to = StatePending
			reason += "; workspace kept at " + act.sess.WorkspaceMount + ", the next use creates a new sandbox"
			updates = unattached()
			details["workspace_kept"] = act.sess.WorkspaceMount
		}
		_, err = s.transition(ctx, *act.sess, []string{StateRunning, StatePaused}, to, reason, SystemActor(), "session.reclaim", updates, details)
		return err == nil, ignoreMoved(err)
	case "paused":
		_, err := s.transition(ctx, *act.sess, []string{StateRunning}, StatePaused, act.reason, SystemActor(), "session.pause",
			map[string]any{"backend_state": string(sandbox.StatePaused), "backend_seen_at": s.now()}, nil)
		return err == nil, ignoreMoved(err)
	case "resumed":
		_, err := s.transition(ctx, *act.sess, []string{StatePaused}, StateRunning, act.reason, SystemActor(), "session.resume",
			map[string]any{"backend_state": string(sandbox.StateRunning), "backend_seen_at": s.now()}, nil)
		return err == nil, ignoreMoved(err)
	case "lost":
		// Confirm with a direct look-up: a list is a snapshot.
		_, err := act.b.Get(ctx, act.info.ID)
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, sandbox.ErrNotFound) {
			return false, err
		}
		return s.lost(ctx, *act.sess, act.reason)
	}
	return false, fmt.Errorf("unknown reclaim action %q", act.kind)
}

// unattached are the updates that make a session's row as it was before
// its first sandbox: no sandbox, no creation under way, no failures.
func unattached() map[string]any {
	return map[string]any{"sandbox_id": "", "sandbox_domain": "", "backend_state": "", "backend_seen_at": nil,
		"create_token": "", "create_started_at": nil, "create_attempts": 0, "agentd_failures": 0, "unreachable_since": nil,
		"sealed_agentd_token": "", "agentd_token_kind": ""}
}

func (s *Service) lost(ctx context.Context, sess Session, reason string) (bool, error) {
	_, err := s.transition(ctx, sess, []string{StatePending, StateRunning, StatePaused}, StateLost, reason, SystemActor(), "session.lost", nil, nil)
	return err == nil, ignoreMoved(err)
}

// ignoreMoved treats "the session moved on meanwhile" as nothing to do.
func ignoreMoved(err error) error {
	if errors.Is(err, apperr.ErrConflict) {
		return nil
	}
	return err
}
