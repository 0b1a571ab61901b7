// Package approvals holds approval requests: a command an agent's
// execution policy answered "ask" waits here until a person who may decide
// for the agent's department approves or denies it, it expires, or its
// requester cancels it. A request is bound to a digest of exactly what
// will run; its state leaves pending once, by a conditional update, so two
// replicas never both decide. Every transition is audited in the same
// transaction as the change. The package knows nothing of HTTP.
package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
)

// State is where a request stands.
type State string

// States: pending leaves once, to one of the other four.
const (
	Pending   State = "pending"
	Approved  State = "approved"
	Denied    State = "denied"
	Expired   State = "expired"
	Cancelled State = "cancelled"
)

// States lists every state, pending first.
var States = []State{Pending, Approved, Denied, Expired, Cancelled}

// Scope is how far an approval reaches.
type Scope string

// Scopes.
const (
	// ScopeOnce approves this request only.
	ScopeOnce Scope = "once"
	// ScopeSession also approves exactly the same binding again in the
	// same session (Binding.ProgramKey), without asking.
	ScopeSession Scope = "session"
	// ScopeRule adds an allow rule to the agent's execution policy.
	ScopeRule Scope = "rule"
)

// Decision is what a decider says.
type Decision string

// Decisions.
const (
	Approve Decision = "approve"
	Deny    Decision = "deny"
)

// Casbin object and action of deciding: held in the agent's department's
// domain by org admins and the department's owners, grantable like any
// permission. "read" lets auditors see requests without deciding them.
const (
	Object       = "approvals"
	ActionDecide = "decide"
	ActionRead   = "read"
)

// MaxReason bounds a decision's reason, in characters.
const MaxReason = 1000

// Approval is one request as callers see it.
type Approval struct {
	ID           int64
	SessionID    int64
	AgentID      int64
	DepartmentID *int64
	Requester    Requester
	Digest       string
	Command      string
	Cwd          string
	EnvNames     []string
	TTY          bool
	Stdin        bool
	Rule         string
	PolicyDigest string
	State        State
	ExpiresAt    time.Time
	// Decider is who decided (approved or denied); the system for an
	// approval a session grant covered.
	Decider audit.Actor
	Reason  string
	Scope   Scope
	// GrantedBy is the earlier "session" approval that covered this one.
	GrantedBy *int64
	// CommandID is the command the approval started, once it ran.
	CommandID *int64
	CreatedAt time.Time
	DecidedAt *time.Time
}

// row is the table shape.
type row struct {
	ID              int64 `gorm:"primaryKey"`
	SessionID       int64
	AgentID         int64
	DepartmentID    *int64
	RequesterType   string
	RequesterID     string
	RequesterName   string
	RequesterVia    string
	RequesterUserID *int64
	// RequesterCreatorUserID is who created the requesting key.
	RequesterCreatorUserID *int64
	Digest                 string
	Command                string
	ProgramKey             string
	Cwd                    string
	EnvNames               string
	TTY                    bool `gorm:"column:tty"`
	Stdin                  bool
	Rule                   string
	PolicyDigest           string
	State                  string
	ExpiresAt              time.Time
	DeciderType            string
	DeciderID              string
	DeciderName            string
	DecisionReason         string
	Scope                  string
	GrantedBy              *int64
	CommandID              *int64
	CreatedAt              time.Time
	DecidedAt              *time.Time
}

func (row) TableName() string { return "approvals" }

type grant struct {
	ID         int64 `gorm:"primaryKey"`
	SessionID  int64
	ProgramKey string
	ApprovalID int64
	CreatedAt  time.Time
}

func (grant) TableName() string { return "approval_grants" }

