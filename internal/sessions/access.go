package sessions

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/rbac"
)

// Every exported method below that takes an actor checks it before it
// returns or changes anything. Who may do what:
//   - see a session: its own user (or the key that started it); owners of
//     the agent's department; org admins; auditors (read only).
//   - use it (start, pause, resume, close, run commands through the
//     gateway): its own user while they may still use the agent; owners of
//     the agent's department; org admins.
//   - create one: whoever may see the agent and "use" it (members of its
//     department; for an org-wide agent, anyone holding "use" on agents
//     somewhere).

func sessionObject(id int64) string { return "sessions/" + strconv.FormatInt(id, 10) }

func agentObject(id int64) string { return "agents/" + strconv.FormatInt(id, 10) }

// Owns reports whether a owns sess: it is the session's user (directly or
// through one of their personal keys), or the principal that started it
// (for a service key, which has no user, the same key). The owner may see
// and use its session, and run every terminal operation in it, unless a
// policy denies it: session access and terminal access follow this one
// rule.
func Owns(a *authz.Actor, sess Session) bool {
	return a.Owns(sess.UserID) || (sess.Subject != "" && a.Subject == sess.Subject)
}

// decideSession asks the policy about act on sess in its agent's domain,
// then in the org (where auditors and org admins hold their roles).
func decideSession(ctx context.Context, a *authz.Actor, sess Session, act string) (bool, string, error) {
	dom := authz.Domain(sess.AgentDepartmentID)
	d, err := a.Decide(ctx, dom, sessionObject(sess.ID), act)
	if err != nil || d.Allowed || dom == rbac.DomainOrg {
		return d.Allowed, authz.RuleText(d), err
	}
	d, err = a.Decide(ctx, rbac.DomainOrg, sessionObject(sess.ID), act)
	return d.Allowed, authz.RuleText(d), err
}

// mayUseAgent asks whether a may start and drive sessions of an agent in
// department dept (nil: org-wide, usable by whoever holds "use" on agents
// anywhere).
func mayUseAgent(ctx context.Context, a *authz.Actor, agentID int64, dept *int64) (bool, string, error) {
	if dept == nil {
		d, err := a.DecideAnywhere(ctx, agentObject(agentID), "use")
		return d.Allowed, authz.RuleText(d), err
	}
	d, err := a.Decide(ctx, authz.Domain(dept), agentObject(agentID), "use")
	return d.Allowed, authz.RuleText(d), err
}

func canSee(ctx context.Context, a *authz.Actor, sess Session) (bool, string, error) {
	if Owns(a, sess) {
		return true, "", nil
	}
	ok, rule, err := decideSession(ctx, a, sess, "read")
	if err == nil && !ok {
		rule = "another user's session (" + rule + ")"
	}
	return ok, rule, err
}

func canUse(ctx context.Context, a *authz.Actor, sess Session) (bool, string, error) {
	if Owns(a, sess) {
		ok, rule, err := mayUseAgent(ctx, a, sess.AgentID, sess.AgentDepartmentID)
		if err != nil || ok {
			return ok, rule, err
		}
		// No longer allowed to use the agent: only a department owner's
		// or an admin's authority remains.
	}
	return decideSession(ctx, a, sess, "update")
}

// authorize checks a on a session already in hand: hidden when a may not
// see it, forbidden when use is set and a may not use it.
func (s *Service) authorize(ctx context.Context, a *authz.Actor, sess Session, use bool) error {
	ok, rule, err := canSee(ctx, a, sess)
	if err != nil {
		return err
	}
	refused := authz.Denial{Target: AuditTarget(sess), Domain: authz.Domain(sess.AgentDepartmentID), Object: sessionObject(sess.ID),
		Action: "read", Rule: rule, Hidden: true}
	if !ok {
		return a.Deny(refused, "")
	}
	if !use {
		return nil
	}
	if ok, rule, err = canUse(ctx, a, sess); err != nil {
		return err
	} else if !ok {
		refused.Action, refused.Rule, refused.Hidden = "update", rule, false
		return a.Deny(refused, "You may see session "+strconv.FormatInt(sess.ID, 10)+" but not use it.")
	}
	return nil
}

// authorizeOutput checks a's reading of sess's output and recordings: by
// one's role, as whoever may see it (department owners, org admins,
// auditors), and by its owner only while they may still use its agent, as
// for use. An owner who lost the agent is refused (403), not hidden.
func (s *Service) authorizeOutput(ctx context.Context, a *authz.Actor, sess Session) error {
	if !Owns(a, sess) {
		return s.authorize(ctx, a, sess, false)
	}
	ok, rule, err := mayUseAgent(ctx, a, sess.AgentID, sess.AgentDepartmentID)
	if err != nil || ok {
		return err
	}
	byRole, _, err := decideSession(ctx, a, sess, "read")
	if err != nil || byRole {
		return err
	}
	return a.Deny(authz.Denial{Target: AuditTarget(sess), Domain: authz.Domain(sess.AgentDepartmentID), Object: sessionObject(sess.ID),
		Action: "read", Rule: "owner of the session, no longer allowed to use its agent (" + rule + ")"},
		"You may no longer read session "+strconv.FormatInt(sess.ID, 10)+"'s output: you may not use its agent any more.")
}

