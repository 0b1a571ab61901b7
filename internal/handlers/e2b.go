package handlers

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// E2BEndpoint is the E2B-compatible API's configuration.
type E2BEndpoint struct {
	// Service resolves data-plane sandbox ids (the data plane's; the
	// control plane reads the org's rows itself).
	Service *e2b.Service
	// Domain is the data plane's wildcard domain ("" when none).
	Domain string
	// PublicURL is the data plane as one host (E2B_SANDBOX_URL); "" means
	// the console's BaseURL.
	PublicURL string
}

const ctxE2BKey = "gh.e2bkey"

// registerE2B is the E2B-compatible control plane of each org, at
// /e2b/orgs/:org (the SDK's E2B_API_URL). Every route takes an e2b key
// (X-API-Key) of the org; which sandboxes it reaches is decided by the
// sessions service (the key's owner's rights) and the key's agent.
func (s *Server) registerE2B() {
	g := s.group("/e2b/orgs/:org", e2bSurface)
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		g.handle(http.MethodPost, p, rbac.Authenticated(), s.e2bCreate)
		g.handle(http.MethodGet, p, rbac.Authenticated(), s.e2bList)
		g.handle(http.MethodPost, p+"/:sandboxID/connect", rbac.Authenticated(), s.e2bConnect)
	}
	g.handle(http.MethodPost, "/sandboxes/:sandboxID/resume", rbac.Authenticated(), s.e2bConnect)
	g.handle(http.MethodGet, "/sandboxes/:sandboxID", rbac.Authenticated(), s.e2bGet)
	g.handle(http.MethodDelete, "/sandboxes/:sandboxID", rbac.Authenticated(), s.e2bKill)
	g.handle(http.MethodPost, "/sandboxes/:sandboxID/timeout", rbac.Authenticated(), s.e2bTimeout)
	g.handle(http.MethodPost, "/sandboxes/:sandboxID/pause", rbac.Authenticated(), s.e2bPause)
	g.handle(http.MethodGet, "/templates", rbac.Authenticated(), s.e2bTemplates)
}

// authorizeE2B opens the org in the path and authenticates an e2b key
// (X-API-Key, or a bearer token) of it: the key acts as its owner,
// restricted to its agent. Ordinary gh_ keys and sign-ins are refused here,
// and e2b keys are refused everywhere else.
func (s *Server) authorizeE2B(c echo.Context, next echo.HandlerFunc) error {
	t, err := s.Tenants.Open(c.Request().Context(), c.Param("org"))
	if err != nil {
		return err
	}
	defer t.Release()
	c.Set(ctxTenant, t)
	tok := c.Request().Header.Get("X-API-Key")
	if tok == "" {
		tok, _ = bearer(c.Request())
	}
	bad := apperr.New(apperr.ErrUnauthorized, "invalid_api_key", "Send an e2b key of this organization in X-API-Key (mint one on the organization's E2B-compatible endpoint page).")
	if !strings.HasPrefix(tok, directory.E2BPrefix) {
		return bad
	}
	k, owner, err := t.Auth.VerifyKey(c.Request().Context(), t.Dir, tok)
	if err != nil {
		return err
	}
	if !k.IsE2B() {
		return bad
	}
	p := e2b.KeyPrincipal(k, owner)
	c.Set(ctxPrincipal, &p)
	c.Set(ctxE2BKey, k)
	actor := authz.New(p, t.Enforcer, s.denialRecorder(c, t))
	c.Set(ctxActor, actor)
	err = next(c)
	if ferr := actor.Flush(c.Request().Context()); ferr != nil {
		s.Logger.Error("denial not recorded", "org", t.Org.Slug, "request_id", requestID(c), "error", ferr)
		return ferr
	}
	return err
}

func e2bKeyOf(c echo.Context) directory.APIKey {
	k, _ := c.Get(ctxE2BKey).(directory.APIKey)
	return k
}

// e2bError writes an error in E2B's shape, {"code": <status>, "message"}.
func (s *Server) e2bError(c echo.Context, status int, message string) {
	_ = c.JSON(status, map[string]any{"code": status, "message": message})
}

// e2bSandboxJSON is E2B's Sandbox (create and connect answers).
type e2bSandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	Alias              *string `json:"alias"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             string  `json:"domain"`
}

// e2bListedJSON is E2B's ListedSandbox; e2bDetailJSON its SandboxDetail.
type e2bListedJSON struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	ClientID    string            `json:"clientID"`
	Alias       *string           `json:"alias"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
}

