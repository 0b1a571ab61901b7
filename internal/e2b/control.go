package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// ControlPlane is the E2B-compatible control plane of each org (the SDK's
// E2B_API_URL): its handlers create, list, connect to, pause and kill the
// sandboxes of an e2b key, each a session of the key's agent. Which
// sandboxes a key reaches is decided by the sessions service (the key's
// owner's rights) and the key's agent. The console mounts the handlers on
// its router behind Authenticate.
type ControlPlane struct {
	// Console is the console's side of each request.
	Console Console
	// Box seals and opens the envd access tokens.
	Box *sealed.Box
	// Domain is the data plane's wildcard domain ("" when none).
	Domain string
	// Now is the clock (nil: time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Console is what the control plane needs of the console's request
// handling, so that an E2B call is authenticated, audited and closed like
// any other of the console's.
type Console interface {
	// Request is the authenticated request's org, actor, key and sessions
	// service.
	Request(c echo.Context) Request
	// Event is an audit event of the request, by its principal.
	Event(c echo.Context, action string, target audit.Target, details any) audit.Event
	// SessionRecord is a session as the console's audit records show it.
	SessionRecord(sess sessions.Session) any
	// CloseSession closes a session as the console's own close does: its
	// commands are ended and recorded, then its sandbox is killed.
	CloseSession(c echo.Context, svc *sessions.Service, id int64) error
	// JSONError is the console's refusal of a body that is not the JSON
	// asked for.
	JSONError(err error) error
}

// Request is one authenticated control-plane request.
type Request struct {
	Tenant *tenant.Tenant
	// Actor is the key's owner acting through the key.
	Actor    *authz.Actor
	Key      directory.APIKey
	Sessions *sessions.Service
}

// KeyHeader carries the e2b key (the SDKs' X-API-Key).
const KeyHeader = "X-API-Key"

// Authenticate checks token, an e2b key of org t, and answers the key and
// the principal it acts as: its owner, restricted to its agent. Ordinary
// gh_ keys and sign-ins are refused here, as e2b keys are everywhere else.
func Authenticate(ctx context.Context, t *tenant.Tenant, token string) (directory.APIKey, authz.Principal, error) {
	bad := apperr.New(apperr.ErrUnauthorized, "invalid_api_key", "Send an e2b key of this organization in X-API-Key (mint one on the organization's E2B-compatible endpoint page).")
	if !strings.HasPrefix(token, directory.E2BPrefix) {
		return directory.APIKey{}, authz.Principal{}, bad
	}
	k, owner, err := t.Auth.VerifyKey(ctx, t.Dir, token)
	if err != nil {
		return directory.APIKey{}, authz.Principal{}, err
	}
	if !k.IsE2B() {
		return directory.APIKey{}, authz.Principal{}, bad
	}
	return k, KeyPrincipal(k, owner), nil
}

func (p *ControlPlane) now() time.Time {
	if p.Now != nil {
		return p.Now().UTC()
	}
	return time.Now().UTC()
}

func (p *ControlPlane) logger() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}

// WriteError answers an error in E2B's shape, {"code": <status>,
// "message"}, which the SDKs read.
func WriteError(c echo.Context, status int, message string) {
	_ = c.JSON(status, map[string]any{"code": status, "message": message})
}

// sandboxJSON is E2B's Sandbox (create and connect answers).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	Alias              *string `json:"alias"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             string  `json:"domain"`
}