func (r row) approval() Approval {
	a := Approval{ID: r.ID, SessionID: r.SessionID, AgentID: r.AgentID, DepartmentID: r.DepartmentID,
		Requester: Requester{Type: r.RequesterType, ID: r.RequesterID, Name: r.RequesterName, Via: r.RequesterVia},
		Digest:    r.Digest, Command: r.Command, Cwd: r.Cwd, TTY: r.TTY, Stdin: r.Stdin, Rule: r.Rule, PolicyDigest: r.PolicyDigest,
		State: State(r.State), ExpiresAt: r.ExpiresAt.UTC(), Decider: audit.Actor{Type: r.DeciderType, ID: r.DeciderID, Name: r.DeciderName},
		Reason: r.DecisionReason, Scope: Scope(r.Scope), GrantedBy: r.GrantedBy, CommandID: r.CommandID, CreatedAt: r.CreatedAt.UTC()}
	if r.RequesterUserID != nil {
		a.Requester.UserID = *r.RequesterUserID
	}
	if r.RequesterCreatorUserID != nil {
		a.Requester.CreatorUserID = *r.RequesterCreatorUserID
	}
	if r.DecidedAt != nil {
		t := r.DecidedAt.UTC()
		a.DecidedAt = &t
	}
	_ = json.Unmarshal([]byte(r.EnvNames), &a.EnvNames)
	if a.EnvNames == nil {
		a.EnvNames = []string{}
	}
	return a
}

// Service is one org's approval queue.
type Service struct {
	DB    *gorm.DB
	Audit *audit.Log
	// Org names the org for the in-process notifier.
	Org string
	// Notifier releases waiters of this process at once (nil: waiters
	// notice through the database only).
	Notifier *Notifier
	// PollEvery is how often a waiter reads its request's row, which is
	// how a decision on another replica reaches it (0: DefaultPollEvery).
	PollEvery time.Duration
	Now       func() time.Time
	// AddRule adds an allow rule for a's program and arguments to the
	// agent's execution policy, in tx, as actor (an audited agent change).
	// Nil: the "rule" scope is refused as not available yet.
	AddRule func(ctx context.Context, tx *gorm.DB, actor *authz.Actor, a Approval) error
	// Requested hears of every pending request stored (the webhook). It
	// is called after the commit, before Request answers, and must not
	// block: slow work goes on a goroutine of its own.
	Requested func(ctx context.Context, a Approval)
}

// DefaultPollEvery is how often a waiter reads its row: a decision on
// another replica releases it within this (plus a query), well inside a
// second, the same freshness policy_version and config_version promise.
const DefaultPollEvery = 200 * time.Millisecond

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

func (s *Service) pollEvery() time.Duration {
	if s.PollEvery > 0 {
		return s.PollEvery
	}
	return DefaultPollEvery
}

// AuditTarget names a request in the audit log.
func AuditTarget(a Approval) audit.Target {
	return audit.Target{Type: "approval", ID: fmt.Sprint(a.ID), Name: clip.String(a.Command, 200)}
}

func validate(b Binding) (time.Duration, error) {
	v := apperr.Validation()
	if b.SessionID < 1 {
		v.Add("session_id", "A request needs the session it runs in.")
	}
	if b.AgentID < 1 {
		v.Add("agent_id", "A request needs the session's agent.")
	}
	if strings.TrimSpace(b.Command) == "" {
		v.Add("command", "A request needs the command it would run.")
	}
	if b.Requester.Type == "" || b.Requester.ID == "" {
		v.Add("requester", "A request needs who asked.")
	}
	to := b.Timeout
	if to == 0 {
		to = DefaultTimeout
	}
	if to < MinTimeout || to > MaxTimeout {
		v.Add("timeout", "The approval timeout must be from 1 minute to 24 hours.")
	}
	return to, v.Err()
}