type e2bDetailJSON struct {
	e2bListedJSON
	EnvdAccessToken string           `json:"envdAccessToken"`
	Domain          string           `json:"domain"`
	Lifecycle       e2bLifecycleJSON `json:"lifecycle"`
}

type e2bLifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// e2bClientID names the console as the "client" (E2B's node) of every
// sandbox: the backend's own ids stay inside.
const e2bClientID = "gatehouse"

func (s *Server) e2bDomain() string { return e2b.AnswerDomain(s.E2B.Domain) }

func (s *Server) e2bSandbox(c echo.Context, x e2b.Sandbox) (e2bSandboxJSON, error) {
	tok, err := e2b.OpenToken(s.Box, tenantOf(c).Org.Slug, x)
	if err != nil {
		return e2bSandboxJSON{}, err
	}
	return e2bSandboxJSON{SandboxID: x.SandboxID, TemplateID: x.TemplateID, ClientID: e2bClientID, EnvdVersion: e2b.EnvdVersion,
		EnvdAccessToken: tok, Domain: s.e2bDomain()}, nil
}

func (s *Server) e2bListed(x e2b.Sandbox, sess sessions.Session, tpl e2bTemplateSize) e2bListedJSON {
	started := sess.CreatedAt
	if sess.StartedAt != nil {
		started = *sess.StartedAt
	}
	end := started.Add(time.Duration(x.TimeoutSeconds) * time.Second)
	if x.EndAt != nil {
		end = *x.EndAt
	}
	return e2bListedJSON{SandboxID: x.SandboxID, TemplateID: x.TemplateID, ClientID: e2bClientID, StartedAt: started.UTC(), EndAt: end.UTC(),
		CPUCount: tpl.cpu, MemoryMB: tpl.memory, DiskSizeMB: tpl.disk, State: e2b.StateOf(sess), EnvdVersion: e2b.EnvdVersion, Metadata: x.MetadataMap()}
}

// e2bTemplateSize is what E2B's answers say of a sandbox's size: its
// template's, with E2B's minimums when the template names none.
type e2bTemplateSize struct{ cpu, memory, disk int }

func e2bSize(tpl *envs.Template) e2bTemplateSize {
	size := e2bTemplateSize{cpu: 1, memory: 512, disk: 0}
	if tpl == nil {
		return size
	}
	if tpl.VCPU > 0 {
		size.cpu = tpl.VCPU
	}
	if tpl.MemoryMB >= 128 {
		size.memory = tpl.MemoryMB
	}
	size.disk = tpl.WritableLayerMB
	return size
}

// e2bAgent reads the key's agent and the template its sandboxes run as
// the key's owner may see them: an owner who lost the agent gets the
// same 404 as for any agent out of reach.
func (s *Server) e2bAgent(c echo.Context) (agents.Agent, *envs.Template, error) {
	return s.sessionService(c).Agents.Template(c.Request().Context(), actorOf(c), *e2bKeyOf(c).AgentID)
}