// listedJSON is E2B's ListedSandbox; detailJSON its SandboxDetail.
type listedJSON struct {
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

type detailJSON struct {
	listedJSON
	EnvdAccessToken string        `json:"envdAccessToken"`
	Domain          string        `json:"domain"`
	Lifecycle       lifecycleJSON `json:"lifecycle"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// clientID names the console as the "client" (E2B's node) of every
// sandbox: the backend's own ids stay inside.
const clientID = "gatehouse"

func (p *ControlPlane) sandbox(r Request, x Sandbox) (sandboxJSON, error) {
	tok, err := OpenToken(p.Box, r.Tenant.Org.Slug, x)
	if err != nil {
		return sandboxJSON{}, err
	}
	return sandboxJSON{SandboxID: x.SandboxID, TemplateID: x.TemplateID, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: tok, Domain: AnswerDomain(p.Domain)}, nil
}

func listed(x Sandbox, sess sessions.Session, tpl templateSize) listedJSON {
	started := sess.CreatedAt
	if sess.StartedAt != nil {
		started = *sess.StartedAt
	}
	end := started.Add(time.Duration(x.TimeoutSeconds) * time.Second)
	if x.EndAt != nil {
		end = *x.EndAt
	}
	return listedJSON{SandboxID: x.SandboxID, TemplateID: x.TemplateID, ClientID: clientID, StartedAt: started.UTC(), EndAt: end.UTC(),
		CPUCount: tpl.cpu, MemoryMB: tpl.memory, DiskSizeMB: tpl.disk, State: StateOf(sess), EnvdVersion: EnvdVersion, Metadata: x.MetadataMap()}
}

// templateSize is what E2B's answers say of a sandbox's size: its
// template's, with E2B's minimums when the template names none.
type templateSize struct{ cpu, memory, disk int }

func sizeOf(tpl *envs.Template) templateSize {
	size := templateSize{cpu: 1, memory: 512, disk: 0}
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

// agent reads the key's agent and the template its sandboxes run as the
// key's owner may see them: an owner who lost the agent gets the same 404
// as for any agent out of reach.
func agent(c echo.Context, r Request) (agents.Agent, *envs.Template, error) {
	return r.Sessions.Agents.Template(c.Request().Context(), r.Actor, *r.Key.AgentID)
}

// newSandbox is E2B's NewSandbox, as far as the console honours it.
type newSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int              `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  *bool             `json:"autoPause"`
}

// decode reads a JSON body leniently: the SDKs send fields the console
// does not act on (network, mcp, secure…), which must not fail the call.
func (p *ControlPlane) decode(c echo.Context, v any) error {
	req := c.Request()
	if ct := req.Header.Get(echo.HeaderContentType); ct != "" && !strings.HasPrefix(ct, echo.MIMEApplicationJSON) {
		return apperr.New(apperr.ErrInvalid, "unsupported_content_type", "Send the request body as application/json.")
	}
	err := json.NewDecoder(req.Body).Decode(v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return p.Console.JSONError(err)
	}
	return nil
}

// defaultTimeout is E2B's SDK default sandbox timeout, in seconds.
const defaultTimeout = 300

// maxTimeout is the longest timeout asked for that is accepted (E2B's
// own ceiling for paying teams is a day).
const maxTimeout = 24 * 3600

func timeoutSeconds(p *int, required bool) (int, error) {
	if p == nil {
		if required {
			return 0, &apperr.ValidationError{Fields: map[string]string{"timeout": "timeout (seconds) is required."}}
		}
		return defaultTimeout, nil
	}
	if *p < 1 || *p > maxTimeout {
		return 0, &apperr.ValidationError{Fields: map[string]string{"timeout": "timeout must be from 1 to 86400 seconds."}}
	}
	return *p, nil
}

// Create creates a session of the key's agent, records it as an E2B
// sandbox (its id, its minted envd token, sealed) in the session's own
// creating transaction, starts it, and answers E2B's Sandbox. A session
// that cannot start is closed again: the SDK sees an error and nothing
// is left running.
func (p *ControlPlane) Create(c echo.Context) error {
	var req newSandbox
	if err := p.decode(c, &req); err != nil {
		return err
	}
	timeout, err := timeoutSeconds(req.Timeout, false)
	if err != nil {
		return err
	}
	if len(req.EnvVars) > 0 {
		return &apperr.ValidationError{Fields: map[string]string{"envVars": "Sandbox-wide environment variables are not supported here: set them per command (commands.run's envs)."}}
	}
	if req.AutoPause != nil && *req.AutoPause {
		return &apperr.ValidationError{Fields: map[string]string{"autoPause": "Pausing at timeout is not supported: the agent's idle timeout and reclaim decide when its sessions end."}}
	}
	r := p.Console.Request(c)
	ctx, t, k := c.Request().Context(), r.Tenant, r.Key
	ag, tpl, err := agent(c, r)
	if err != nil {
		return err
	}
	tplName, err := templateName(ag, tpl, req.TemplateID)
	if err != nil {
		return err
	}
	meta, _ := json.Marshal(req.Metadata)
	if req.Metadata == nil {
		meta = []byte("{}")
	}
	token := MintAccessToken()
	x := Sandbox{SandboxID: NewSandboxID(t.Org.Slug), KeyID: k.ID, AgentID: *k.AgentID, TemplateID: tplName,
		Metadata: string(meta), TimeoutSeconds: timeout, CreatedAt: p.now()}
	end := x.CreatedAt.Add(time.Duration(timeout) * time.Second)
	x.EndAt = &end
	if x.TokenSealed, err = SealToken(p.Box, t.Org.Slug, x.SandboxID, token); err != nil {
		return err
	}
	svc := r.Sessions
	sess, err := svc.Create(ctx, r.Actor, sessions.CreateInput{AgentID: *k.AgentID,
		Record: func(tx *gorm.DB, sess sessions.Session) error {
			x.SessionID = sess.ID
			if err := Insert(ctx, tx, &x); err != nil {
				return err
			}
			_, err := t.Audit.AppendTx(ctx, tx, p.Console.Event(c, "session.create", sessions.AuditTarget(sess),
				map[string]any{"after": p.Console.SessionRecord(sess), "e2b_sandbox_id": x.SandboxID, "template_id": tplName}))
			return err
		}})
	if err != nil {
		return err
	}
	if _, err := svc.Start(ctx, r.Actor, sess.ID); err != nil {
		if cerr := p.Console.CloseSession(c, svc, sess.ID); cerr != nil {
			p.logger().Error("close e2b session that did not start", "org", t.Org.Slug, "session", sess.ID, "error", cerr)
		}
		return err
	}
	out, err := p.sandbox(r, x)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, out)
}

