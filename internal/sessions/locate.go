package sessions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
)

// Locate says where a session runs whose output a may read, without
// changing it: no sandbox is created or resumed and no timeout refreshed.
// It is for reading (a command's output, its history, its recordings),
// which follows the rule of use for the session's owner (see
// authorizeOutput); a session not running answers a conflict naming its
// state.
func (s *Service) Locate(ctx context.Context, a *authz.Actor, sessionID int64) (Target, error) {
	if c, ok := s.fresh(ctx, s.key(sessionID), false); ok {
		if err := s.authorizeOutput(ctx, a, c.target.Session); err != nil {
			return Target{}, err
		}
		return c.target, nil
	}
	st := s.stampNow(ctx)
	sess, err := s.load(ctx, sessionID)
	if err != nil {
		return Target{}, err
	}
	if err := s.authorizeOutput(ctx, a, sess); err != nil {
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
	token, err := s.agentdToken(env, sess)
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
	if sess.State == StateRunning && st.ok {
		// Output polls and the recorder Locate on every call: keep what
		// was read for as long as Ensure would keep its own.
		s.rt().put(s.key(sessionID), &cached{target: t, checked: s.now(), located: true,
			refresh: s.rt().refreshEvery(ag.IdleTimeout()), version: st.version})
	}
	return t, nil
}

// LocateForClose authorizes a to close session id (closing is using it)
// and then says where its agentd is, as Locate does, changing nothing: the
// gateway ends the session's commands through it before the session
// closes. A refusal comes back with no session; a session already final,
// or one whose agentd cannot be located (its environment deleted, no
// sandbox yet), comes back with its Session and, for the latter, the
// error that says why.
func (s *Service) LocateForClose(ctx context.Context, a *authz.Actor, id int64) (Target, error) {
	sess, err := s.visible(ctx, a, id, true)
	if err != nil {
		return Target{}, err
	}
	if sess.Final() {
		return Target{Session: sess}, nil
	}
	// a was authorized above: where it runs is read as the system
	// rather than authorizing a a second time.
	t, err := s.Locate(ctx, systemReader(), id)
	if err != nil {
		return Target{Session: sess}, err
	}
	return t, nil
}

// IsUnstarted reports whether err is Locate's answer for a sandbox session
// that has no sandbox (yet, or again): nothing runs in it now, but what
// ran stays readable, as for a final one.
func IsUnstarted(err error) bool {
	var ae *apperr.Error
	return errors.As(err, &ae) && ae.Code == "session_"+StatePending
}

// IsFinal reports a session that will not come back: closed, lost, or its
// environment deleted (the session then has nowhere to run; following on
// would retry for ever).
func IsFinal(err error) bool {
	var ae *apperr.Error
	return errors.As(err, &ae) && (ae.Code == "session_"+StateClosed || ae.Code == "session_"+StateLost ||
		ae.Code == CodeEnvironmentGone)
}

// MarkClosing records that session id's close began, with its audit event
// ev, in one commit of db: from then on an exec in the session is refused
// (an exec's commit reads closing_at in its transaction: under the
// session row's share lock on Postgres, under the write lock on SQLite).
// A session already marked keeps its first mark; ev is written either way.
func MarkClosing(ctx context.Context, db *gorm.DB, log *audit.Log, id int64, ev audit.Event) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Table("sessions").Where("id = ? AND closing_at IS NULL", id).Update("closing_at", time.Now().UTC()).Error; err != nil {
			return fmt.Errorf("mark session %d closing: %w", id, err)
		}
		_, err := log.AppendTx(ctx, tx, ev)
		return err
	})
}