// Request stores a request for b and audits it (approval.requested) before
// answering. When an approved "session" grant in b's session covers the
// same binding (Binding.ProgramKey), the request is stored already approved
// (GrantedBy names the grant's approval) and the caller may run at once.
func (s *Service) Request(ctx context.Context, b Binding) (Approval, error) {
	timeout, err := validate(b)
	if err != nil {
		return Approval{}, err
	}
	now := s.now()
	names, _ := json.Marshal(b.EnvNames())
	r := row{SessionID: b.SessionID, AgentID: b.AgentID, DepartmentID: b.DepartmentID,
		RequesterType: b.Requester.Type, RequesterID: b.Requester.ID, RequesterName: b.Requester.Name, RequesterVia: b.Requester.Via,
		Digest: b.Digest(), Command: b.Command, ProgramKey: b.ProgramKey(), Cwd: b.Cwd, EnvNames: string(names), TTY: b.TTY, Stdin: b.Stdin,
		Rule: b.Rule, PolicyDigest: b.PolicyDigest, State: string(Pending), ExpiresAt: now.Add(timeout), CreatedAt: now}
	if b.Requester.UserID != 0 {
		uid := b.Requester.UserID
		r.RequesterUserID = &uid
	}
	if b.Requester.CreatorUserID != 0 {
		uid := b.Requester.CreatorUserID
		r.RequesterCreatorUserID = &uid
	}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var g []grant
		if err := tx.Where("session_id = ? AND program_key = ?", r.SessionID, r.ProgramKey).Limit(1).Find(&g).Error; err != nil {
			return fmt.Errorf("read session grants: %w", err)
		}
		details := map[string]any{"command": r.Command, "rule": r.Rule, "policy_digest": r.PolicyDigest, "digest": r.Digest,
			"session_id": r.SessionID, "agent_id": r.AgentID, "cwd": r.Cwd, "env_names": json.RawMessage(names),
			"requester":  map[string]any{"type": r.RequesterType, "id": r.RequesterID, "name": r.RequesterName, "via": r.RequesterVia},
			"expires_at": r.ExpiresAt}
		if len(g) > 0 {
			gid := g[0].ApprovalID
			r.State, r.Scope, r.GrantedBy, r.DecidedAt = string(Approved), string(ScopeSession), &gid, &now
			r.DeciderType, r.DeciderID, r.DeciderName = audit.ActorSystem, "system", "session grant"
			details["state"], details["granted_by"] = r.State, gid
		}
		if err := tx.Create(&r).Error; err != nil {
			return fmt.Errorf("store approval request: %w", err)
		}
		return s.record(ctx, tx, audit.Actor{Type: r.RequesterType, ID: r.RequesterID, Name: r.RequesterName}, "approval.requested", r.approval(), details)
	})
	if err != nil {
		return Approval{}, err
	}
	a := r.approval()
	if s.Requested != nil && a.State == Pending {
		s.Requested(ctx, a)
	}
	return a, nil
}

func (s *Service) record(ctx context.Context, tx *gorm.DB, actor audit.Actor, action string, a Approval, details any) error {
	if s.Audit == nil {
		return errors.New("approvals: no audit log")
	}
	_, err := s.Audit.AppendTx(ctx, tx, audit.Event{Actor: actor, Action: action, Target: AuditTarget(a), Decision: audit.Allow, Details: audit.Details(details)})
	return err
}

// get reads request id, expiring it first when it is pending past its
// expiry, so no reader ever sees a pending request that can no longer be
// decided.
func (s *Service) get(ctx context.Context, id int64) (row, error) {
	var rs []row
	if err := s.DB.WithContext(ctx).Where("id = ?", id).Limit(1).Find(&rs).Error; err != nil {
		return row{}, fmt.Errorf("read approval %d: %w", id, err)
	}
	if len(rs) == 0 {
		return row{}, authz.NotFound()
	}
	r := rs[0]
	if r.State == string(Pending) && !s.now().Before(r.ExpiresAt) {
		if err := s.expire(ctx, r); err != nil {
			return row{}, err
		}
		return s.get(ctx, id)
	}
	return r, nil
}

// expire moves r from pending to expired (if it still is) and audits it.
func (s *Service) expire(ctx context.Context, r row) error {
	now := s.now()
	moved := false
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&row{}).Where("id = ? AND state = ? AND expires_at <= ?", r.ID, string(Pending), now).
			Updates(map[string]any{"state": string(Expired), "decided_at": now})
		if res.Error != nil {
			return fmt.Errorf("expire approval %d: %w", r.ID, res.Error)
		}
		if res.RowsAffected == 0 {
			return nil
		}
		moved = true
		r.State = string(Expired)
		return s.record(ctx, tx, audit.Actor{Type: audit.ActorSystem, ID: "system", Name: "approvals"}, "approval.expired", r.approval(),
			map[string]any{"command": r.Command, "expires_at": r.ExpiresAt, "session_id": r.SessionID})
	})
	if err == nil && moved {
		s.notify(r.ID)
	}
	return err
}

