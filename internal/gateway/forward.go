package gateway

import (
	"context"
	"errors"
	"net/http"
	"path"
	"strings"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// client is agentd of a session, with the environment's token injected:
// the caller never sees it.
func (g *Gateway) client(t sessions.Target) *agentd.Client {
	return agentd.NewClient(t.AgentdURL, t.AgentdToken, g.agentdHTTP(t.Environment))
}

// upstream turns a failed forward into what the caller is told, and tells
// the session whether agentd answered at all. Neither the environment's
// address nor its token is ever part of the answer.
func (g *Gateway) upstream(ctx context.Context, org Org, t sessions.Target, err error) error {
	var ae *agentd.Error
	if errors.As(err, &ae) {
		// A sandbox's agentd refusing the sandbox's own token restarted
		// with its template's (it holds a rekey in memory only): it is as
		// good as gone, so it counts toward the session's loss.
		lostKey := ae.Status == http.StatusUnauthorized && t.Session.AgentdTokenKind == sessions.TokenPerSandbox
		answer, unreachable := agentdAnswer(ae, lostKey)
		if unreachable {
			g.unreachable(ctx, org, t, err)
		} else {
			g.reachable(ctx, org, t)
		}
		return answer
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return ctx.Err()
	}
	g.unreachable(ctx, org, t, err)
	return apperr.New(apperr.ErrUpstream, "environment_unreachable", "The session's environment did not answer; try again shortly.")
}

// agentdAnswer is what the caller is told of agentd's error answer ae, and
// whether it counts as agentd not answering normally (lostKey: a sandbox's
// agentd refused the sandbox's own token). Its refusals of the request
// pass on with its code; its own failures are environment_unreachable,
// except a failed or slow download (fetch_failed, timeout) and an answer
// over the client's caps (answer_too_large: agentd misbehaving, not
// unreachable), which pass on like its refusals.
func agentdAnswer(ae *agentd.Error, lostKey bool) (answer error, unreachable bool) {
	if ae.Foreign || lostKey || ae.Status >= 500 && ae.Code != agentd.CodeFetchFailed && ae.Code != agentd.CodeTimeout && ae.Code != agentd.CodeAnswerTooLarge {
		return apperr.New(apperr.ErrUpstream, "environment_unreachable", "The session's environment is not answering normally (%s); try again shortly.", ae.Code), true
	}
	return fromAgentd(ae), false
}

// commandUpstream is upstream for an operation on a running command
// (stdin, resize, kill): agentd not knowing the command is not the
// caller's mistake to be passed on with agentd's own id for it. A command
// agentd acknowledged and then forgot ended with its environment's
// restart: its follower is woken to record it lost, and the caller hears
// 409 command_ended, as for any ended command. One agentd never
// acknowledged may still start (its follower sends the create again):
// the caller is told to try again.
func (g *Gateway) commandUpstream(ctx context.Context, org Org, t sessions.Target, c recordings.Command, err error) error {
	var ae *agentd.Error
	if !errors.As(err, &ae) || !ae.Unknown() {
		return g.upstream(ctx, org, t, err)
	}
	g.reachable(ctx, org, t)
	g.Followers.Follow(org.Slug, c.ID)
	if c.Acked {
		return apperr.New(apperr.ErrConflict, "command_ended", "Command %d has ended (lost): its environment no longer knows it.", c.ID)
	}
	return apperr.New(apperr.ErrUpstream, "environment_unreachable", "Command %d has not started in its environment yet; try again shortly.", c.ID)
}

// fromAgentd maps agentd's own refusals onto the console's error kinds,
// keeping its code and message (they describe the caller's request).
func fromAgentd(ae *agentd.Error) error {
	kind := apperr.ErrUpstream
	switch ae.Status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		kind = apperr.ErrInvalid
	case http.StatusForbidden:
		kind = apperr.ErrForbidden
	case http.StatusNotFound:
		kind = apperr.ErrNotFound
	case http.StatusConflict:
		kind = apperr.ErrConflict
	case http.StatusTooManyRequests:
		kind = apperr.ErrTooMany
	case http.StatusNotImplemented:
		kind = apperr.ErrInvalid
	}
	return apperr.New(kind, ae.Code, "%s", ae.Message)
}

func (g *Gateway) unreachable(ctx context.Context, org Org, t sessions.Target, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.callTimeout())
	defer cancel()
	if _, err := org.Sessions.ReportUnreachable(ctx, t.Session.ID, cause); err != nil {
		g.logger().Warn("gateway: could not count an agentd failure", "org", org.Slug, "session", t.Session.ID, "error", err)
	}
}

func (g *Gateway) reachable(ctx context.Context, org Org, t sessions.Target) {
	if err := org.Sessions.ReportReachable(ctx, t.Session.ID); err != nil {
		g.logger().Warn("gateway: could not clear agentd failures", "org", org.Slug, "session", t.Session.ID, "error", err)
	}
}

// inWorkspace resolves a path the caller gave against the session's
// workspace: relative paths are the session's own files.
func inWorkspace(t sessions.Target, p string) string {
	if p == "" {
		return t.Workspace
	}
	if t.Workspace == "" || path.IsAbs(p) || isWindowsAbs(p) {
		return p
	}
	if t.Environment.OS == "windows" {
		return strings.TrimRight(t.Workspace, `\`) + `\` + p
	}
	return path.Join(t.Workspace, p)
}

func isWindowsAbs(p string) bool {
	return len(p) >= 3 && p[1] == ':' && (p[2] == '\\' || p[2] == '/')
}