// templateName checks the template the SDK asked for against the key's
// agent: its template (by name or backend id), or "base" (the SDK's
// default), which means the agent's. Sessions always run the agent's
// template; another name is refused rather than silently replaced.
func templateName(ag agents.Agent, tpl *envs.Template, asked string) (string, error) {
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

// session reads the :sandboxID sandbox and its session as the key may
// see them: another org's id, another agent's or another key's sandbox, a
// closed one and an unknown one all answer the same 404.
func session(c echo.Context, r Request) (Sandbox, sessions.Session, error) {
	id := c.Param("sandboxID")
	ctx, t, k := c.Request().Context(), r.Tenant, r.Key
	if slug, ok := OrgOf(id); !ok || slug != t.Org.Slug {
		return Sandbox{}, sessions.Session{}, NotFound(id)
	}
	x, err := Find(ctx, t.DB, id)
	if err != nil {
		return x, sessions.Session{}, err
	}
	if x.AgentID != *k.AgentID || x.KeyID != k.ID {
		// Only the key that created a sandbox reaches it: its envd token
		// acts as that key (and its owner) on the data plane, so another
		// key, even of the same agent and an owner who may see the
		// session, is not handed it.
		return Sandbox{}, sessions.Session{}, NotFound(id)
	}
	sess, err := r.Sessions.Get(ctx, r.Actor, x.SessionID)
	if errors.Is(err, apperr.ErrNotFound) || err == nil && sess.Final() {
		return Sandbox{}, sessions.Session{}, NotFound(id)
	}
	return x, sess, err
}

// Get answers a sandbox's SandboxDetail.
func (p *ControlPlane) Get(c echo.Context) error {
	r := p.Console.Request(c)
	x, sess, err := session(c, r)
	if err != nil {
		return err
	}
	_, tpl, err := agent(c, r)
	if err != nil {
		return err
	}
	tok, err := OpenToken(p.Box, r.Tenant.Org.Slug, x)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, detailJSON{listedJSON: listed(x, sess, sizeOf(tpl)), EnvdAccessToken: tok,
		Domain: AnswerDomain(p.Domain), Lifecycle: lifecycleJSON{OnTimeout: "kill"}})
}

// List answers one page of the live sandboxes this key created that
// its owner may still see, newest first, filtered by state and metadata
// as E2B does; X-Next-Token names the next page when there is one.
func (p *ControlPlane) List(c echo.Context) error {
	r := p.Console.Request(c)
	ctx, k := c.Request().Context(), r.Key
	q := ListQuery{KeyID: k.ID, AgentID: *k.AgentID, NextToken: c.QueryParam("nextToken")}
	if raw := c.QueryParam("state"); raw != "" {
		for _, st := range strings.Split(raw, ",") {
			if st != StateRunning && st != StatePaused {
				return &apperr.ValidationError{Fields: map[string]string{"state": "state must be running, paused or both (comma-separated)."}}
			}
			q.States = append(q.States, st)
		}
	}
	var err error
	if q.Metadata, err = metadataFilter(c.QueryParam("metadata")); err != nil {
		return err
	}
	if raw := c.QueryParam("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > MaxListLimit {
			return &apperr.ValidationError{Fields: map[string]string{"limit": "limit must be from 1 to 100."}}
		}
		q.Limit = n
	}
	_, tpl, err := agent(c, r)
	if err != nil {
		return err
	}
	page, err := List(ctx, r.Tenant.DB, r.Sessions, r.Actor, q)
	if err != nil {
		return err
	}
	size := sizeOf(tpl)
	out := make([]listedJSON, 0, len(page.Items))
	for _, e := range page.Items {
		out = append(out, listed(e.Sandbox, e.Session, size))
	}
	if page.NextToken != "" {
		c.Response().Header().Set("X-Next-Token", page.NextToken)
	}
	return c.JSON(http.StatusOK, out)
}

