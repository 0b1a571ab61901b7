package gateway

import (
	"fmt"
	"strconv"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// CommandLimits caps the commands running at once, so one runaway agent
// runtime cannot fill its environments with processes. A command counts
// against the owner of its session (a user with their personal keys, or a
// service key) and against the session's agent, whoever started it. Zero
// leaves a cap off; the console sets both from its configuration (see
// internal/config for the defaults).
type CommandLimits struct {
	RunningPerUser  int
	RunningPerAgent int
}

// startChecks is what an exec's commit checks before recording its
// command in session t: that the session is not closing (a session whose
// close began starts nothing more: its close kills what runs, and a
// command started now would outlive it; the row is read under a shared
// lock on Postgres, so a close's mark waits for this commit and then lists
// its command, or this read waits for the mark and refuses), and that its owner and its agent
// run fewer commands than allowed. The caps are counted in the commit
// that records the command, so a burst of execs cannot overshoot them: on
// Postgres under a transaction lock per owner and per agent (the owner's
// first, always), so a burst counts one after the other; SQLite's
// transactions are serialized already. The count is one query that reads
// at most the caps' worth of running commands (see
// recordings.RunningCountSQL). A refusal writes nothing.
func (g *Gateway) startChecks(a *authz.Actor, t sessions.Target) recordings.StartChecks {
	l := g.Limits
	s := t.Session
	chk := recordings.StartChecks{SessionID: s.ID}
	capped := l.RunningPerUser > 0 || l.RunningPerAgent > 0
	if capped {
		owner, arg, lockName := "s.user_id IS NULL AND s.subject = ?", any(s.Subject), "subject:"+s.Subject
		if s.UserID != nil {
			owner, arg, lockName = "s.user_id = ?", any(*s.UserID), "user:"+strconv.FormatInt(*s.UserID, 10)
		}
		if l.RunningPerUser > 0 {
			chk.Locks = append(chk.Locks, "gatehouse-running-commands:"+lockName)
		}
		if l.RunningPerAgent > 0 {
			chk.Locks = append(chk.Locks, "gatehouse-running-commands:agent:"+strconv.FormatInt(s.AgentID, 10))
		}
		chk.CountSQL = recordings.RunningCountSQL(owner)
		chk.CountArgs = []any{arg, countTo(l.RunningPerUser), s.AgentID, countTo(l.RunningPerAgent)}
	}
	chk.Judge = func(st recordings.SessionState, counts [2]int64) error {
		if st.Closing || st.State == sessions.StateClosed || st.State == sessions.StateLost {
			return errSessionClosing(s.ID)
		}
		if !capped {
			return nil
		}
		return g.judgeRunning(a, t, counts[0], counts[1])
	}
	return chk
}

// countTo is how far the caps' count counts for cap: one past it, so a
// count above a cap (lowered since the commands started) is told from one
// at it; a cap that is off counts nothing.
func countTo(limit int) int {
	if limit <= 0 {
		return 0
	}
	return limit + 1
}

// capMessage words a refusal at or above limit: the count when it is the
// cap, "more than" when the count stopped past it.
func capMessage(who string, n int64, what string, limit int, per, then string) string {
	if n > int64(limit) {
		return sessions.OverCapMessage(who, what, limit, per, then)
	}
	return sessions.CapMessage(who, n, what, limit, per, then)
}

// judgeRunning refuses an exec in session t when its owner (running
// owned commands) or its agent (agent commands) is at its cap.
func (g *Gateway) judgeRunning(a *authz.Actor, t sessions.Target, owned, agent int64) error {
	l := g.Limits
	s := t.Session
	refuse := func(rule, message string) error {
		return a.Refuse(authz.Denial{Target: sessions.AuditTarget(s), Domain: authz.Domain(s.AgentDepartmentID), Object: terminalObject(s.ID),
			Action: ActExec, Rule: rule, Answer: "too_many_requests"}, apperr.New(apperr.ErrTooMany, "command_limit", "%s", message))
	}
	if l.RunningPerUser > 0 && owned >= int64(l.RunningPerUser) {
		who := "You have"
		if !sessions.Owns(a, s) {
			who = "The owner of session " + strconv.FormatInt(s.ID, 10) + " has"
		}
		return refuse(fmt.Sprintf("cap of %d running commands per user", l.RunningPerUser),
			capMessage(who, owned, "running command", l.RunningPerUser, "per user", "wait for one to end, or kill one, first"))
	}
	if l.RunningPerAgent > 0 && agent >= int64(l.RunningPerAgent) {
		return refuse(fmt.Sprintf("cap of %d running commands per agent", l.RunningPerAgent),
			capMessage("Agent "+strconv.Quote(t.Agent.Name)+" has", agent, "running command", l.RunningPerAgent, "per agent",
				"one of them must end before another starts"))
	}
	return nil
}

// errSessionClosing refuses a command in a session whose close began (or
// that ended).
func errSessionClosing(id int64) error {
	return apperr.New(apperr.ErrConflict, "session_closing", "Session %d is being closed (or ended): no command starts in it.", id)
}
