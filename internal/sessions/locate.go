package sessions

import (
	"context"
	"errors"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
)

// Locate says where a session a may see runs, without changing it: no
// sandbox is created or resumed and no timeout refreshed. It is for reading
// (a command's output, its history); a session not running answers a
// conflict naming its state.
func (s *Service) Locate(ctx context.Context, a *authz.Actor, sessionID int64) (Target, error) {
	if c, ok := s.fresh(s.key(sessionID), false); ok {
		if err := s.authorize(ctx, a, c.target.Session, false); err != nil {
			return Target{}, err
		}
		return c.target, nil
	}
	sess, err := s.visible(ctx, a, sessionID, false)
	if err != nil {
		return Target{}, err
	}
	if sess.Final() {
		return Target{Session: sess}, finalError(sess)
	}
	env, ag, err := s.config(ctx, sess)
	var ae *apperr.Error
	if errors.As(err, &ae) && ae.Code == CodeEnvironmentGone {
		// Nothing runs here any more, but what ran stays readable: the
		// session is returned with the error, as for a final one.
		return Target{Session: sess}, err
	}
	if err != nil {
		return Target{}, err
	}
	token, err := s.Envs.AgentdToken(env)
	if err != nil {
		return Target{}, err
	}
	t := Target{Session: sess, Environment: env, Agent: ag, AgentdToken: token, Workspace: sess.Workspace, AgentdURL: env.URL}
	if sess.SandboxMode == agents.SandboxPerSession {
		if sess.SandboxID == "" {
			return t, apperr.New(apperr.ErrConflict, "session_"+sess.State, "Session %d has no sandbox yet: nothing ran in it.", sess.ID)
		}
		if t.AgentdURL, err = sandboxAgentdURL(env, sess); err != nil {
			return Target{}, err
		}
	}
	if sess.State == StateRunning {
		// Output polls and the recorder Locate on every call: keep what
		// was read for as long as Ensure would keep its own.
		s.rt().put(s.key(sessionID), &cached{target: t, checked: s.now(), located: true,
			refresh: s.rt().refreshEvery(ag.IdleTimeout())})
	}
	return t, nil
}
