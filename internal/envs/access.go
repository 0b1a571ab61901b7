package envs

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// Every exported method below takes the acting principal and checks it
// before it returns or changes anything: objects the actor may not see
// are "not found", actions it may not take on objects it sees are
// "forbidden", and each refusal is recorded on the actor for the audit log.
//
// Who may do what:
//   - see: org admins all; a private environment its owner (and, when
//     shared, its department's members); a department's environment its
//     members; an org-wide shared one everybody.
//   - change, test, delete, manage templates: the owner of a private
//     environment (and org admins); department owners their department's;
//     org admins all.
//   - create: anyone a private host; department owners their department's;
//     org admins org-wide ones.

func envObject(id int64) string { return "environments/" + strconv.FormatInt(id, 10) }

// Target names an environment in the audit log.
func Target(e Environment) audit.Target {
	return audit.Target{Type: "environment", ID: strconv.FormatInt(e.ID, 10), Name: e.Name}
}

// canSee decides visibility and says which rule hid e.
func canSee(ctx context.Context, a *authz.Actor, e Environment) (bool, string, error) {
	d, err := a.Decide(ctx, rbac.DomainOrg, envObject(e.ID), "read")
	if err != nil || d.Allowed {
		return d.Allowed, "", err
	}
	if a.Owns(e.OwnerUserID) {
		return true, "", nil
	}
	if e.DepartmentID != nil {
		d, err := a.Decide(ctx, authz.Domain(e.DepartmentID), envObject(e.ID), "read")
		return d.Allowed, authz.RuleText(d), err
	}
	if e.OwnerUserID != nil {
		return false, "private to another user and not shared", nil
	}
	return true, "", nil
}

// canManage decides whether a may change e, and which rule refused it.
func canManage(ctx context.Context, a *authz.Actor, e Environment) (bool, string, error) {
	if a.Owns(e.OwnerUserID) {
		return true, "", nil
	}
	dom := authz.Domain(e.DepartmentID)
	if e.OwnerUserID != nil {
		// Another user's machine: only org-wide authority reaches it.
		dom = rbac.DomainOrg
	}
	d, err := a.Decide(ctx, dom, envObject(e.ID), "update")
	return d.Allowed, authz.RuleText(d), err
}

// visible loads id for a, hiding what a may not see and refusing what it
// may not change when manage is set.
func (s *Service) visible(ctx context.Context, a *authz.Actor, id int64, manage bool) (Environment, error) {
	e, err := s.load(ctx, id)
	if err != nil {
		return e, err
	}
	ok, rule, err := canSee(ctx, a, e)
	if err != nil {
		return Environment{}, err
	}
	if !ok {
		return Environment{}, a.Deny(authz.Denial{Target: Target(e), Domain: authz.Domain(e.DepartmentID), Object: envObject(id),
			Action: "read", Rule: rule, Hidden: true}, "")
	}
	if !manage {
		return e, nil
	}
	ok, rule, err = canManage(ctx, a, e)
	if err != nil {
		return Environment{}, err
	}
	if !ok {
		return Environment{}, a.Deny(authz.Denial{Target: Target(e), Domain: authz.Domain(e.DepartmentID), Object: envObject(id),
			Action: "update", Rule: rule}, "You may see environment \""+e.Name+"\" but not change it.")
	}
	return e, nil
}

// Get returns an environment a may see.
func (s *Service) Get(ctx context.Context, a *authz.Actor, id int64) (Environment, error) {
	return s.visible(ctx, a, id, false)
}

// Manageable returns an environment a may see and change (to show a
// confirmation before a change, say).
func (s *Service) Manageable(ctx context.Context, a *authz.Actor, id int64) (Environment, error) {
	return s.visible(ctx, a, id, true)
}

