package agents

import (
	"context"
	"strconv"
	"strings"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/envs"
)

// Every exported method below takes the acting principal and checks it
// first. An org-wide agent is everyone's to see; a department's agent its
// members'. Department owners configure their department's agents, org
// admins all of them.

func agentObject(id int64) string { return "agents/" + strconv.FormatInt(id, 10) }

// Target names an agent in the audit log.
func Target(a Agent) audit.Target {
	return audit.Target{Type: "agent", ID: strconv.FormatInt(a.ID, 10), Name: a.Name}
}

func canSee(ctx context.Context, actor *authz.Actor, a Agent) (bool, string, error) {
	if a.DepartmentID == nil {
		return true, "", nil
	}
	d, err := actor.Decide(ctx, authz.Domain(a.DepartmentID), agentObject(a.ID), "read")
	return d.Allowed, authz.RuleText(d), err
}

func (s *Service) visible(ctx context.Context, actor *authz.Actor, id int64, manage bool) (Agent, error) {
	a, err := s.load(ctx, id)
	if err != nil {
		return a, err
	}
	ok, rule, err := canSee(ctx, actor, a)
	if err != nil {
		return Agent{}, err
	}
	refused := authz.Denial{Target: Target(a), Domain: authz.Domain(a.DepartmentID), Object: agentObject(id), Action: "read", Rule: rule, Hidden: true}
	if !ok {
		return Agent{}, actor.Deny(refused, "")
	}
	if manage {
		refused.Action, refused.Hidden = "update", false
		if err := actor.Require(ctx, refused, "You may see agent \""+a.Name+"\" but not change it."); err != nil {
			return Agent{}, err
		}
	}
	return a, nil
}

// Get returns an agent actor may see.
func (s *Service) Get(ctx context.Context, actor *authz.Actor, id int64) (Agent, error) {
	return s.visible(ctx, actor, id, false)
}

// Template returns an agent actor may see with the template its sessions
// run (nil when it names none). Seeing an agent is enough to know what its
// sessions run, so the template is read whether or not actor may see the
// environment it belongs to; an agent actor may not see is hidden, and
// nothing of its template is read.
func (s *Service) Template(ctx context.Context, actor *authz.Actor, id int64) (Agent, *envs.Template, error) {
	a, err := s.visible(ctx, actor, id, false)
	if err != nil || a.TemplateID == nil {
		return a, nil, err
	}
	t, err := s.Envs.GetTemplate(ctx, authz.System("agents"), *a.TemplateID)
	if err != nil {
		return Agent{}, nil, err
	}
	return a, &t, nil
}

// Manageable returns an agent actor may see and change (to show a
// confirmation before a change, say).
func (s *Service) Manageable(ctx context.Context, actor *authz.Actor, id int64) (Agent, error) {
	return s.visible(ctx, actor, id, true)
}

// List returns the agents actor may see, ordered by name.
func (s *Service) List(ctx context.Context, actor *authz.Actor) ([]Agent, error) {
	all, err := s.listAll(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := []Agent{}
	for _, a := range all {
		ok, _, err := canSee(ctx, actor, a)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, a)
		}
	}
	return out, nil
}

// CanManage reports whether actor may change a (for what a page offers).
func (s *Service) CanManage(ctx context.Context, actor *authz.Actor, a Agent) (bool, error) {
	return actor.Allowed(ctx, authz.Domain(a.DepartmentID), agentObject(a.ID), "update")
}

// CanCreate reports whether actor may configure agents anywhere.
func (s *Service) CanCreate(ctx context.Context, actor *authz.Actor) (bool, error) {
	return actor.AllowedAnywhere(ctx, "agents", "create")
}

// allowedIn checks that actor may put an agent into dept (org-wide when nil
// or 0). Permission comes first, so a department one may not use and one
// that does not exist look the same.
func (s *Service) allowedIn(ctx context.Context, actor *authz.Actor, dept *int64, name string) error {
	if dept != nil && *dept == 0 {
		dept = nil
	}
	return actor.Require(ctx, authz.Denial{Target: audit.Target{Type: "agent", Name: name}, Domain: authz.Domain(dept), Object: "agents", Action: "create"},
		"You may not configure agents there: department owners manage their department's agents, org admins all.")
}

// Create validates and stores an agent where actor may configure agents,
// on environments actor may use.
func (s *Service) Create(ctx context.Context, actor *authz.Actor, in Input) (Agent, error) {
	if err := s.allowedIn(ctx, actor, in.DepartmentID, strings.TrimSpace(deref(in.Name))); err != nil {
		return Agent{}, err
	}
	return s.create(ctx, actor, in)
}

// Update changes an agent actor may manage; moving it to another
// department is creating it there.
func (s *Service) Update(ctx context.Context, actor *authz.Actor, id int64, in Input) (before, after Agent, err error) {
	before, err = s.visible(ctx, actor, id, true)
	if err != nil {
		return
	}
	if in.DepartmentID != nil {
		if err = s.allowedIn(ctx, actor, in.DepartmentID, before.Name); err != nil {
			return
		}
	}
	after, err = s.update(ctx, actor, before, in)
	return
}

// Delete removes an agent actor may manage.
func (s *Service) Delete(ctx context.Context, actor *authz.Actor, id int64) (Agent, error) {
	a, err := s.visible(ctx, actor, id, true)
	if err != nil {
		return a, err
	}
	return s.remove(ctx, a)
}