// visible loads id for a: hidden when a may not see it, forbidden when use
// is set and a may not use it.
func (s *Service) visible(ctx context.Context, a *authz.Actor, id int64, use bool) (Session, error) {
	sess, err := s.load(ctx, id)
	if err != nil {
		return sess, err
	}
	if err := s.authorize(ctx, a, sess, use); err != nil {
		return Session{}, err
	}
	return sess, nil
}

// Get returns a session a may see.
func (s *Service) Get(ctx context.Context, a *authz.Actor, id int64) (Session, error) {
	return s.visible(ctx, a, id, false)
}

// CanUse reports whether a may use sess (for what a page offers).
func (s *Service) CanUse(ctx context.Context, a *authz.Actor, sess Session) (bool, error) {
	ok, _, err := canUse(ctx, a, sess)
	return ok, err
}

// CanCreate reports whether a may start sessions of ag (for what a page
// offers).
func (s *Service) CanCreate(ctx context.Context, a *authz.Actor, ag agents.Agent) (bool, error) {
	ok, _, err := mayUseAgent(ctx, a, ag.ID, ag.DepartmentID)
	return ok, err
}

// Create starts a pending session of an agent a may see and use; the
// sandbox (or host workspace) comes on first use.
func (s *Service) Create(ctx context.Context, a *authz.Actor, in CreateInput) (Session, error) {
	ag, err := s.Agents.Get(ctx, a, in.AgentID)
	if err != nil {
		return Session{}, err
	}
	ok, rule, err := mayUseAgent(ctx, a, ag.ID, ag.DepartmentID)
	if err != nil {
		return Session{}, err
	}
	if !ok {
		return Session{}, a.Deny(authz.Denial{Target: agents.Target(ag), Domain: authz.Domain(ag.DepartmentID), Object: agentObject(ag.ID),
			Action: "use", Rule: rule}, "You may see agent \""+ag.Name+"\" but not start sessions with it.")
	}
	return s.create(ctx, a, ag, in)
}

// List returns a page of the sessions a may see, newest first.
func (s *Service) List(ctx context.Context, a *authz.Actor, f ListFilter) (Page, error) {
	q := s.sessionQuery(ctx)
	all, err := a.Allowed(ctx, rbac.DomainOrg, "sessions", "read")
	if err != nil {
		return Page{}, err
	}
	if !all {
		agentIDs, err := s.agentsWithSessionsReadable(ctx, a)
		if err != nil {
			return Page{}, err
		}
		cond := s.DB.Where("sessions.subject = ?", a.Subject)
		if a.UserID != 0 {
			cond = cond.Or("sessions.user_id = ?", a.UserID)
		}
		if len(agentIDs) > 0 {
			cond = cond.Or("sessions.agent_id IN ?", agentIDs)
		}
		q = q.Where(cond)
	}
	if f.AgentID != 0 {
		q = q.Where("sessions.agent_id = ?", f.AgentID)
	}
	if f.IDs != nil {
		if len(f.IDs) == 0 {
			return Page{}, nil
		}
		q = q.Where("sessions.id IN ?", f.IDs)
	}
	if f.UserID != 0 {
		q = q.Where("sessions.user_id = ?", f.UserID)
	}
	if f.State != "" {
		if !slices.Contains(States, f.State) {
			v := apperr.Validation()
			v.Add("state", "State must be one of %s.", strings.Join(States, ", "))
			return Page{}, v
		}
		q = q.Where("sessions.state = ?", f.State)
	}
	if !f.CreatedAfter.IsZero() {
		q = q.Where("sessions.created_at >= ?", f.CreatedAfter.UTC())
	}
	if !f.CreatedBefore.IsZero() {
		q = q.Where("sessions.created_at < ?", f.CreatedBefore.UTC())
	}
	if f.Before > 0 {
		q = q.Where("sessions.id < ?", f.Before)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, 200)
	var out []Session
	if err := q.Order("sessions.id DESC").Limit(limit + 1).Find(&out).Error; err != nil {
		return Page{}, err
	}
	p := Page{Items: out}
	if len(out) > limit {
		p.Items = out[:limit]
		p.Next = out[limit-1].ID
	}
	return p, nil
}

// agentsWithSessionsReadable lists the agents in whose department a may
// read every session (department owners).
func (s *Service) agentsWithSessionsReadable(ctx context.Context, a *authz.Actor) ([]int64, error) {
	var rows []struct {
		ID           int64
		DepartmentID *int64
	}
	if err := s.DB.WithContext(ctx).Table("agents").Select("id, department_id").Where("department_id IS NOT NULL").Find(&rows).Error; err != nil {
		return nil, err
	}
	byDept := map[int64]bool{}
	var ids []int64
	for _, r := range rows {
		ok, seen := byDept[*r.DepartmentID]
		if !seen {
			var err error
			if ok, err = a.Allowed(ctx, rbac.DeptDomain(*r.DepartmentID), "sessions", "read"); err != nil {
				return nil, err
			}
			byDept[*r.DepartmentID] = ok
		}
		if ok {
			ids = append(ids, r.ID)
		}
	}
	return ids, nil
}
