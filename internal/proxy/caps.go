package proxy

import (
	"context"
	"fmt"
	"strconv"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
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

// checkRunning refuses an exec in session t when its owner or its agent
// already runs as many commands as allowed. It runs in the transaction
// that records the command, before the record: on Postgres under a
// transaction lock per owner and per agent (the owner's first, always),
// so a burst of execs counts one after the other; SQLite's transactions
// are serialized already. The count is one query over the running
// commands of open sessions (partial indexes of migration 0014).
func (g *Gateway) checkRunning(ctx context.Context, tx *gorm.DB, a *authz.Actor, t sessions.Target) error {
	l := g.Limits
	if l.RunningPerUser <= 0 && l.RunningPerAgent <= 0 {
		return nil
	}
	tx = tx.WithContext(ctx)
	s := t.Session
	owner, arg, lockName := "s.user_id IS NULL AND s.subject = ?", any(s.Subject), "subject:"+s.Subject
	if s.UserID != nil {
		owner, arg, lockName = "s.user_id = ?", any(*s.UserID), "user:"+strconv.FormatInt(*s.UserID, 10)
	}
	if l.RunningPerUser > 0 {
		if err := store.XactLock(tx, "gatehouse-running-commands:"+lockName); err != nil {
			return err
		}
	}
	if l.RunningPerAgent > 0 {
		if err := store.XactLock(tx, "gatehouse-running-commands:agent:"+strconv.FormatInt(s.AgentID, 10)); err != nil {
			return err
		}
	}
	var n struct{ Owner, Agent int64 }
	err := tx.Raw(`SELECT COUNT(CASE WHEN `+owner+` THEN 1 END) AS owner, COUNT(CASE WHEN s.agent_id = ? THEN 1 END) AS agent
		FROM commands c JOIN sessions s ON s.id = c.session_id
		WHERE c.state = 'running' AND s.state NOT IN ('closed', 'lost') AND (`+owner+` OR s.agent_id = ?)`,
		arg, s.AgentID, arg, s.AgentID).Scan(&n).Error
	if err != nil {
		return fmt.Errorf("count running commands: %w", err)
	}
	refuse := func(rule, message string) error {
		return a.Refuse(authz.Denial{Target: sessions.AuditTarget(s), Domain: authz.Domain(s.AgentDepartmentID), Object: terminalObject(s.ID),
			Action: ActExec, Rule: rule, Answer: "too_many_requests"}, apperr.New(apperr.ErrTooMany, "command_limit", "%s", message))
	}
	if l.RunningPerUser > 0 && n.Owner >= int64(l.RunningPerUser) {
		who := "You have"
		if !sessions.Owns(a, s) {
			who = "The owner of session " + strconv.FormatInt(s.ID, 10) + " has"
		}
		return refuse(fmt.Sprintf("cap of %d running commands per user", l.RunningPerUser),
			sessions.CapMessage(who, n.Owner, "running command", l.RunningPerUser, "per user", "wait for one to end, or kill one, first"))
	}
	if l.RunningPerAgent > 0 && n.Agent >= int64(l.RunningPerAgent) {
		return refuse(fmt.Sprintf("cap of %d running commands per agent", l.RunningPerAgent),
			sessions.CapMessage("Agent "+strconv.Quote(t.Agent.Name)+" has", n.Agent, "running command", l.RunningPerAgent, "per agent",
				"one of them must end before another starts"))
	}
	return nil
}