// Sweep expires every pending request past its expiry (at most limit of
// them; 0: 100) and reports how many it moved. List runs it before
// answering, and Get and Wait expire the request they read; no background
// loop calls it, so an unread request is expired (and audited) when it is
// next read or listed.
func (s *Service) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = 100
	}
	var due []row
	if err := s.DB.WithContext(ctx).Where("state = ? AND expires_at <= ?", string(Pending), s.now()).Order("id").Limit(limit).Find(&due).Error; err != nil {
		return 0, fmt.Errorf("read due approvals: %w", err)
	}
	for _, r := range due {
		if err := s.expire(ctx, r); err != nil {
			return 0, err
		}
	}
	return len(due), nil
}

func (s *Service) notify(id int64) {
	if s.Notifier != nil {
		s.Notifier.notify(s.Org, id)
	}
}

// isRequester reports whether a is the one who asked r: the same principal,
// or the person behind the key that asked.
func isRequester(a *authz.Actor, r row) bool {
	if a.Kind == r.RequesterType && a.ID == r.RequesterID {
		return true
	}
	return r.RequesterUserID != nil && a.UserID != 0 && *r.RequesterUserID == a.UserID
}

// RequestedBy reports whether a asked for ap (itself, or the person behind
// the key that did): it may cancel ap and never decide it.
func (ap Approval) RequestedBy(a *authz.Actor) bool {
	r := row{RequesterType: ap.Requester.Type, RequesterID: ap.Requester.ID}
	if ap.Requester.UserID != 0 {
		uid := ap.Requester.UserID
		r.RequesterUserID = &uid
	}
	return isRequester(a, r)
}

func domain(r row) string { return authz.Domain(r.DepartmentID) }

