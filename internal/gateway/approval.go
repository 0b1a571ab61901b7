package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/recordings"
)

// ApprovalQueue is what the gateway needs of an org's approval queue
// (*approvals.Service).
type ApprovalQueue interface {
	Request(ctx context.Context, b approvals.Binding) (approvals.Approval, error)
	Wait(ctx context.Context, id int64) (approvals.Approval, error)
	Get(ctx context.Context, a *authz.Actor, id int64) (approvals.Approval, error)
}

// ApprovalRef is a pending approval as an exec answers it (202).
type ApprovalRef struct {
	ID        int64     `json:"id"`
	State     string    `json:"state"`
	ExpiresAt time.Time `json:"expires_at"`
	Rule      string    `json:"rule"`
}

// Codes of an exec whose approval ended without running it, or whose
// approval_id cannot run.
const (
	CodeApprovalDenied    = "approval_denied"
	CodeApprovalExpired   = "approval_expired"
	CodeApprovalCancelled = "approval_cancelled"
	// CodeApprovalMismatch: the approval_id sent is another requester's,
	// or bound to another command line, cwd, env, TTY or stdin.
	CodeApprovalMismatch = "approval_mismatch"
)

// approvedRun marks an exec that runs because a person approved it: its
// commit claims the approval (approvals.CommandClaim), and its
// command.exec event names the approval and who approved it.
type approvedRun struct {
	approval approvals.Approval
}

// Approvals is the Asker over each org's approval queue. An exec the
// rules hold for a person becomes a request bound to the digest of
// exactly what would run; the exec answers it pending (202), or, when the
// caller waits (wait_ms) and a decision comes in time, runs it (approved)
// or refuses it (denied, expired, cancelled). A request a session grant
// covers runs at once. A caller re-sends the same exec with approval_id
// to run an approval decided after its exec answered: once.
type Approvals struct {
	Gateway *Gateway
	// Queue is org's approval queue; nil refuses as approval_required.
	Queue func(org Org) ApprovalQueue
}

// Ask implements Asker.
func (p *Approvals) Ask(ctx context.Context, r AskRequest) (Output, error) {
	var q ApprovalQueue
	if p.Queue != nil {
		q = p.Queue(r.Org)
	}
	if q == nil {
		return Output{}, apperr.New(apperr.ErrForbidden, CodeApprovalRequired,
			"A person must approve this command before it runs, and approvals are not available on this path, so it was not run: %s", r.Decision.Explain())
	}
	b, err := p.binding(r)
	if err != nil {
		return Output{}, err
	}
	var ap approvals.Approval
	if r.Request.ApprovalID != 0 {
		ap, err = q.Get(ctx, r.Actor, r.Request.ApprovalID)
		if err != nil {
			return Output{}, err
		}
		if !ap.RequestedBy(r.Actor) || ap.SessionID != b.SessionID || ap.Digest != b.Digest() {
			return Output{}, apperr.New(apperr.ErrConflict, CodeApprovalMismatch,
				"Approval %d was not asked by you for exactly this command (session, command line, cwd, env, tty and stdin): send the exec it was asked for, or the exec without approval_id to ask again.", ap.ID)
		}
		if ap.State == approvals.Approved && ap.CommandID != nil {
			return Output{}, apperr.New(apperr.ErrConflict, approvals.CodeNotRunnable,
				"Approval %d already ran its command (command %d): an approval runs once. Send the exec without approval_id to ask again.", ap.ID, *ap.CommandID)
		}
	} else if ap, err = q.Request(ctx, b); err != nil {
		return Output{}, err
	}
	req := r.Request
	if ap.State == approvals.Pending && req.WaitMS > 0 {
		deadline := time.Now().Add(clampWait(req.WaitMS))
		wctx, cancel := context.WithDeadline(ctx, deadline)
		got, err := q.Wait(wctx, ap.ID)
		cancel()
		switch {
		case err == nil:
			ap = got
		case ctx.Err() != nil:
			return Output{}, err
		case !errors.Is(err, context.DeadlineExceeded):
			return Output{}, err
		}
		// What is left of the wait is the command's own.
		req.WaitMS = max(time.Until(deadline).Milliseconds(), 0)
	}
	switch ap.State {
	case approvals.Pending:
		return Output{SessionID: b.SessionID, State: string(approvals.Pending), Chunks: []agentd.Chunk{},
			Approval: &ApprovalRef{ID: ap.ID, State: string(ap.State), ExpiresAt: ap.ExpiresAt, Rule: ap.Rule}}, nil
	case approvals.Approved:
		req.approved = &approvedRun{approval: ap}
		return p.Gateway.Exec(ctx, r.Org, r.Actor, r.Meta, b.SessionID, req)
	case approvals.Denied:
		why := ""
		if ap.Reason != "" {
			why = " (" + ap.Reason + ")"
		}
		return Output{}, apperr.New(apperr.ErrForbidden, CodeApprovalDenied, "%s denied approval %d%s: the command was not run.", ap.Decider.Name, ap.ID, why)
	case approvals.Expired:
		return Output{}, apperr.New(apperr.ErrForbidden, CodeApprovalExpired, "Approval %d expired at %s without a decision: the command was not run.", ap.ID, ap.ExpiresAt.Format(time.RFC3339))
	default:
		return Output{}, apperr.New(apperr.ErrForbidden, CodeApprovalCancelled, "Approval %d was cancelled: the command was not run.", ap.ID)
	}
}