// metadataFilter decodes E2B's metadata query the way the SDK built
// it: each key and value URL-encoded (encodeURIComponent), joined as form
// pairs (URLSearchParams, which encodes them once more), so two decodings
// after the query string's own.
func metadataFilter(raw string) (map[string]string, error) {
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

// timeoutBody is the body of connect, resume and timeout.
type timeoutBody struct {
	Timeout *int `json:"timeout"`
}

// Connect resumes a paused sandbox (201) or makes sure a running one
// is up (200), and answers its Sandbox with its envd token again.
func (p *ControlPlane) Connect(c echo.Context) error {
	var req timeoutBody
	if err := p.decode(c, &req); err != nil {
		return err
	}
	var timeout int
	var err error
	if req.Timeout != nil {
		if timeout, err = timeoutSeconds(req.Timeout, true); err != nil {
			return err
		}
	}
	r := p.Console.Request(c)
	x, sess, err := session(c, r)
	if err != nil {
		return err
	}
	ctx, svc := c.Request().Context(), r.Sessions
	status := http.StatusOK
	if sess.State == sessions.StatePaused {
		_, err = svc.Resume(ctx, r.Actor, sess.ID)
		status = http.StatusCreated
	} else {
		_, err = svc.Start(ctx, r.Actor, sess.ID)
	}
	if err != nil {
		return err
	}
	if req.Timeout != nil {
		if err := p.setTimeout(c, r, x, sess, timeout); err != nil {
			return err
		}
	}
	out, err := p.sandbox(r, x)
	if err != nil {
		return err
	}
	return c.JSON(status, out)
}

// setTimeout records a sandbox's new timeout with its audit record, in
// one transaction.
func (p *ControlPlane) setTimeout(c echo.Context, r Request, x Sandbox, sess sessions.Session, seconds int) error {
	ctx := c.Request().Context()
	end := p.now().Add(time.Duration(seconds) * time.Second)
	return r.Tenant.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := SetTimeout(ctx, tx, x.ID, seconds, end); err != nil {
			return err
		}
		_, err := r.Tenant.Audit.AppendTx(ctx, tx, p.Console.Event(c, "session.e2b_timeout", sessions.AuditTarget(sess),
			map[string]any{"e2b_sandbox_id": x.SandboxID, "timeout_seconds": seconds, "end_at": end}))
		return err
	})
}

// Timeout sets a sandbox's timeout (E2B answers 204). Only someone who
// may use the session may change it.
func (p *ControlPlane) Timeout(c echo.Context) error {
	var req timeoutBody
	if err := p.decode(c, &req); err != nil {
		return err
	}
	timeout, err := timeoutSeconds(req.Timeout, true)
	if err != nil {
		return err
	}
	r := p.Console.Request(c)
	x, sess, err := session(c, r)
	if err != nil {
		return err
	}
	ok, err := r.Sessions.CanUse(c.Request().Context(), r.Actor, sess)
	if err != nil {
		return err
	}
	if !ok {
		return r.Actor.Deny(authz.Denial{Target: sessions.AuditTarget(sess), Domain: authz.Domain(sess.AgentDepartmentID),
			Object: "sessions/" + strconv.FormatInt(sess.ID, 10), Action: "update", Rule: "may see the session but not use it"}, "You may see this sandbox but not change it.")
	}
	if err := p.setTimeout(c, r, x, sess, timeout); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Pause pauses a running sandbox (E2B answers 409 for a paused one).
func (p *ControlPlane) Pause(c echo.Context) error {
	r := p.Console.Request(c)
	_, sess, err := session(c, r)
	if err != nil {
		return err
	}
	if sess.State == sessions.StatePaused {
		return apperr.New(apperr.ErrConflict, "already_paused", "Sandbox %s is already paused.", c.Param("sandboxID"))
	}
	if _, err := r.Sessions.Pause(c.Request().Context(), r.Actor, sess.ID); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Kill closes the sandbox's session like the console's own close: its
// commands are ended and recorded, then the sandbox is killed.
func (p *ControlPlane) Kill(c echo.Context) error {
	r := p.Console.Request(c)
	_, sess, err := session(c, r)
	if err != nil {
		return err
	}
	if err := p.Console.CloseSession(c, r.Sessions, sess.ID); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// templateJSON is E2B's Template.
type templateJSON struct {
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

// Templates lists the one template the key's sandboxes run: its
// agent's.
func (p *ControlPlane) Templates(c echo.Context) error {
	r := p.Console.Request(c)
	_, tpl, err := agent(c, r)
	if err != nil {
		return err
	}
	out := []templateJSON{}
	if tpl != nil {
		status := "ready"
		if !tpl.Ready() {
			status = "building"
		}
		size := sizeOf(tpl)
		out = append(out, templateJSON{TemplateID: tpl.Name, BuildID: strconv.FormatInt(tpl.ID, 10), CPUCount: size.cpu, MemoryMB: size.memory, DiskSizeMB: size.disk,
			Aliases: []string{tpl.Name}, CreatedAt: tpl.CreatedAt.UTC(), UpdatedAt: tpl.UpdatedAt.UTC(), BuildStatus: status, EnvdVersion: EnvdVersion})
	}
	return c.JSON(http.StatusOK, out)
}
