package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Closing a session ends what it started. The session is closed by the
// sessions service; before that, the gateway kills each of its running
// commands (API commands and browser shells alike) through agentd and lets
// their followers record them to the end, so no process outlives the
// session and no output goes unrecorded.

const (
	// closeBudget bounds what a session's close spends on its commands:
	// agentd's kill grace (3 s by default) and drain, recording the last
	// output and the end, and slack. An environment that does not answer
	// delays a close by at most this.
	closeBudget = 15 * time.Second
	// closeKillTimeout bounds one kill: agentd answers once the command
	// ended, after its kill grace at the latest.
	closeKillTimeout = 10 * time.Second
	// closeKillers bounds the kills a close sends at once.
	closeKillers = 8
	// closeKillAttempts and closeKillBackoff: a kill agentd refuses is
	// sent again, without grace, after 250 ms and after another 500 ms.
	closeKillAttempts = 3
	closeKillBackoff  = 250 * time.Millisecond
	// endedPollEvery is how often a close looks whether its commands'
	// ends are recorded.
	endedPollEvery = 100 * time.Millisecond
)

// The reasons a command ended by its session's close is recorded with (in
// its end event too).
const (
	reasonClosed            = recordings.ReasonSessionClosed
	reasonClosedUnreachable = recordings.ReasonSessionClosed + " while its environment was unreachable: what was recorded before is all there is"
	reasonClosedPaused      = recordings.ReasonSessionClosed + " while its sandbox was paused: what was recorded before the pause is all there is"
)

// EndCommands ends every running command of session sessionID as part of
// its close, and is called before the sessions service closes it. a must
// be allowed to close the session; no terminal policy is asked beyond
// that, since the close is the operation. Each command is killed through
// agentd with the environment's token (its whole process group, after
// agentd's kill grace) and followed until its end is recorded with all it
// printed; the close waits for that, within closeBudget, and then goes on
// whatever is left. The close is what the audit log records (the session's
// close event): no command.kill is written, and each command's end event
// gives the close as its reason. A command agentd cannot be asked about
// (the environment unreachable, the sandbox paused) is ended lost by its
// follower once the session closed, its reason saying why. EndCommands
// fails only when the close must not go on: a refused caller, or commands
// that cannot be read or marked. It returns the commands agentd would not
// end, for the close to report (a sandbox's kill ends them after all).
func (g *Gateway) EndCommands(ctx context.Context, org Org, a *authz.Actor, sessionID int64) ([]sessions.LeftRunning, error) {
	t, err := org.Sessions.LocateForClose(ctx, a, sessionID)
	if err != nil && t.Session.ID == 0 {
		return nil, err
	}
	if t.Session.Final() {
		return nil, nil
	}
	located := err
	// A caller that leaves does not stop a close half-way.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeBudget)
	defer cancel()
	// First, and durable: no command starts in the session from now on
	// (an exec's commit checks the mark), so the list below is complete.
	if err := markClosing(ctx, org, a, t.Session); err != nil {
		return nil, err
	}
	running, err := runningCommands(ctx, org, sessionID)
	if err != nil || len(running) == 0 {
		return nil, err
	}
	ids := make([]int64, len(running))
	for i, c := range running {
		ids[i] = c.ID
	}
	log := g.logger().With("org", org.Slug, "session", sessionID)
	reason := reasonClosed
	switch {
	case located != nil:
		log.Warn("gateway: closing a session whose agentd cannot be located; its commands end lost", "error", located)
		reason = reasonClosedUnreachable
	case t.Session.State == sessions.StatePaused:
		// Asking its agentd would mean resuming the sandbox only to kill
		// it; the close kills the sandbox with everything in it.
		reason = reasonClosedPaused
	}
	// Durable before anything is forwarded: whoever records the ends
	// (this replica's followers or another's) records this reason.
	if err := recordings.MarkEnding(ctx, org.DB, ids, reason); err != nil {
		return nil, err
	}
	if reason != reasonClosed {
		g.followAll(org, ids)
		if located == nil {
			return nil, nil // paused: the close kills the sandbox with them
		}
		// Nobody could ask agentd to end them: the close says so (a
		// sandbox's kill ends them after all, and CloseLeaving says that).
		left := make([]sessions.LeftRunning, len(running))
		for i, c := range running {
			left[i] = sessions.LeftRunning{CommandID: c.ID, Reason: "its environment could not be reached; it may still run: " + clip.String(located.Error(), 300)}
		}
		return left, nil
	}
	killed, notEnded := g.killAll(ctx, org, t, running)
	g.followAll(org, ids)
	if len(killed) == 0 {
		return notEnded, nil
	}
	if left := waitEnded(ctx, org, sessionID, killed); len(left) > 0 {
		log.Warn("gateway: closing a session before the ends of its killed commands were recorded", "commands", left)
	}
	return notEnded, nil
}

// markClosing records that the session's close began, with who closed it,
// in one commit: from then on an exec in it is refused (see startable).
func markClosing(ctx context.Context, org Org, a *authz.Actor, s sessions.Session) error {
	return durable(sessions.MarkClosing(ctx, org.DB, org.Audit, s.ID,
		event(a, Meta{}, "session.closing", sessions.AuditTarget(s), map[string]any{"session_id": s.ID})))
}