// canRead reports whether a may see r: its requester, or whoever may read
// or decide requests in its department.
func canRead(ctx context.Context, a *authz.Actor, r row) (bool, error) {
	if isRequester(a, r) {
		return true, nil
	}
	for _, act := range []string{ActionRead, ActionDecide} {
		ok, err := a.Allowed(ctx, domain(r), Object, act)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// Get returns request id as a may see it (not found when it may not).
func (s *Service) Get(ctx context.Context, a *authz.Actor, id int64) (Approval, error) {
	r, err := s.get(ctx, id)
	if err != nil {
		return Approval{}, err
	}
	ok, err := canRead(ctx, a, r)
	if err != nil {
		return Approval{}, err
	}
	if !ok {
		return Approval{}, a.Deny(authz.Denial{Target: AuditTarget(r.approval()), Domain: domain(r), Object: Object, Action: ActionRead,
			Rule: "neither its requester nor allowed to read or decide requests in its department", Hidden: true}, "")
	}
	return r.approval(), nil
}

// CanDecide reports whether a may decide r's requests in general (its
// department), not whether this one is its own.
func (s *Service) CanDecide(ctx context.Context, a *authz.Actor, ap Approval) (bool, error) {
	return a.Allowed(ctx, authz.Domain(ap.DepartmentID), Object, ActionDecide)
}

// ruleSelf is the rule a self-decision is refused by, as audited and told.
const ruleSelf = "nobody decides their own request (approvals: requester may not decide)"

// Decide approves or denies request id as a, exactly once: a request no
// longer pending answers 409 (code approval_expired when it expired, else approval_decided), and of two
// deciders at once, on any replicas, one wins. The decision, its audit
// record (approval.decided) and, for scope "session", the session grant
// commit together before Decide answers.
func (s *Service) Decide(ctx context.Context, a *authz.Actor, id int64, d Decision, scope Scope, reason string) (Approval, error) {
	v := apperr.Validation()
	if d != Approve && d != Deny {
		v.Add("decision", `Decision must be "approve" or "deny".`)
	}
	if scope == "" {
		scope = ScopeOnce
	}
	if !slices.Contains([]Scope{ScopeOnce, ScopeSession, ScopeRule}, scope) {
		v.Add("scope", `Scope must be "once", "session" or "rule".`)
	} else if d == Approve && scope == ScopeRule && s.AddRule == nil {
		v.Add("scope", "The rule scope is not available yet: approve once or for the session.")
	}
	reason = strings.TrimSpace(reason)
	if utf8.RuneCountInString(reason) > MaxReason {
		v.Add("reason", "The reason must be at most %d characters.", MaxReason)
	}
	if err := v.Err(); err != nil {
		return Approval{}, err
	}
	r, err := s.get(ctx, id)
	if err != nil {
		return Approval{}, err
	}
	if err := s.mayDecide(ctx, a, r); err != nil {
		return Approval{}, err
	}
	if err := settled(r); err != nil {
		return Approval{}, err
	}
	if d == Deny {
		scope = ScopeOnce
	}
	state := Approved
	if d == Deny {
		state = Denied
	}
	now := s.now()
	actor := a.AuditActor()
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&row{}).Where("id = ? AND state = ? AND expires_at > ?", id, string(Pending), now).
			Updates(map[string]any{"state": string(state), "decider_type": actor.Type, "decider_id": actor.ID, "decider_name": actor.Name,
				"decision_reason": reason, "scope": string(scope), "decided_at": now})
		if res.Error != nil {
			return fmt.Errorf("decide approval %d: %w", id, res.Error)
		}
		if res.RowsAffected == 0 {
			return errLost
		}
		r.State, r.DeciderType, r.DeciderID, r.DeciderName = string(state), actor.Type, actor.ID, actor.Name
		r.DecisionReason, r.Scope, r.DecidedAt = reason, string(scope), &now
		if state == Approved && scope == ScopeSession {
			g := grant{SessionID: r.SessionID, ProgramKey: r.ProgramKey, ApprovalID: r.ID, CreatedAt: now}
			// Another approval of the same binding may be storing its grant at
			// this moment: the first one stored stands, and this insert does
			// nothing rather than failing the decision (a unique violation
			// would abort the transaction on Postgres).
			if err := tx.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "session_id"}, {Name: "program_key"}}, DoNothing: true}).Create(&g).Error; err != nil {
				return fmt.Errorf("store session grant: %w", err)
			}
		}
		if state == Approved && scope == ScopeRule {
			if err := s.AddRule(ctx, tx, a, r.approval()); err != nil {
				return err
			}
		}
		return s.record(ctx, tx, actor, "approval.decided", r.approval(), map[string]any{"decision": string(d), "scope": string(scope),
			"reason": reason, "decider": actor, "command": r.Command, "rule": r.Rule})
	})
	if errors.Is(err, errLost) {
		// Another decider (or expiry) got there first: say what it is now.
		return Approval{}, s.whyLost(ctx, id, apperr.New(apperr.ErrConflict, "approval_decided", "This request was decided at the same moment by someone else."))
	}
	if err != nil {
		return Approval{}, err
	}
	s.notify(id)
	return r.approval(), nil
}

var errLost = errors.New("approval no longer pending")

