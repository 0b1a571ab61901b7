package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Asker takes an exec that the agent's execution rules hold for a person
// (an ask rule, an ask default, or the dynamic setting). It answers what
// the exec answers instead of running now: a pending approval, or, when
// the caller waits, what the approved command's exec answered. The
// gateway has authorized the exec and checked nothing else ran.
type Asker interface {
	Ask(ctx context.Context, r AskRequest) (Output, error)
}

// AskRequest is an exec held for a person.
type AskRequest struct {
	Org     Org
	Actor   *authz.Actor
	Meta    Meta
	Target  sessions.Target
	Request ExecRequest
	// Decision is the rules' answer: what asked, and why.
	Decision policy.CommandDecision
	// PolicyVersion is the digest of the policy that decided.
	PolicyVersion string
}

// errAsked stops resolve when an exec goes to the Asker: nothing is made
// ready for a command that does not run now.
var errAsked = errors.New("gateway: exec held for approval")

// checkers holds the compiled execution policies, one per version (the
// policy's digest): the agent is read again per operation, and an edited
// policy has a new digest, so no entry is ever stale.
type checkers struct {
	m sync.Map // version → *policy.Checker
	n atomic.Int64
}

// maxCheckers bounds the cache; past it the cache starts over.
const maxCheckers = 10_000

func (cs *checkers) get(version string, p func() (policy.Exec, error)) (*policy.Checker, error) {
	if c, ok := cs.m.Load(version); ok {
		return c.(*policy.Checker), nil
	}
	pol, err := p()
	if err != nil {
		return nil, err
	}
	c, err := pol.Compile()
	if err != nil {
		return nil, err
	}
	if cs.n.Add(1) > maxCheckers {
		cs.m.Clear()
		cs.n.Store(1)
	}
	cs.m.Store(version, c)
	return c, nil
}

// execRules decides an exec by the agent's execution policy, before
// anything is made ready: each program the line runs (parsed as the
// shell would, through shells and wrappers) and the env values the
// request sets. A denial is audited as authz.deny naming the rule and the
// policy's version; a line that does not parse is refused with the
// parser's message (command_unparsable); an ask goes to g.Asker, or is
// refused (approval_required) while there is none. A person's terminal
// shell (interactive) is not decided here: what they type is not a
// request's command line. An API key's is: an agent runtime typing into a
// shell would otherwise run what the rules deny, so its shell is decided
// as a program known only when it runs (the dynamic setting; with no rule
// that could refuse anything, allowed).
func (g *Gateway) execRules(a *authz.Actor, t sessions.Target, req ExecRequest) (policy.CommandDecision, error) {
	shell := req.interactive && a.Kind == audit.ActorAPIKey
	if req.interactive && !shell {
		return policy.CommandDecision{}, nil
	}
	version := t.Agent.ExecVersion()
	c, err := g.rules.get(version, t.Agent.Exec)
	if err != nil {
		return policy.CommandDecision{}, err
	}
	var d policy.CommandDecision
	if shell {
		d = c.DecideInteractive()
	} else if d, err = c.DecideCommand(req.Command, req.Env); err != nil {
		return d, err
	}
	denial := authz.Denial{Target: audit.Target{Type: "command", Name: clip.String(req.Command, 200)}, Domain: authz.Domain(t.Session.AgentDepartmentID),
		Object: terminalObject(t.Session.ID), Action: ActExec,
		Rule: "execution policy of agent " + t.Agent.Name + " (version " + clip.String(version, 12) + "): " + d.Explain()}
	if shell && d.Action != policy.Allow {
		denial.Rule = "execution policy of agent " + t.Agent.Name + " (version " + clip.String(version, 12) + "): " + shellWhy(d.Action)
		if d.Action == policy.Ask {
			denial.Answer = CodeApprovalRequired
			return d, a.Refuse(denial, apperr.New(apperr.ErrForbidden, CodeApprovalRequired, "%s", shellWhy(d.Action)))
		}
		return d, a.Deny(denial, shellWhy(d.Action))
	}
	switch d.Action {
	case policy.Deny:
		return d, a.Deny(denial, "The agent's execution policy denies this command, which was not run: "+d.Explain())
	case policy.Ask:
		if req.approved != nil {
			return d, nil // a person approved exactly this exec
		}
		if g.Asker != nil {
			return d, errAsked
		}
		denial.Answer = CodeApprovalRequired
		return d, a.Refuse(denial, apperr.New(apperr.ErrForbidden, CodeApprovalRequired,
			"A person must approve this command before it runs, and approvals are not yet available on this path, so it was not run: %s", d.Explain()))
	}
	return d, nil
}

const (
	// CodeApprovalRequired answers an exec the rules hold for a person
	// when nothing can take the approval (and an API key's interactive
	// shell the dynamic setting asks about: nobody can approve what will
	// be typed).
	CodeApprovalRequired = "approval_required"
)

// shellWhy says why an API key may not have an interactive shell.
func shellWhy(dynamic policy.Action) string {
	return "An API key's interactive shell runs whatever is typed into it, which the agent's execution rules cannot check before it runs; " +
		"the agent has rules that refuse or ask about some programs, and its setting for what is known only when it runs is " + string(dynamic) +
		", so no shell was opened. Run commands through exec, where each line is checked."
}

// execPolicyDetails is what a command.exec audit event says of the rules
// that let it run: the policy's version and what decided (for a person's
// terminal shell, which the rules do not decide, that it was not checked).
func execPolicyDetails(t sessions.Target, req ExecRequest, d policy.CommandDecision) map[string]any {
	if req.interactive && d.Line == "" {
		return map[string]any{"checked": false, "why": "the browser terminal's shell: what is typed into it is not a request's command line"}
	}
	return map[string]any{"version": t.Agent.ExecVersion(), "action": d.Action, "why": d.Why}
}
