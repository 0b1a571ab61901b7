package sessions

import (
	"context"
	"fmt"
	"strconv"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Limits caps the sessions held open (pending, running or paused) at once,
// so one looping agent runtime or script cannot take every sandbox and
// host workspace an org has. Zero leaves a cap off; the console sets both
// from its configuration (see internal/config for the defaults).
type Limits struct {
	// OpenPerUser caps the open sessions of one user, started directly or
	// through their personal keys; a service key, which has no user, is
	// capped on its own.
	OpenPerUser int
	// OpenPerAgent caps the open sessions of one agent, whoever started
	// them.
	OpenPerAgent int
}

// openSession is the SQL condition of a session that counts against the
// caps. It is written out, not bound, so that it matches the predicate of
// the partial indexes of migration 0014 and the count reads only them.
const openSession = "state NOT IN ('closed', 'lost')"

// ownerOf is the SQL condition, with its argument, that selects the
// sessions owned by the same user as a, or by the same service key, and
// the name of that owner's lock.
func ownerOf(a *authz.Actor) (string, any, string) {
	if a.UserID != 0 {
		return "user_id = ?", a.UserID, "user:" + strconv.FormatInt(a.UserID, 10)
	}
	return "user_id IS NULL AND subject = ?", a.Subject, "subject:" + a.Subject
}

// checkOpen refuses a new session of ag for a when a or ag already holds
// its cap of open sessions. It runs in the creating transaction, before
// the insert: on Postgres it first takes a transaction lock per user and
// per agent, so concurrent creates count one after the other (always the
// user's lock first, so two creates never wait on each other's); SQLite's
// transactions are serialized already.
func (s *Service) checkOpen(ctx context.Context, tx *gorm.DB, a *authz.Actor, ag agents.Agent) error {
	l := s.rt().Limits
	if l.OpenPerUser <= 0 && l.OpenPerAgent <= 0 {
		return nil
	}
	tx = tx.WithContext(ctx)
	cond, arg, lockName := ownerOf(a)
	if l.OpenPerUser > 0 {
		if err := store.XactLock(tx, "gatehouse-open-sessions:"+lockName); err != nil {
			return err
		}
	}
	if l.OpenPerAgent > 0 {
		if err := store.XactLock(tx, "gatehouse-open-sessions:agent:"+strconv.FormatInt(ag.ID, 10)); err != nil {
			return err
		}
	}
	refuse := func(rule string, err error) error {
		return a.Refuse(authz.Denial{Target: agents.Target(ag), Domain: authz.Domain(ag.DepartmentID), Object: "sessions", Action: "create",
			Rule: rule, Answer: "too_many_requests"}, err)
	}
	if l.OpenPerUser > 0 {
		var n int64
		if err := tx.Table("sessions").Where(openSession).Where(cond, arg).Count(&n).Error; err != nil {
			return fmt.Errorf("count open sessions: %w", err)
		}
		if n >= int64(l.OpenPerUser) {
			return refuse(fmt.Sprintf("cap of %d open sessions per user", l.OpenPerUser),
				apperr.New(apperr.ErrTooMany, "session_limit", "%s", CapMessage("You have", n, "open session", l.OpenPerUser, "per user", "close one first")))
		}
	}
	if l.OpenPerAgent > 0 {
		var n int64
		if err := tx.Table("sessions").Where(openSession).Where("agent_id = ?", ag.ID).Count(&n).Error; err != nil {
			return fmt.Errorf("count open sessions: %w", err)
		}
		if n >= int64(l.OpenPerAgent) {
			return refuse(fmt.Sprintf("cap of %d open sessions per agent", l.OpenPerAgent),
				apperr.New(apperr.ErrTooMany, "session_limit", "%s", CapMessage("Agent "+strconv.Quote(ag.Name)+" has", n, "open session",
					l.OpenPerAgent, "per agent", "one of them must be closed before another starts")))
		}
	}
	return nil
}

// OverCapMessage is CapMessage for a count known only to be above the cap
// (one that stopped counting there): "You have more running commands
// than the 20 allowed per user; wait for one to end, or kill one, first."
func OverCapMessage(who, what string, limit int, per, then string) string {
	return fmt.Sprintf("%s more %ss than the %d allowed %s; %s.", who, what, limit, per, then)
}

// CapMessage says who holds how many of what (a singular noun), and the
// cap it reached:
// "You have 20 open sessions, the most allowed per user; close one
// first." A count above the cap (the cap was lowered since) says both
// numbers. The terminal gateway's caps are said in the same words.
func CapMessage(who string, n int64, what string, limit int, per, then string) string {
	if n != 1 {
		what += "s"
	}
	if n == int64(limit) {
		return fmt.Sprintf("%s %d %s, the most allowed %s; %s.", who, n, what, per, then)
	}
	return fmt.Sprintf("%s %d %s, and at most %d are allowed %s; %s.", who, n, what, limit, per, then)
}
