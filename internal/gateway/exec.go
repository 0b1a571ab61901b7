package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/recorder"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// ExecRequest runs a command in a session; the fields mirror agentd's.
type ExecRequest struct {
	Command   string            `json:"command"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	TTY       bool              `json:"tty,omitempty"`
	Rows      uint16            `json:"rows,omitempty"`
	Cols      uint16            `json:"cols,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	WaitMS    int64             `json:"wait_ms,omitempty"`
	// ApprovalID runs an approved request for exactly this exec, once
	// (approval.go).
	ApprovalID int64 `json:"approval_id,omitempty"`
	// approved marks an exec a person approved (approval.go).
	approved *approvedRun
	// interactive marks the browser terminal's own shell (Interactive).
	interactive bool
}

// Interactive marks r as the shell the browser terminal starts, a command
// of the console's own: the agent's execution rules decide request
// command lines, and what is typed into that shell is not one (agentd's
// enforcement where programs start is what can catch it).
func (r ExecRequest) Interactive() ExecRequest {
	r.interactive = true
	return r
}

func newAgentdID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "gh-" + hex.EncodeToString(b[:])
}

// envKeys lists the names of the variables an exec sets, in order.
func envKeys(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k := range env {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// envHashes maps each variable an exec sets to the SHA-256 (hex) of its
// value: the audit log shows what ran without holding the values, which
// may be secrets, and a value known to an investigator can be matched.
func envHashes(env map[string]string) map[string]string {
	out := make(map[string]string, len(env))
	for k, v := range env {
		sum := sha256.Sum256([]byte(v))
		out[k] = hex.EncodeToString(sum[:])
	}
	return out
}

// Exec runs a command in session sessionID: authorized, recorded and
// audited in one commit before agentd hears of it, then followed until it
// ends.
func (g *Gateway) Exec(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, req ExecRequest) (Output, error) {
	if strings.TrimSpace(req.Command) == "" || len(req.Command) > maxCommandLen {
		return Output{}, &apperr.ValidationError{Fields: map[string]string{"command": "Give the command to run, at most 64 KiB."}}
	}
	if req.TimeoutMS < 0 || req.WaitMS < 0 {
		return Output{}, &apperr.ValidationError{Fields: map[string]string{"timeout_ms": "timeout_ms and wait_ms cannot be negative."}}
	}
	var (
		decision policy.CommandDecision
		asked    sessions.Target
	)
	t, err := resolve(ctx, org, a, sessionID, ActExec, func(t sessions.Target) error {
		var err error
		decision, err = g.execRules(a, t, req)
		asked = t
		return err
	})
	if errors.Is(err, errAsked) {
		return g.Asker.Ask(ctx, AskRequest{Org: org, Actor: a, Meta: m, Target: asked, Request: req, Decision: decision, PolicyVersion: asked.Agent.ExecVersion()})
	}
	if err != nil {
		return Output{}, err
	}
	now := g.now()
	lease := now.Add(g.Followers.LeaseFor())
	cmd := recordings.Command{SessionID: sessionID, AgentdID: newAgentdID(), Command: req.Command, Cwd: inWorkspace(t, req.Cwd), TTY: req.TTY,
		ActorType: a.Kind, ActorID: a.ID, ActorName: a.Name, ActorVia: recordings.TypistOf(&a.Principal).Via, StartedAt: now, LeaseOwner: g.Followers.Owner, LeaseUntil: &lease}
	if cmd.StdinContent, err = g.stdinContent(ctx, org); err != nil {
		return Output{}, durable(err)
	}
	// One commit: the command's record and its audit event, before agentd
	// hears of it (two round trips on Postgres).
	committing := time.Now()
	err = recordings.StartAudited(ctx, org.DB, org.Audit, g.approvedChecks(g.startChecks(a, t), req), &cmd, func(id int64) audit.Event {
		return event(a, m, "command.exec", cmd.Target(), approvedDetails(map[string]any{"session_id": sessionID,
			"command_id": id, "command": req.Command, "cwd": cmd.Cwd, "tty": req.TTY, "env_keys": envKeys(req.Env), "env_sha256": envHashes(req.Env), "timeout_ms": req.TimeoutMS,
			"exec_policy": execPolicyDetails(t, req, decision)}, req))
	})
	if err != nil {
		return Output{}, durable(err)
	}
	g.recorded(RecordedExec, committing)
	wait := clampWait(req.WaitMS)
	fctx, cancel := context.WithTimeout(ctx, wait+g.callTimeout())
	defer cancel()
	create := agentd.CreateSessionRequest{ID: cmd.AgentdID, Command: req.Command, Cwd: cmd.Cwd, Env: req.Env,
		TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, Stdin: req.Stdin, TimeoutMS: req.TimeoutMS,
		// What ran in it, from the kernel, for the recording and (on a
		// TTY) the audit log; an agentd without it ignores the ask.
		ExecRecords: true,
		// agentd holds output back until the recorder has read it, so the
		// recording is complete however fast the command writes.
		Overflow: agentd.OverflowBlock}
	// Until agentd answers, the follower may send the create again (a
	// follower that meets "unknown" before the create arrived).
	g.Followers.CreatePending(org.rec(), cmd.ID, create)
	create.WaitMS = wait.Milliseconds()
	resp, err := g.client(t).CreateSession(fctx, create)
	outcome, ae := recorder.SortCreate(err)
	switch outcome {
	case recorder.CreateArrived:
		// The follower sent the create again while this one was on its
		// way, and that one arrived first: the command runs, once.
		g.Followers.CreateDone(org.rec(), cmd.ID)
		g.remember(org, cmd)
		g.Followers.Follow(org.Slug, cmd.ID)
		return Output{CommandID: cmd.ID, SessionID: sessionID, TTY: req.TTY, State: agentd.StateRunning, Chunks: []agentd.Chunk{}}, nil
	case recorder.CreateRefused:
		// agentd refused the command: it never ran. Its record ends here.
		g.Followers.CreateDone(org.rec(), cmd.ID)
		g.reachable(ctx, org, t)
		g.Followers.FinishRefused(ctx, org.rec(), cmd, ae)
		if ae.Code == agentd.CodeKilledFirst {
			// The session's close killed it before its create arrived.
			return Output{}, errSessionClosing(sessionID)
		}
		return Output{}, fromAgentd(ae)
	}
	// From here the command may be running whatever agentd answered: the
	// follower finds out and records it, starting from agentd's answer.
	// Its input chain is empty: its first keystroke is one statement.
	g.remember(org, cmd)
	g.inputs.store(knownKey{db: org.DB, id: cmd.ID}, cmd)
	if outcome == recorder.CreateUnanswered {
		// No answer: the follower reads the command, and sends the create
		// again while agentd does not know it.
		g.Followers.Follow(org.Slug, cmd.ID)
		return Output{}, mayStillStart(g.upstream(ctx, org, t, err), cmd.ID)
	}
	g.Followers.CreateDone(org.rec(), cmd.ID)
	g.Followers.FollowNew(org.rec(), cmd, resp)
	g.reachable(ctx, org, t)
	return toOutput(cmd, resp), nil
}

// mayStillStart tells the caller of an exec that got no answer that the
// command is recorded and may still start (its follower sends the create
// again once the environment answers): running it again would run it
// twice.
func mayStillStart(err error, id int64) error {
	var ae *apperr.Error
	if !errors.As(err, &ae) || ae.Code != "environment_unreachable" {
		return err
	}
	return apperr.New(ae.Kind, ae.Code, "%s Command %d is recorded and may still start once the environment answers: "+
		"check its state (GET …/commands/%d/output) before running it again.", ae.Message, id, id)
}
