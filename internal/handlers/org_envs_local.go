package handlers

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/views"
)

// LocalBackend is the console's own local sandbox backend
// (--local-sandboxes): what registering it as a sandbox environment takes.
// The environments page offers it in one action, so nobody copies these
// values out of the start-up log.
type LocalBackend struct {
	APIURL       string
	ProxyBaseURL string
	APIKey       string
	AgentdToken  string
	// Template is the backend template imported with it.
	Template string
}

// localEnvName is what the local backend is registered as.
const localEnvName = "local-sandboxes"

// localOffer is the environments page's offer of the local backend: nil
// without one, and the environment it is registered as once it is.
func (s *Server) localOffer(c echo.Context, all []envs.Environment, failure string) (*views.LocalOffer, error) {
	if s.Local == nil {
		return nil, nil
	}
	o := &views.LocalOffer{Slug: tenantOf(c).Org.Slug, Template: s.Local.Template, Error: failure}
	// Offered only where the viewer may add a shared environment, like
	// the add form's places: nothing the server would refuse.
	ctx, a := c.Request().Context(), actorOf(c)
	var err error
	if o.OrgWide, err = a.Allowed(ctx, rbac.DomainOrg, "environments", "create"); err != nil {
		return nil, err
	}
	for _, opt := range s.deptOptions(c) {
		id, err := parseID(opt.Value)
		if err != nil {
			continue
		}
		ok, err := a.Allowed(ctx, rbac.DeptDomain(id), "environments", "create")
		if err != nil {
			return nil, err
		}
		if ok {
			o.Departments = append(o.Departments, opt)
		}
	}
	if !o.OrgWide && len(o.Departments) == 0 && failure == "" {
		return nil, nil
	}
	for _, e := range all {
		if e.Kind == envs.KindSandbox && e.URL == s.Local.APIURL {
			o.RegisteredID, o.RegisteredName = e.ID, e.Name
			break
		}
	}
	return o, nil
}

// pageUseLocalSandboxes registers the local sandbox backend as a shared
// sandbox environment and imports its template, in one transaction with
// both audit records (environment.create, template.create): authorized
// exactly as creating that environment by hand is (envs.Create decides).
// The template is read from the backend first, so no database lock is
// held across a network call.
func (s *Server) pageUseLocalSandboxes(c echo.Context) error {
	l := s.Local
	ctx := c.Request().Context()
	name, scheme, dept := localEnvName, "http", formInt64(c, "department_id")
	req := envRequest{Name: &name, Kind: envs.KindSandbox, DepartmentID: &dept, URL: &l.APIURL, ProxyBaseURL: &l.ProxyBaseURL,
		SandboxScheme: &scheme, APIKey: &l.APIKey, AgentdToken: &l.AgentdToken}
	var tin envs.TemplateInput
	// Only someone who may add a shared environment somewhere makes the
	// console call the backend; anyone else goes straight to the refusal
	// (audited by envs.Create).
	may, err := s.envService(c).CanCreateShared(ctx, actorOf(c))
	if err != nil {
		return err
	}
	if may {
		if tin, err = s.envService(c).ImportInputFor(ctx, req.input(), l.Template); err != nil {
			return s.localFailed(c, err)
		}
	}
	var e envs.Environment
	err = s.mutate(c, func(m *orgTx) error {
		var err error
		if e, err = m.Envs().Create(ctx, m.Actor(), req.input()); err != nil {
			return err
		}
		if err := m.audit("environment.create", envTarget(e), map[string]any{"after": envAudit(e), "source": "local sandbox backend"}); err != nil {
			return err
		}
		t, err := m.Envs().AddTemplate(ctx, m.Actor(), e.ID, tin)
		if err != nil {
			return err
		}
		return m.audit("template.create", templateTarget(t), map[string]any{"after": toTemplateJSON(t), "source": "local sandbox backend"})
	})
	if err != nil {
		return s.localFailed(c, err)
	}
	// Checked at once, so its page opens on its health rather than on
	// "not yet" until the next round of the health checker.
	msg := "The local sandbox backend on this machine is registered as " + e.Name + ", with its template " + tin.Name + "."
	if _, h, err := s.envService(c).Test(ctx, actorOf(c), e.ID, tenantOf(c).Audit, 4*time.Second); err != nil {
		s.Logger.Warn("check the local sandbox backend after registering it", "org", tenantOf(c).Org.Slug, "error", err)
	} else if h.Status != envs.HealthHealthy {
		msg += " Its first check found it " + h.Status + ": " + h.Error
	}
	s.setFlash(c, msg+" Next, create an agent with sandbox mode per-session in it.")
	return c.Redirect(http.StatusSeeOther, envPagePath(c, e.ID))
}

// localFailed shows on the environments page, with its status, why the
// local backend was not registered (a refusal, a name taken, the backend
// not answering); anything else is the error page's.
func (s *Server) localFailed(c echo.Context, err error) error {
	fields, status, ok := formFailure(err)
	if !ok {
		var body errorDetail
		status, body = classify(err)
		if status != http.StatusServiceUnavailable && status != http.StatusBadGateway {
			return err
		}
		fields = map[string]string{"form": body.Message}
	}
	return s.renderEnvsWith(c, status, views.EnvForm{}, "The local sandbox backend was not registered: "+fieldMessages(fields))
}
