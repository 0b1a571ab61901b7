// Package authz holds the acting principal of a request and the checks
// that decide, object by object, what it may see and do. Domain services
// (environments, templates, agents, sessions) take an *Actor and ask it
// before they return or change anything, so no handler can forget a check:
// a caller that may not see an object gets "not found", one that may see
// it but not act on it gets "forbidden", and every refusal becomes an
// audit event. The console's handlers and the terminal gateway build an
// Actor the same way.
package authz

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/rbac"
)

// Principal is who is making a request.
type Principal struct {
	// Kind is an audit actor type: audit.ActorPlatformAdmin, ActorUser,
	// ActorAPIKey or ActorSystem.
	Kind string
	ID   string
	Name string
	// LoginID is the server-side sign-in behind a cookie or token (empty
	// for API keys).
	LoginID string
	// MustChangePassword restricts the principal to changing it.
	MustChangePassword bool
	// ViaCookie is true when the browser's cookie carried the credentials.
	ViaCookie bool
	// Subject is the casbin subject inside an org (user:<id>, key:<id> or
	// the platform-admin subject).
	Subject string
	// UserID is the org user acting (directly or through a personal key).
	UserID int64
	// KeyID is set when an API key authenticated the request.
	KeyID int64
	// KeyCreatorID is the user who created that key (0: none known), who
	// may not decide what the key asks for.
	KeyCreatorID int64
}

// AuditActor is the principal as the audit log names it.
func (p *Principal) AuditActor() audit.Actor {
	if p == nil {
		return audit.Actor{Type: audit.ActorAnonymous}
	}
	return audit.Actor{Type: p.Kind, ID: p.ID, Name: p.Name}
}

// Checker is the policy decision point: one org's casbin enforcer.
type Checker interface {
	Decide(ctx context.Context, sub, dom, obj, act string) (rbac.Decision, error)
	// DecideAnywhere allows when any domain the subject holds a role in
	// allows (listings, which then filter per object).
	DecideAnywhere(ctx context.Context, sub, obj, act string) (rbac.Decision, error)
}

// Denial is one refused check, as it goes to the audit log.
type Denial struct {
	// Target is the object refused (an environment, an agent, ...).
	Target audit.Target
	Domain string
	Object string
	Action string
	// Rule says what decided: the casbin rule, or the object rule in
	// words ("private to another user").
	Rule string
	// Hidden is true when the caller may not see the object at all; it
	// is answered as not found so its existence does not leak.
	Hidden bool
	// Answer names what the caller was told when that was neither
	// "forbidden" nor "not_found": a refusal by a cap rather than by a
	// policy is answered "too_many_requests" (see Refuse).
	Answer string
}

// Recorder writes denials to the audit log. It is called after the
// operation returned, outside any transaction the operation opened, so a
// rolled-back change never takes its denial record with it.
type Recorder func(ctx context.Context, denials []Denial) error

// Actor is a principal bound to one org's policy and denial recorder. It is
// made per request (or per gateway operation) and is safe for concurrent
// use.
type Actor struct {
	Principal
	check  Checker
	record Recorder
	system bool

	mu      sync.Mutex
	pending []Denial
}

// New binds p to an org's checker and denial recorder.
func New(p Principal, check Checker, record Recorder) *Actor {
	return &Actor{Principal: p, check: check, record: record}
}

// System is the actor of the console's own background work (health checks,
// sandbox reclamation): it may do everything, and is audited as the system.
func System(name string) *Actor {
	return &Actor{Principal: Principal{Kind: audit.ActorSystem, ID: "system", Name: name, Subject: "system"}, system: true}
}

// Allowed asks the policy whether the actor may act on obj in dom. It
// records nothing: use it for listings and to decide what a page offers.
// An error is a failed check (the caller answers 500), never a denial.
func (a *Actor) Allowed(ctx context.Context, dom, obj, act string) (bool, error) {
	d, err := a.Decide(ctx, dom, obj, act)
	return d.Allowed, err
}