// runningCommands lists every running command of a session.
func runningCommands(ctx context.Context, org Org, sessionID int64) ([]recordings.Command, error) {
	var out []recordings.Command
	f := recordings.Filter{SessionID: sessionID, State: recordings.StateRunning, Limit: 200}
	for {
		page, err := recordings.List(ctx, org.DB, f)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < f.Limit {
			return out, nil
		}
		f.Before = page[len(page)-1].ID
	}
}

// killAll kills running, a few at a time, and returns the ids of the
// commands agentd ended (those the close waits for) and those it could
// not end.
func (g *Gateway) killAll(ctx context.Context, org Org, t sessions.Target, running []recordings.Command) ([]int64, []sessions.LeftRunning) {
	var left leftRunning
	ended := make([]bool, len(running))
	slots := make(chan struct{}, closeKillers)
	var wg sync.WaitGroup
	for i, c := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			ended[i] = g.killForClose(ctx, org, t, c, &left)
		}()
	}
	wg.Wait()
	var out []int64
	for i, c := range running {
		if ended[i] {
			out = append(out, c.ID)
		}
	}
	return out, left.list
}

// killForClose kills one command of a closing session and reports whether
// agentd ended it, so that its follower will record the end soon. A kill
// agentd refuses is sent again, escalated (every process killed at once,
// without grace), up to closeKillAttempts times; a command still not
// ended is reported in *left.
func (g *Gateway) killForClose(ctx context.Context, org Org, t sessions.Target, c recordings.Command, left *leftRunning) bool {
	var err error
	for attempt := range closeKillAttempts {
		if attempt > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(attempt) * closeKillBackoff):
			}
		}
		if err = g.killOnce(ctx, t, c, attempt > 0); err == nil {
			return true
		}
		var ae *agentd.Error
		if agentd.Unanswered(err) || (errors.As(err, &ae) && ae.Unknown()) || ctx.Err() != nil {
			break
		}
	}
	return g.killFailed(ctx, org, c, err, left)
}

// killOnce asks agentd to kill c, at once when now.
func (g *Gateway) killOnce(ctx context.Context, t sessions.Target, c recordings.Command, now bool) error {
	kctx, cancel := context.WithTimeout(ctx, min(g.callTimeout(), closeKillTimeout))
	defer cancel()
	var err error
	if now {
		_, err = g.client(t).KillNow(kctx, c.AgentdID)
	} else {
		_, err = g.client(t).Kill(kctx, c.AgentdID)
	}
	return err
}

// killFailed sorts out a kill that did not end c, reporting whether its
// end will be recorded soon anyway.
func (g *Gateway) killFailed(ctx context.Context, org Org, c recordings.Command, err error, left *leftRunning) bool {
	log := g.logger().With("org", org.Slug, "session", c.SessionID, "command", c.ID, "error", err)
	var ae *agentd.Error
	switch {
	case errors.As(err, &ae) && ae.Unknown() && !c.Acked:
		// Its create has not reached agentd, or never will: it must not
		// be sent again for a closing session. Its follower ends it lost
		// once the session closed.
		g.Followers.CreateDone(org.rec(), c.ID)
		return false
	case errors.As(err, &ae) && ae.Unknown():
		// agentd forgot it (its environment restarted): its follower
		// records it lost at its next read.
		return true
	case agentd.Unanswered(err):
		// agentd did not answer: what was recorded is all there is, and
		// its processes may run on. The close says so.
		log.Warn("gateway: a closing session's command could not be killed; it ends lost")
		if err := recordings.MarkEnding(ctx, org.DB, []int64{c.ID}, reasonClosedUnreachable); err != nil {
			log.Warn("gateway: could not record why a closing session's command ends", "mark_error", err)
		}
		left.add(sessions.LeftRunning{CommandID: c.ID, Reason: "agentd did not answer the kill; it may still run: " + clip.String(err.Error(), 300)})
		return false
	default:
		// A refusal, escalated in vain: agentd knows the command and has
		// not ended it. The close says so.
		log.Warn("gateway: agentd refused to kill a closing session's command, also without grace")
		left.add(sessions.LeftRunning{CommandID: c.ID, Reason: "agentd refused to kill it: " + clip.String(err.Error(), 300)})
		return false
	}
}

// leftRunning collects the commands a close could not end.
type leftRunning struct {
	mu   sync.Mutex
	list []sessions.LeftRunning
}

func (l *leftRunning) add(c sessions.LeftRunning) {
	l.mu.Lock()
	l.list = append(l.list, c)
	l.mu.Unlock()
}

// followAll makes sure each command has a follower to record its end.
func (g *Gateway) followAll(org Org, ids []int64) {
	for _, id := range ids {
		g.Followers.Follow(org.Slug, id)
	}
}

// waitEnded waits until the followers recorded the end of every command of
// ids, or ctx ends, and returns those still running.
func waitEnded(ctx context.Context, org Org, sessionID int64, ids []int64) []int64 {
	left := ids
	tick := time.NewTicker(endedPollEvery)
	defer tick.Stop()
	for {
		running, err := runningCommands(ctx, org, sessionID)
		if err == nil {
			still := map[int64]bool{}
			for _, c := range running {
				still[c.ID] = true
			}
			var next []int64
			for _, id := range left {
				if still[id] {
					next = append(next, id)
				}
			}
			if left = next; len(left) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return left
		case <-tick.C:
		}
	}
}