// settled is the 409 for a request that is no longer pending.
func settled(r row) error {
	switch State(r.State) {
	case Pending:
		return nil
	case Expired:
		return apperr.New(apperr.ErrConflict, "approval_expired", "This request expired at %s without a decision.", r.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return apperr.New(apperr.ErrConflict, "approval_decided", "This request is already %s.", r.State)
}

// mayDecide checks a may decide r: not hidden from it, holding
// approvals:decide in r's department, and not its requester.
func (s *Service) mayDecide(ctx context.Context, a *authz.Actor, r row) error {
	target := AuditTarget(r.approval())
	dec, err := a.Decide(ctx, domain(r), Object, ActionDecide)
	if err != nil {
		return err
	}
	if !dec.Allowed {
		visible, err := canRead(ctx, a, r)
		if err != nil {
			return err
		}
		return a.Deny(authz.Denial{Target: target, Domain: domain(r), Object: Object, Action: ActionDecide, Rule: authz.RuleText(dec), Hidden: !visible},
			"You may not decide approval requests for this agent's department.")
	}
	if isRequester(a, r) {
		return a.Deny(authz.Denial{Target: target, Domain: domain(r), Object: Object, Action: ActionDecide, Rule: ruleSelf},
			"You asked for this command yourself, and "+ruleSelf+": someone else who may decide for the department must.")
	}
	if r.RequesterCreatorUserID != nil && a.UserID != 0 && *r.RequesterCreatorUserID == a.UserID {
		return a.Deny(authz.Denial{Target: target, Domain: domain(r), Object: Object, Action: ActionDecide, Rule: ruleSelf},
			"You created the API key that asked for this command, and "+ruleSelf+": someone else who may decide for the department must.")
	}
	return nil
}

// Cancel withdraws pending request id; only its requester may.
func (s *Service) Cancel(ctx context.Context, a *authz.Actor, id int64) (Approval, error) {
	r, err := s.get(ctx, id)
	if err != nil {
		return Approval{}, err
	}
	if !isRequester(a, r) {
		visible, err := canRead(ctx, a, r)
		if err != nil {
			return Approval{}, err
		}
		return Approval{}, a.Deny(authz.Denial{Target: AuditTarget(r.approval()), Domain: domain(r), Object: Object, Action: "cancel",
			Rule: "only the requester cancels a request", Hidden: !visible}, "Only the one who asked may cancel a request.")
	}
	if err := settled(r); err != nil {
		return Approval{}, err
	}
	now := s.now()
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&row{}).Where("id = ? AND state = ? AND expires_at > ?", id, string(Pending), now).
			Updates(map[string]any{"state": string(Cancelled), "decided_at": now})
		if res.Error != nil {
			return fmt.Errorf("cancel approval %d: %w", id, res.Error)
		}
		if res.RowsAffected == 0 {
			return errLost
		}
		r.State, r.DecidedAt = string(Cancelled), &now
		return s.record(ctx, tx, a.AuditActor(), "approval.cancelled", r.approval(), map[string]any{"command": r.Command})
	})
	if errors.Is(err, errLost) {
		err = s.whyLost(ctx, id, apperr.New(apperr.ErrConflict, "approval_decided", "This request was decided at the same moment."))
	}
	if err != nil {
		return Approval{}, err
	}
	s.notify(id)
	return r.approval(), nil
}

// whyLost is the answer for request id, which another writer changed
// first: what its state now says (decided, expired, cancelled), or
// otherwise.
func (s *Service) whyLost(ctx context.Context, id int64, otherwise error) error {
	cur, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	if serr := settled(cur); serr != nil {
		return serr
	}
	return otherwise
}

// Wait returns request id once it left pending (approved, denied, expired
// or cancelled), or ctx's error. A decision in this process releases it at
// once; one on another replica within PollEvery; expiry at its time.
func (s *Service) Wait(ctx context.Context, id int64) (Approval, error) {
	tick := time.NewTicker(s.pollEvery())
	defer tick.Stop()
	for {
		var woken <-chan struct{}
		if s.Notifier != nil {
			woken = s.Notifier.wait(s.Org, id)
		}
		r, err := s.get(ctx, id)
		if err != nil {
			return Approval{}, err
		}
		if r.State != string(Pending) {
			s.notify(id)
			return r.approval(), nil
		}
		due := time.NewTimer(max(r.ExpiresAt.Sub(s.now()), 0))
		select {
		case <-ctx.Done():
			due.Stop()
			return Approval{}, context.Cause(ctx)
		case <-woken:
		case <-tick.C:
		case <-due.C:
		}
		due.Stop()
	}
}