// Decide is Allowed with the deciding rule.
func (a *Actor) Decide(ctx context.Context, dom, obj, act string) (rbac.Decision, error) {
	if a.system {
		return rbac.Decision{Allowed: true, Rule: "system"}, nil
	}
	if a.check == nil {
		return rbac.Decision{}, errors.New("authz: actor has no policy checker")
	}
	d, err := a.check.Decide(ctx, a.Subject, dom, obj, act)
	if err != nil {
		return rbac.Decision{}, fmt.Errorf("authorize %s %s in %s: %w", act, obj, dom, err)
	}
	return d, nil
}

// AllowedAnywhere is Allowed in the org or any department where the actor
// holds a role.
func (a *Actor) AllowedAnywhere(ctx context.Context, obj, act string) (bool, error) {
	d, err := a.DecideAnywhere(ctx, obj, act)
	return d.Allowed, err
}

// DecideAnywhere is AllowedAnywhere with the deciding rule.
func (a *Actor) DecideAnywhere(ctx context.Context, obj, act string) (rbac.Decision, error) {
	if a.system {
		return rbac.Decision{Allowed: true, Rule: "system"}, nil
	}
	if a.check == nil {
		return rbac.Decision{}, errors.New("authz: actor has no policy checker")
	}
	d, err := a.check.DecideAnywhere(ctx, a.Subject, obj, act)
	if err != nil {
		return rbac.Decision{}, fmt.Errorf("authorize %s %s: %w", act, obj, err)
	}
	return d, nil
}

// Require checks (dom, obj, act) and, when refused, records the denial and
// returns the error to answer: not found when hidden, else forbidden with
// message.
func (a *Actor) Require(ctx context.Context, d Denial, message string) error {
	dec, err := a.Decide(ctx, d.Domain, d.Object, d.Action)
	if err != nil {
		return err
	}
	if dec.Allowed {
		return nil
	}
	d.Rule = RuleText(dec)
	return a.Deny(d, message)
}

// RuleText describes a casbin decision for the audit log.
func RuleText(d rbac.Decision) string {
	if d.Rule == "" {
		return "no policy allows it (default deny)"
	}
	return "policy " + d.Rule
}

// Deny records a refusal and returns what to answer: ErrNotFound for a
// hidden object, ErrForbidden with message otherwise.
func (a *Actor) Deny(d Denial, message string) error {
	a.mu.Lock()
	a.pending = append(a.pending, d)
	a.mu.Unlock()
	if d.Hidden {
		return NotFound()
	}
	if message == "" {
		message = fmt.Sprintf("You do not have permission to %s %s.", d.Action, d.Object)
	}
	return apperr.New(apperr.ErrForbidden, "forbidden", "%s", message)
}

// Refuse records a refusal that no policy made (a cap on open sessions or
// running commands was reached) exactly as Deny records one, so it is
// audited the same way, and returns answer, which says why to the caller.
func (a *Actor) Refuse(d Denial, answer error) error {
	_ = a.Deny(d, "")
	return answer
}

// Denials returns the refusals recorded so far.
func (a *Actor) Denials() []Denial {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Denial(nil), a.pending...)
}

// Flush writes the pending denials to the audit log. The HTTP layer calls
// it once the operation returned; an error means a refusal could not be
// recorded and the request must fail (500) rather than pass silently.
func (a *Actor) Flush(ctx context.Context) error {
	a.mu.Lock()
	ds := a.pending
	a.pending = nil
	a.mu.Unlock()
	if len(ds) == 0 || a.record == nil {
		return nil
	}
	if err := a.record(ctx, ds); err != nil {
		return fmt.Errorf("record %d denial(s): %w", len(ds), err)
	}
	return nil
}

// NotFound is the answer for an object the caller may not see: the same as
// for one that does not exist.
func NotFound() error {
	return apperr.New(apperr.ErrNotFound, "not_found", "There is nothing at this address, or you may not see it.")
}

// Owns reports whether the actor is the user userID (directly or through a
// personal key).
func (a *Actor) Owns(userID *int64) bool {
	return userID != nil && a.UserID != 0 && *userID == a.UserID
}

// Domain is the casbin domain of an object that belongs to a department,
// or to the whole org when dept is nil.
func Domain(dept *int64) string {
	if dept != nil {
		return rbac.DeptDomain(*dept)
	}
	return rbac.DomainOrg
}