// binding is exactly what r would run, and who asks.
func (p *Approvals) binding(r AskRequest) (approvals.Binding, error) {
	t, a := r.Target, r.Actor
	b := approvals.Binding{SessionID: t.Session.ID, AgentID: t.Session.AgentID, DepartmentID: t.Session.AgentDepartmentID,
		Requester: approvals.Requester{Type: a.Kind, ID: a.ID, Name: a.Name, Via: recordings.TypistOf(&a.Principal).Via, UserID: a.UserID,
			CreatorUserID: a.KeyCreatorID},
		Command: r.Request.Command, Cwd: inWorkspace(t, r.Request.Cwd), Env: r.Request.Env, TTY: r.Request.TTY, Stdin: r.Request.Stdin,
		Rule: r.Decision.Explain(), PolicyDigest: r.PolicyVersion}
	// A session grant is keyed by the program and arguments that asked:
	// only when exactly one command on the line asked, else by the whole
	// line (a grant for git push must not cover "git push; kubectl …").
	var asked []policy.Command
	for _, c := range r.Decision.Commands {
		if c.Action == policy.Ask {
			asked = append(asked, c)
		}
	}
	if len(asked) == 1 && len(r.Decision.Texts) == 0 && asked[0].Unknown == "" {
		b.Program, b.Args = asked[0].Program, asked[0].Args
	}
	pol, err := t.Agent.Exec()
	if err != nil {
		return b, err
	}
	if pol.ApprovalTimeoutSeconds > 0 {
		b.Timeout = time.Duration(pol.ApprovalTimeoutSeconds) * time.Second
	}
	return b, nil
}

// approvedChecks are the commit's checks of an exec: those of every exec,
// and for an approved one the claim of its approval.
func (g *Gateway) approvedChecks(chk recordings.StartChecks, req ExecRequest) recordings.StartChecks {
	if req.approved != nil {
		chk.Claim = approvals.CommandClaim(req.approved.approval.ID)
	}
	return chk
}

// approvedDetails adds to a command.exec event's details the approval it
// ran by and who approved it.
func approvedDetails(d map[string]any, req ExecRequest) map[string]any {
	if ap := req.approved; ap != nil {
		d["approval_id"] = ap.approval.ID
		d["approved_by"] = ap.approval.Decider
		if ap.approval.GrantedBy != nil {
			d["granted_by"] = *ap.approval.GrantedBy
		}
	}
	return d
}
