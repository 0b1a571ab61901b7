package gateway

import (
	"context"
	"time"

	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Stdin writes to a running command. The bytes are recorded (or, by the
// org's choice, only their size) with their typist before agentd receives
// them; an API client's first keystroke into a command someone else
// opened is audited as command.attach first.
func (g *Gateway) Stdin(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64, data []byte, eof bool) error {
	var t sessions.Target
	var c recordings.Command
	var err error
	if len(data) == 0 && !eof {
		if t, c, err = g.running(ctx, org, a, sessionID, commandID, ActStdin); err != nil {
			return err
		}
	} else {
		if t, err = resolve(ctx, org, a, sessionID, ActStdin, nil); err != nil {
			return err
		}
		if err := g.typing(ctx, org, a, m, sessionID, commandID); err != nil {
			return err
		}
		// One commit, which also checks the command is this session's and
		// still running; closing stdin is recorded too.
		committing := time.Now()
		if c, err = g.appendInput(ctx, org, recordings.TypistOf(&a.Principal), sessionID, commandID, data, eof); err != nil {
			return durable(err)
		}
		g.recorded(RecordedStdin, committing)
	}
	fctx, cancel := context.WithTimeout(ctx, g.callTimeout())
	defer cancel()
	if err := g.client(t).WriteStdin(fctx, c.AgentdID, data, eof); err != nil {
		return g.commandUpstream(ctx, org, t, c, err)
	}
	g.reachable(ctx, org, t)
	return nil
}

// Watch opens command commandID of a session read-only, audited
// (command.watch): the read the watch page made, and the one Poll makes,
// so a command of a closed session is replayed from its recording.
func (g *Gateway) Watch(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64) error {
	t, _, err := resolveRecorded(ctx, org, a, sessionID)
	if err != nil {
		return err
	}
	c, err := recordings.GetInSession(ctx, org.DB, sessionID, commandID)
	if err != nil {
		return err
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "command.watch", c.Target(), map[string]any{"session_id": t.Session.ID})); err != nil {
		return durable(err)
	}
	return nil
}

// Continue checks that a may go on typing into command commandID of a
// session (a terminal reconnecting): authorized before anything, even
// whether the command exists, is said. A command that ended meanwhile is
// not refused: the terminal gets the output it missed and the end.
func (g *Gateway) Continue(ctx context.Context, org Org, a *authz.Actor, sessionID, commandID int64) error {
	_, _, err := g.sessionCommand(ctx, org, a, sessionID, commandID, ActStdin)
	return err
}