// SetCommand records, in the caller's transaction, that approved request
// id started command commandID. It succeeds once: a request not approved,
// or one that already started a command, answers 409, so an approval runs
// its command exactly once however many waiters race to start it.
func (s *Service) SetCommand(ctx context.Context, tx *gorm.DB, id, commandID int64) error {
	res := tx.WithContext(ctx).Model(&row{}).Where("id = ? AND state = ? AND command_id IS NULL", id, string(Approved)).Update("command_id", commandID)
	if res.Error != nil {
		return fmt.Errorf("record approval %d's command: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return apperr.New(apperr.ErrConflict, "approval_not_runnable", "This approval is not approved, or its command already started.")
	}
	return nil
}

// Filter narrows a list.
type Filter struct {
	State State
	// Before pages: only requests with a smaller id.
	Before int64
	Limit  int
}

// Page is one page of a list, newest first; Next is the Before of the next
// page (0: none).
type Page struct {
	Items []Approval
	Next  int64
}

// List returns the requests a may see, newest first, expiring due ones
// first so a pending one in the list can still be decided.
func (s *Service) List(ctx context.Context, a *authz.Actor, f Filter) (Page, error) {
	if f.State != "" && !slices.Contains(States, f.State) {
		v := apperr.Validation()
		v.Add("state", "State must be one of pending, approved, denied, expired, cancelled.")
		return Page{}, v
	}
	if _, err := s.Sweep(ctx, 0); err != nil {
		return Page{}, err
	}
	q, ok, err := s.visible(ctx, a)
	if err != nil || !ok {
		return Page{}, err
	}
	if f.State != "" {
		q = q.Where("state = ?", string(f.State))
	}
	if f.Before > 0 {
		q = q.Where("id < ?", f.Before)
	}
	limit := f.Limit
	if limit <= 0 || limit > 200 {
		limit = 50
	}
	var rs []row
	if err := q.Order("id DESC").Limit(limit + 1).Find(&rs).Error; err != nil {
		return Page{}, fmt.Errorf("list approvals: %w", err)
	}
	p := Page{Items: []Approval{}}
	if len(rs) > limit {
		rs = rs[:limit]
		p.Next = rs[limit-1].ID
	}
	for _, r := range rs {
		p.Items = append(p.Items, r.approval())
	}
	return p, nil
}

// visible is the query of the requests a may see (false: none).
func (s *Service) visible(ctx context.Context, a *authz.Actor) (*gorm.DB, bool, error) {
	q := s.DB.WithContext(ctx).Model(&row{})
	var depts []*int64
	if err := s.DB.WithContext(ctx).Model(&row{}).Distinct("department_id").Pluck("department_id", &depts).Error; err != nil {
		return nil, false, fmt.Errorf("read approval departments: %w", err)
	}
	var ids []int64
	org := false
	for _, d := range depts {
		ok, err := canRead(ctx, a, row{DepartmentID: d})
		if err != nil {
			return nil, false, err
		}
		switch {
		case ok && d == nil:
			org = true
		case ok:
			ids = append(ids, *d)
		}
	}
	cond := s.DB.Where("requester_type = ? AND requester_id = ?", a.Kind, a.ID)
	if a.UserID != 0 {
		cond = cond.Or("requester_user_id = ?", a.UserID)
	}
	if org {
		cond = cond.Or("department_id IS NULL")
	}
	if len(ids) > 0 {
		cond = cond.Or("department_id IN ?", ids)
	}
	return q.Where(cond), true, nil
}

// PendingCount is how many pending requests a may decide (its own left
// out), for the navigation's badge.
func (s *Service) PendingCount(ctx context.Context, a *authz.Actor) (int64, error) {
	var rs []row
	if err := s.DB.WithContext(ctx).Select("id, department_id, requester_type, requester_id, requester_user_id").
		Where("state = ? AND expires_at > ?", string(Pending), s.now()).Find(&rs).Error; err != nil {
		return 0, fmt.Errorf("count pending approvals: %w", err)
	}
	var n int64
	for _, r := range rs {
		if isRequester(a, r) {
			continue
		}
		ok, err := a.Allowed(ctx, domain(r), Object, ActionDecide)
		if err != nil {
			return 0, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}