// List returns the environments a may see, ordered by name.
func (s *Service) List(ctx context.Context, a *authz.Actor) ([]Environment, error) {
	all, err := s.listAll(ctx)
	if err != nil {
		return nil, err
	}
	out := []Environment{}
	for _, e := range all {
		ok, _, err := canSee(ctx, a, e)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// CanManage reports whether a may change e (for what a page offers).
func (s *Service) CanManage(ctx context.Context, a *authz.Actor, e Environment) (bool, error) {
	ok, _, err := canManage(ctx, a, e)
	return ok, err
}

// CanCreateShared reports whether a may add shared environments anywhere.
func (s *Service) CanCreateShared(ctx context.Context, a *authz.Actor) (bool, error) {
	return a.AllowedAnywhere(ctx, "environments", "create")
}

// Usable reports whether a may attach e to an agent: e is visible to a,
// and a private environment only once shared with a department.
func (s *Service) Usable(ctx context.Context, a *authz.Actor, e Environment) (bool, error) {
	if e.Private() && e.DepartmentID == nil {
		return false, nil
	}
	ok, _, err := canSee(ctx, a, e)
	return ok, err
}

// Create stores a new environment for a: a private host of its own, or a
// shared one where a may add them.
func (s *Service) Create(ctx context.Context, a *authz.Actor, in Input) (Environment, error) {
	in.DepartmentID = orgWide(in.DepartmentID)
	name := strings.TrimSpace(deref(in.Name))
	refused := authz.Denial{Target: audit.Target{Type: "environment", Name: name}, Domain: authz.Domain(in.DepartmentID),
		Object: "environments", Action: "create"}
	var owner *int64
	if in.Private {
		if a.UserID == 0 {
			refused.Rule = "private environments belong to users"
			return Environment{}, a.Deny(refused, "Private environments belong to users; a service key cannot own one.")
		}
		if in.Kind != KindHost {
			return Environment{}, &apperr.ValidationError{Fields: map[string]string{"kind": "A private environment is a host you run agentd on, such as your workstation."}}
		}
		if in.DepartmentID != nil {
			ok, err := a.Allowed(ctx, rbac.DeptDomain(*in.DepartmentID), "departments/"+strconv.FormatInt(*in.DepartmentID, 10), "read")
			if err != nil {
				return Environment{}, err
			}
			if !ok {
				refused.Rule = "a private environment is shared only with a department its owner belongs to"
				_ = a.Deny(refused, "")
				return Environment{}, &apperr.ValidationError{Fields: map[string]string{"department_id": "You can share a private environment only with a department you belong to."}}
			}
		}
		if err := privateTargetOK(deref(in.URL)); err != nil {
			return Environment{}, err
		}
		uid := a.UserID
		owner = &uid
	} else if err := a.Require(ctx, refused,
		"You may not add shared environments there; register a private environment instead, or ask a department owner."); err != nil {
		return Environment{}, err
	}
	return s.create(ctx, in, owner, a.Name)
}

// Update changes an environment a may manage and returns before and after.
// Moving it to another department is creating it there.
func (s *Service) Update(ctx context.Context, a *authz.Actor, id int64, in Input) (before, after Environment, err error) {
	before, err = s.visible(ctx, a, id, true)
	if err != nil {
		return
	}
	if in.DepartmentID != nil && !sameDepartment(before.DepartmentID, orgWide(in.DepartmentID)) {
		target := orgWide(in.DepartmentID)
		var ok bool
		if before.Private() {
			ok = target == nil
			if !ok {
				ok, err = a.Allowed(ctx, authz.Domain(target), "departments/"+strconv.FormatInt(*target, 10), "read")
			}
		} else {
			ok, err = a.Allowed(ctx, authz.Domain(target), "environments", "create")
		}
		if err != nil {
			return
		}
		if !ok {
			_ = a.Deny(authz.Denial{Target: Target(before), Domain: authz.Domain(target), Object: "environments", Action: "create",
				Rule: "moving an environment is creating it in the new place"}, "")
			err = &apperr.ValidationError{Fields: map[string]string{"department_id": "You may not move the environment there."}}
			return
		}
	}
	if before.Private() && in.URL != nil {
		if err = privateTargetOK(*in.URL); err != nil {
			return
		}
	}
	in.Kind = before.Kind
	after, err = s.update(ctx, before, in)
	return
}

// Delete removes an environment a may manage, unless an agent uses it.
func (s *Service) Delete(ctx context.Context, a *authz.Actor, id int64) (Environment, error) {
	e, err := s.visible(ctx, a, id, true)
	if err != nil {
		return e, err
	}
	return s.remove(ctx, e)
}

// Test probes an environment a may manage now ("Test connection"),
// records the result (auditing a status change as the system) and returns
// the environment as stored afterwards. Failures at the console's own
// machine are detailed only to actors with org-wide authority (see
// Health.Shown).
func (s *Service) Test(ctx context.Context, a *authz.Actor, id int64, log *audit.Log, timeout time.Duration) (Environment, Health, error) {
	e, err := s.visible(ctx, a, id, true)
	if err != nil {
		return e, Health{}, err
	}
	h, err := s.CheckAndRecord(ctx, e, log, timeout)
	if err != nil {
		return e, h.Shown(), err
	}
	if e, err = s.load(ctx, id); err != nil {
		return e, h.Shown(), err
	}
	// The full message about the console's own machine is for those who
	// run the whole org; the stored one (Shown) is for everyone else.
	full, err := a.Allowed(ctx, rbac.DomainOrg, "environments", "create")
	if err != nil {
		return e, h.Shown(), err
	}
	if !full {
		return e, h.Shown(), nil
	}
	e.HealthError = h.Error
	return e, h, nil
}

// Templates lists the templates of an environment a may see.
func (s *Service) Templates(ctx context.Context, a *authz.Actor, envID int64) ([]Template, error) {
	if _, err := s.visible(ctx, a, envID, false); err != nil {
		return nil, err
	}
	return s.templatesOf(ctx, envID)
}

// GetTemplate returns a template of an environment a may see.
func (s *Service) GetTemplate(ctx context.Context, a *authz.Actor, id int64) (Template, error) {
	t, err := s.loadTemplate(ctx, id)
	if err != nil {
		return t, err
	}
	if _, err := s.visible(ctx, a, t.EnvironmentID, false); err != nil {
		return Template{}, err
	}
	return t, nil
}

// AddTemplate registers a template for a sandbox environment a manages.
func (s *Service) AddTemplate(ctx context.Context, a *authz.Actor, envID int64, in TemplateInput) (Template, error) {
	e, err := s.visible(ctx, a, envID, true)
	if err != nil {
		return Template{}, err
	}
	return s.addTemplate(ctx, e, in)
}

// ImportInput reads a template's resources from the backend of an
// environment a manages, ready for AddTemplate. Callers make this network
// call before opening a transaction.
func (s *Service) ImportInput(ctx context.Context, a *authz.Actor, envID int64, backendID string) (TemplateInput, error) {
	e, err := s.visible(ctx, a, envID, true)
	if err != nil {
		return TemplateInput{}, err
	}
	return s.importInput(ctx, e, backendID)
}

// ImportTemplate registers a template of an environment a manages with the
// resources the backend reports for it.
func (s *Service) ImportTemplate(ctx context.Context, a *authz.Actor, envID int64, backendID string) (Template, error) {
	in, err := s.ImportInput(ctx, a, envID, backendID)
	if err != nil {
		return Template{}, err
	}
	return s.AddTemplate(ctx, a, envID, in)
}

// BackendTemplates lists what the backend of an environment a manages
// offers, for the import chooser.
func (s *Service) BackendTemplates(ctx context.Context, a *authz.Actor, envID int64) ([]sandbox.Template, error) {
	e, err := s.visible(ctx, a, envID, true)
	if err != nil {
		return nil, err
	}
	if e.Kind != KindSandbox {
		return nil, apperr.New(apperr.ErrInvalid, "not_a_sandbox_environment", "Environment %q is a host; only sandbox environments have backend templates.", e.Name)
	}
	b, err := s.Backend(e)
	if err != nil {
		return nil, err
	}
	ts, err := b.ListTemplates(ctx)
	if err != nil {
		return nil, backendError("list the backend's templates", err)
	}
	return ts, nil
}

// DeleteTemplate removes template tid of an environment a manages, unless
// an agent uses it. A template of another environment is not found.
func (s *Service) DeleteTemplate(ctx context.Context, a *authz.Actor, envID, tid int64) (Template, error) {
	if _, err := s.visible(ctx, a, envID, true); err != nil {
		return Template{}, err
	}
	t, err := s.loadTemplate(ctx, tid)
	if err != nil {
		return t, err
	}
	if t.EnvironmentID != envID {
		return Template{}, authz.NotFound()
	}
	return s.removeTemplate(ctx, t)
}

// privateTargetOK keeps private environments, which anyone may register,
// off the console's own machine (loopback and the addresses of its network
// interfaces, its LAN address say) and link-local and metadata services.
// This is the early, friendly check on the literal address; the rule is
// enforced on every address actually dialled (clientFor), so a name that
// resolves there is refused too. Shared environments are set up by
// department owners and admins and may point at the console's machine (a
// dev agentd on loopback included), never at link-local or metadata
// addresses (apply).
func privateTargetOK(raw string) error {
	host := urlHost(raw)
	reason := ""
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		reason = "a name of this machine"
	} else if ip, err := netip.ParseAddr(host); err == nil {
		reason = netguard.Blocked(ip)
	}
	if reason != "" {
		return &apperr.ValidationError{Fields: map[string]string{"url": fmt.Sprintf(
			"A private environment cannot point at the console's own machine (loopback or any address of its network interfaces), a link-local or a metadata address, and %s is %s; use the network address of the machine agentd runs on.", host, reason)}}
	}
	return nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