// e2bNewSandbox is E2B's NewSandbox, as far as the console honours it.
type e2bNewSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int              `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  *bool             `json:"autoPause"`
}

// e2bDecode reads a JSON body leniently: the SDKs send fields the console
// does not act on (network, mcp, secure…), which must not fail the call.
func e2bDecode(c echo.Context, v any) error {
	r := c.Request()
	if ct := r.Header.Get(echo.HeaderContentType); ct != "" && !strings.HasPrefix(ct, echo.MIMEApplicationJSON) {
		return apperr.New(apperr.ErrInvalid, "unsupported_content_type", "Send the request body as application/json.")
	}
	err := json.NewDecoder(r.Body).Decode(v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return jsonError(err)
	}
	return nil
}

// defaultE2BTimeout is E2B's SDK default sandbox timeout, in seconds.
const defaultE2BTimeout = 300

// maxE2BTimeout is the longest timeout asked for that is accepted (E2B's
// own ceiling for paying teams is a day).
const maxE2BTimeout = 24 * 3600

func e2bTimeoutSeconds(p *int, required bool) (int, error) {
	if p == nil {
		if required {
			return 0, &apperr.ValidationError{Fields: map[string]string{"timeout": "timeout (seconds) is required."}}
		}
		return defaultE2BTimeout, nil
	}
	if *p < 1 || *p > maxE2BTimeout {
		return 0, &apperr.ValidationError{Fields: map[string]string{"timeout": "timeout must be from 1 to 86400 seconds."}}
	}
	return *p, nil
}

// e2bCreate creates a session of the key's agent, records it as an E2B
// sandbox (its id, its minted envd token, sealed) in the session's own
// creating transaction, starts it, and answers E2B's Sandbox. A session
// that cannot start is closed again: the SDK sees an error and nothing
// is left running.
func (s *Server) e2bCreate(c echo.Context) error {
	var req e2bNewSandbox
	if err := e2bDecode(c, &req); err != nil {
		return err
	}
	timeout, err := e2bTimeoutSeconds(req.Timeout, false)
	if err != nil {
		return err
	}
	if len(req.EnvVars) > 0 {
		return &apperr.ValidationError{Fields: map[string]string{"envVars": "Sandbox-wide environment variables are not supported here: set them per command (commands.run's envs)."}}
	}
	if req.AutoPause != nil && *req.AutoPause {
		return &apperr.ValidationError{Fields: map[string]string{"autoPause": "Pausing at timeout is not supported: the agent's idle timeout and reclaim decide when its sessions end."}}
	}
	ctx, t, k := c.Request().Context(), tenantOf(c), e2bKeyOf(c)
	ag, tpl, err := s.e2bAgent(c)
	if err != nil {
		return err
	}
	tplName, err := e2bTemplateName(ag, tpl, req.TemplateID)
	if err != nil {
		return err
	}
	meta, _ := json.Marshal(req.Metadata)
	if req.Metadata == nil {
		meta = []byte("{}")
	}
	token := e2b.MintAccessToken()
	x := e2b.Sandbox{SandboxID: e2b.NewSandboxID(t.Org.Slug), KeyID: k.ID, AgentID: *k.AgentID, TemplateID: tplName,
		Metadata: string(meta), TimeoutSeconds: timeout, CreatedAt: s.Now().UTC()}
	end := x.CreatedAt.Add(time.Duration(timeout) * time.Second)
	x.EndAt = &end
	if x.TokenSealed, err = e2b.SealToken(s.Box, t.Org.Slug, x.SandboxID, token); err != nil {
		return err
	}
	svc := s.sessionService(c)
	sess, err := svc.Create(ctx, actorOf(c), sessions.CreateInput{AgentID: *k.AgentID,
		Record: func(tx *gorm.DB, sess sessions.Session) error {
			x.SessionID = sess.ID
			if err := e2b.Insert(ctx, tx, &x); err != nil {
				return err
			}
			_, err := t.Audit.AppendTx(ctx, tx, requestEvent(c, principalOf(c).AuditActor(), "session.create", sessions.AuditTarget(sess),
				audit.Allow, map[string]any{"after": toSessionJSON(sess), "e2b_sandbox_id": x.SandboxID, "template_id": tplName}))
			return err
		}})
	if err != nil {
		return err
	}
	if _, err := svc.Start(ctx, actorOf(c), sess.ID); err != nil {
		if _, cerr := s.closeSession(svc, ctx, actorOf(c), sess.ID); cerr != nil {
			s.Logger.Error("close e2b session that did not start", "org", t.Org.Slug, "session", sess.ID, "error", cerr)
		}
		return err
	}
	out, err := s.e2bSandbox(c, x)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, out)
}

// e2bTemplateName checks the template the SDK asked for against the key's
// agent: its template (by name or backend id), or "base" (the SDK's
// default), which means the agent's. Sessions always run the agent's
// template; another name is refused rather than silently replaced.
func e2bTemplateName(ag agents.Agent, tpl *envs.Template, asked string) (string, error) {
	name := ag.Name
	if tpl != nil {
		name = tpl.Name
		if asked == tpl.BackendTemplateID {
			return name, nil
		}
	}
	if asked == "" || asked == "base" || asked == name || asked == ag.Name {
		return name, nil
	}
	return "", &apperr.ValidationError{Fields: map[string]string{"templateID": "This key's agent \"" + ag.Name + "\" runs template \"" + name +
		"\"; ask for that template (or \"base\") instead of \"" + asked + "\"."}}
}

// e2bSession reads the :sandboxID sandbox and its session as the key may
// see them: another org's id, another agent's or another key's sandbox, a
// closed one and an unknown one all answer the same 404.
func (s *Server) e2bSession(c echo.Context) (e2b.Sandbox, sessions.Session, error) {
	id := c.Param("sandboxID")
	ctx, t, k := c.Request().Context(), tenantOf(c), e2bKeyOf(c)
	if slug, ok := e2b.OrgOf(id); !ok || slug != t.Org.Slug {
		return e2b.Sandbox{}, sessions.Session{}, e2b.NotFound(id)
	}
	x, err := e2b.Find(ctx, t.DB, id)
	if err != nil {
		return x, sessions.Session{}, err
	}
	if x.AgentID != *k.AgentID || x.KeyID != k.ID {
		// Only the key that created a sandbox reaches it: its envd token
		// acts as that key (and its owner) on the data plane, so another
		// key, even of the same agent and an owner who may see the
		// session, is not handed it.
		return e2b.Sandbox{}, sessions.Session{}, e2b.NotFound(id)
	}
	sess, err := s.sessionService(c).Get(ctx, actorOf(c), x.SessionID)
	if errors.Is(err, apperr.ErrNotFound) || err == nil && sess.Final() {
		return e2b.Sandbox{}, sessions.Session{}, e2b.NotFound(id)
	}
	return x, sess, err
}

func (s *Server) e2bGet(c echo.Context) error {
	x, sess, err := s.e2bSession(c)
	if err != nil {
		return err
	}
	_, tpl, err := s.e2bAgent(c)
	if err != nil {
		return err
	}
	tok, err := e2b.OpenToken(s.Box, tenantOf(c).Org.Slug, x)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, e2bDetailJSON{e2bListedJSON: s.e2bListed(x, sess, e2bSize(tpl)), EnvdAccessToken: tok,
		Domain: s.e2bDomain(), Lifecycle: e2bLifecycleJSON{OnTimeout: "kill"}})
}

// e2bList answers one page of the live sandboxes this key created that
// its owner may still see, newest first, filtered by state and metadata
// as E2B does; X-Next-Token names the next page when there is one.
func (s *Server) e2bList(c echo.Context) error {
	ctx, k := c.Request().Context(), e2bKeyOf(c)
	q := e2b.ListQuery{KeyID: k.ID, AgentID: *k.AgentID, NextToken: c.QueryParam("nextToken")}
	if raw := c.QueryParam("state"); raw != "" {
		for _, st := range strings.Split(raw, ",") {
			if st != e2b.StateRunning && st != e2b.StatePaused {
				return &apperr.ValidationError{Fields: map[string]string{"state": "state must be running, paused or both (comma-separated)."}}
			}
			q.States = append(q.States, st)
		}
	}
	var err error
	if q.Metadata, err = e2bMetadataFilter(c.QueryParam("metadata")); err != nil {
		return err
	}
	if raw := c.QueryParam("limit"); raw != "" {
		n, err := parseID(raw)
		if err != nil || n > e2b.MaxListLimit {
			return &apperr.ValidationError{Fields: map[string]string{"limit": "limit must be from 1 to 100."}}
		}
		q.Limit = int(n)
	}
	_, tpl, err := s.e2bAgent(c)
	if err != nil {
		return err
	}
	page, err := e2b.List(ctx, tenantOf(c).DB, s.sessionService(c), actorOf(c), q)
	if err != nil {
		return err
	}
	size := e2bSize(tpl)
	out := make([]e2bListedJSON, 0, len(page.Items))
	for _, e := range page.Items {
		out = append(out, s.e2bListed(e.Sandbox, e.Session, size))
	}
	if page.NextToken != "" {
		c.Response().Header().Set("X-Next-Token", page.NextToken)
	}
	return c.JSON(http.StatusOK, out)
}

// e2bMetadataFilter decodes E2B's metadata query the way the SDK built
// it: each key and value URL-encoded (encodeURIComponent), joined as form
// pairs (URLSearchParams, which encodes them once more), so two decodings
// after the query string's own.
func e2bMetadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	bad := &apperr.ValidationError{Fields: map[string]string{"metadata": "metadata must be URL-encoded key=value pairs joined by &."}}
	pairs, err := url.ParseQuery(raw)
	if err != nil {
		return nil, bad
	}
	out := map[string]string{}
	for k, vs := range pairs {
		dk, err := url.QueryUnescape(k)
		if err != nil || len(vs) != 1 {
			return nil, bad
		}
		dv, err := url.QueryUnescape(vs[0])
		if err != nil {
			return nil, bad
		}
		out[dk] = dv
	}
	return out, nil
}

// e2bTimeoutBody is the body of connect, resume and timeout.
type e2bTimeoutBody struct {
	Timeout *int `json:"timeout"`
}

// e2bConnect resumes a paused sandbox (201) or makes sure a running one
// is up (200), and answers its Sandbox with its envd token again.
func (s *Server) e2bConnect(c echo.Context) error {
	var req e2bTimeoutBody
	if err := e2bDecode(c, &req); err != nil {
		return err
	}
	var timeout int
	var err error
	if req.Timeout != nil {
		if timeout, err = e2bTimeoutSeconds(req.Timeout, true); err != nil {
			return err
		}
	}
	x, sess, err := s.e2bSession(c)
	if err != nil {
		return err
	}
	ctx, svc := c.Request().Context(), s.sessionService(c)
	status := http.StatusOK
	if sess.State == sessions.StatePaused {
		_, err = svc.Resume(ctx, actorOf(c), sess.ID)
		status = http.StatusCreated
	} else {
		_, err = svc.Start(ctx, actorOf(c), sess.ID)
	}
	if err != nil {
		return err
	}
	if req.Timeout != nil {
		if err := s.e2bSetTimeout(c, x, sess, timeout); err != nil {
			return err
		}
	}
	out, err := s.e2bSandbox(c, x)
	if err != nil {
		return err
	}
	return c.JSON(status, out)
}

// e2bSetTimeout records a sandbox's new timeout with its audit record.
func (s *Server) e2bSetTimeout(c echo.Context, x e2b.Sandbox, sess sessions.Session, seconds int) error {
	end := s.Now().Add(time.Duration(seconds) * time.Second).UTC()
	return s.mutate(c, func(m *orgTx) error {
		if err := e2b.SetTimeout(c.Request().Context(), m.tx, x.ID, seconds, end); err != nil {
			return err
		}
		return m.audit("session.e2b_timeout", sessions.AuditTarget(sess), map[string]any{"e2b_sandbox_id": x.SandboxID, "timeout_seconds": seconds, "end_at": end})
	})
}

// e2bTimeout sets a sandbox's timeout (E2B answers 204). Only someone who
// may use the session may change it.
func (s *Server) e2bTimeout(c echo.Context) error {
	var req e2bTimeoutBody
	if err := e2bDecode(c, &req); err != nil {
		return err
	}
	timeout, err := e2bTimeoutSeconds(req.Timeout, true)
	if err != nil {
		return err
	}
	x, sess, err := s.e2bSession(c)
	if err != nil {
		return err
	}
	ok, err := s.sessionService(c).CanUse(c.Request().Context(), actorOf(c), sess)
	if err != nil {
		return err
	}
	if !ok {
		return actorOf(c).Deny(authz.Denial{Target: sessions.AuditTarget(sess), Domain: authz.Domain(sess.AgentDepartmentID),
			Object: "sessions/" + itoa(sess.ID), Action: "update", Rule: "may see the session but not use it"}, "You may see this sandbox but not change it.")
	}
	if err := s.e2bSetTimeout(c, x, sess, timeout); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) e2bPause(c echo.Context) error {
	_, sess, err := s.e2bSession(c)
	if err != nil {
		return err
	}
	if sess.State == sessions.StatePaused {
		return apperr.New(apperr.ErrConflict, "already_paused", "Sandbox %s is already paused.", c.Param("sandboxID"))
	}
	if _, err := s.sessionService(c).Pause(c.Request().Context(), actorOf(c), sess.ID); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// e2bKill closes the sandbox's session like the console's own close: its
// commands are ended and recorded, then the sandbox is killed.
func (s *Server) e2bKill(c echo.Context) error {
	_, sess, err := s.e2bSession(c)
	if err != nil {
		return err
	}
	if _, err := s.closeSession(s.sessionService(c), c.Request().Context(), actorOf(c), sess.ID); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// e2bTemplateJSON is E2B's Template.
type e2bTemplateJSON struct {
	TemplateID  string    `json:"templateID"`
	BuildID     string    `json:"buildID"`
	CPUCount    int       `json:"cpuCount"`
	MemoryMB    int       `json:"memoryMB"`
	DiskSizeMB  int       `json:"diskSizeMB"`
	Public      bool      `json:"public"`
	Aliases     []string  `json:"aliases"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	BuildStatus string    `json:"buildStatus"`
	EnvdVersion string    `json:"envdVersion"`
}

// e2bTemplates lists the one template the key's sandboxes run: its
// agent's.
func (s *Server) e2bTemplates(c echo.Context) error {
	_, tpl, err := s.e2bAgent(c)
	if err != nil {
		return err
	}
	out := []e2bTemplateJSON{}
	if tpl != nil {
		status := "ready"
		if !tpl.Ready() {
			status = "building"
		}
		size := e2bSize(tpl)
		out = append(out, e2bTemplateJSON{TemplateID: tpl.Name, BuildID: itoa(tpl.ID), CPUCount: size.cpu, MemoryMB: size.memory, DiskSizeMB: size.disk,
			Aliases: []string{tpl.Name}, CreatedAt: tpl.CreatedAt.UTC(), UpdatedAt: tpl.UpdatedAt.UTC(), BuildStatus: status, EnvdVersion: e2b.EnvdVersion})
	}
	return c.JSON(http.StatusOK, out)
}
