// Package envs holds an org's execution environments (agentd hosts and
// E2B-compatible sandbox backends), their sandbox templates and their
// health. Secrets (agentd tokens, backend API keys) are sealed at rest,
// bound to the org and the environment, and never leave this package in
// plain text except to build a client.
package envs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2b"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Kinds.
const (
	KindHost    = "host"
	KindSandbox = "sandbox"
)

// Health statuses.
const (
	HealthUnknown     = "unknown"
	HealthHealthy     = "healthy"
	HealthDegraded    = "degraded"
	HealthUnreachable = "unreachable"
)

// Environment is where commands run.
type Environment struct {
	ID            int64 `gorm:"primaryKey"`
	Name          string
	Kind          string
	DepartmentID  *int64
	OwnerUserID   *int64
	URL           string
	OS            string
	Deployment    string
	WorkspaceRoot string
	SandboxDomain string
	SandboxScheme string
	ProxyBaseURL  string
	// WorkspaceMount (sandbox environments) is the host path template of
	// a session's persistent workspace, with {org} and {session}
	// placeholders; "" keeps workspaces inside the sandbox. See
	// WorkspaceMountFor.
	WorkspaceMount string
	// WorkspaceMountPath is where that directory is mounted inside the
	// sandbox; "" mounts it at the same path as on the host.
	WorkspaceMountPath string
	SealedAPIKey       string `gorm:"column:sealed_api_key"`
	SealedAgentdToken  string `gorm:"column:sealed_agentd_token"`
	HealthStatus       string
	HealthError        string
	HealthCheckedAt    *time.Time
	HealthChangedAt    *time.Time
	HealthLatencyMS    int `gorm:"column:health_latency_ms"`
	AgentdVersion      string
	ActiveSessions     int
	// ExecReporting is what agentd said of exec reporting at the last
	// check (agentd.Health.ExecReporting; "" when unknown), with the
	// reason when it is not available.
	ExecReporting       string
	ExecReportingReason string
	CreatedBy           string
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

// TableName binds Environment to its table.
func (Environment) TableName() string { return "environments" }

// Private reports whether the environment is someone's own.
func (e Environment) Private() bool { return e.OwnerUserID != nil }

// HasAPIKey and HasAgentdToken say whether a secret is set, which is all
// that is ever shown of it.
func (e Environment) HasAPIKey() bool { return e.SealedAPIKey != "" }

// HasAgentdToken reports whether an agentd token is set.
func (e Environment) HasAgentdToken() bool { return e.SealedAgentdToken != "" }

// Service manages one org's environments.
type Service struct {
	DB  *gorm.DB
	Box *sealed.Box
	// Org is the org slug, bound into every sealed secret.
	Org string
	// HTTPClient reaches agentd and backends; nil means a client over the
	// default transport (dial and TLS handshake timeouts) whose calls are
	// bounded by their context only.
	HTTPClient *http.Client
	Now        func() time.Time
	// MountPrefix is the directory every workspace mount template must lie
	// under ("" is DefaultMountPrefix, CubeSandbox's default allowed
	// prefix); the backend enforces its own list as well.
	MountPrefix string
}

// DefaultMountPrefix is where workspace mounts may live unless the
// service says otherwise: CubeSandbox's default allowed host-mount prefix.
const DefaultMountPrefix = "/data/shared/"

func (s *Service) mountPrefix() string {
	if s.MountPrefix != "" {
		return s.MountPrefix
	}
	return DefaultMountPrefix
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// ErrRedirect is wrapped by the error of a call that was answered with a
// redirect: none is followed, so a stored agentd token or backend key is
// only ever sent to the address it was entered for.
var ErrRedirect = errors.New("redirects are not followed, so the stored token or key is never sent elsewhere; set the environment's URL to agentd (or the API) itself")

// clientFor is the HTTP client for calls to e. It follows no redirect
// (reporting where it pointed instead). Every environment is dialled only
// at addresses netguard's Metadata rule allows (no link-local or cloud
// metadata address: a shared environment there would hand the console's
// cloud credentials to whoever registered it). A private environment,
// whose address any member may choose, is held to the stricter Blocked
// rule: nothing on the console's own machine either. Both are checked on
// the address actually dialled, so a name that resolves to a refused
// address is refused like the literal. Shared environments are set up by
// department owners and admins and may otherwise point anywhere, a
// development agentd on loopback included.
func (s *Service) clientFor(e Environment) *http.Client {
	return ClientFor(s.HTTPClient, e)
}

// ClientFor is base (a plain client when nil) made fit for calls to e, as
// clientFor describes. Every caller of an environment's agentd or backend
// outside this package (the session gateway) builds its client with it.
//
// A shared environment keeps base's transport as it is, so its connection
// pool is reused across calls; the Metadata rule is then the transport's
// business: with no transport of base's own (nil or
// http.DefaultTransport) the client gets sharedTransport, and a caller
// that brings its own transport dials through netguard.ControlFor(
// netguard.Metadata) (the console's gateway does).
func ClientFor(base *http.Client, e Environment) *http.Client {
	// No whole-call Timeout: agentd long-polls (Follow asks for 30 s) and
	// downloads outlast any fixed limit, so the caller's context bounds
	// each call instead (Check sets its own).
	c := &http.Client{}
	if base != nil {
		*c = *base
	}
	c.CheckRedirect = refuseRedirect
	switch {
	case e.Private():
		c.Transport = netguard.Transport(c.Transport)
	case c.Transport == nil || c.Transport == http.DefaultTransport:
		c.Transport = sharedTransport()
	}
	return c
}

// sharedTransport is the process's transport for shared environments when
// no other is given: http.DefaultTransport's settings, dialling only what
// netguard.Metadata allows, with kept-alive connections (it is made once,
// so its idle connections are reused rather than left behind). It uses no
// HTTP proxy from the environment, as the gateway's transport does not: a
// proxy would dial the address out of the rule's sight. Like
// http.DefaultTransport it belongs to the process, not to a Service: a
// Service is made per request.
var sharedTransport = sync.OnceValue(func() *http.Transport {
	t := netguard.Guarded(nil, netguard.Metadata)
	t.DisableKeepAlives = false
	return t
})

func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("answered with a redirect to %s: %w", req.URL.Redacted(), ErrRedirect)
}

func (s *Service) ad(id int64, field string) string {
	return sealed.AD(s.Org, fmt.Sprintf("environment/%d/%s", id, field))
}

// Input creates or updates an environment. Secret pointers: nil leaves the
// stored value alone (on update), a value replaces it.
type Input struct {
	Name          *string
	Kind          string
	DepartmentID  *int64
	URL           *string
	OS            *string
	Deployment    *string
	WorkspaceRoot *string
	SandboxDomain *string
	SandboxScheme *string
	ProxyBaseURL  *string
	// WorkspaceMount and WorkspaceMountPath are a sandbox environment's
	// persistent workspace (see Environment).
	WorkspaceMount     *string
	WorkspaceMountPath *string
	APIKey             *string
	AgentdToken        *string
	// Private (on create) makes the environment its creator's own.
	Private bool
}

var (
	validOS         = map[string]bool{"linux": true, "windows": true, "macos": true}
	validDeployment = map[string]bool{"bare-metal": true, "cloud-vm": true, "kubernetes": true}
	windowsAbsRE    = regexp.MustCompile(`^[A-Za-z]:\\`)
	hostnameRE      = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]{1,5})?$`)
)

// MinTokenLength keeps agentd tokens from being guessable; it is agentd's
// own rule, so a token stored here is one agentd accepts.
const MinTokenLength = agentd.MinTokenLength

func validHTTPURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil && u.RawQuery == "" && u.Fragment == ""
}

func set(dst *string, src *string) {
	if src != nil {
		*dst = strings.TrimSpace(*src)
	}
}

// apply copies input onto e and validates the result, explaining each rule.
func apply(e *Environment, in Input, creating bool, mountPrefix string) (agentdToken, apiKey *string, err error) {
	v := apperr.Validation()
	set(&e.Name, in.Name)
	if creating {
		e.Kind = in.Kind
	}
	set(&e.URL, in.URL)
	set(&e.OS, in.OS)
	set(&e.Deployment, in.Deployment)
	set(&e.WorkspaceRoot, in.WorkspaceRoot)
	set(&e.SandboxDomain, in.SandboxDomain)
	set(&e.SandboxScheme, in.SandboxScheme)
	set(&e.ProxyBaseURL, in.ProxyBaseURL)
	set(&e.WorkspaceMount, in.WorkspaceMount)
	set(&e.WorkspaceMountPath, in.WorkspaceMountPath)
	e.URL = strings.TrimRight(e.URL, "/")
	e.ProxyBaseURL = strings.TrimRight(e.ProxyBaseURL, "/")
	if e.Name == "" || len(e.Name) > 100 {
		v.Add("name", "Name must be 1 to 100 characters.")
	}
	switch e.Kind {
	case KindHost:
		if !validHTTPURL(e.URL) {
			v.Add("url", "The agentd URL must be an http:// or https:// URL with a host and no credentials, like https://build-01.example.com:49984.")
		}
		if !validOS[e.OS] {
			v.Add("os", "OS must be linux, windows or macos.")
		}
		if !validDeployment[e.Deployment] {
			v.Add("deployment", "Deployment must be bare-metal, cloud-vm or kubernetes.")
		}
		if e.WorkspaceRoot != "" {
			root, msg := cleanWorkspaceRoot(e.WorkspaceRoot)
			if msg != "" {
				v.Add("workspace_root", "%s", msg)
			}
			e.WorkspaceRoot = root
		}
		e.SandboxDomain, e.SandboxScheme, e.ProxyBaseURL = "", "", ""
		if in.APIKey != nil && *in.APIKey != "" {
			v.Add("api_key", "Host environments have no backend API key.")
		}
		if e.WorkspaceMount != "" || e.WorkspaceMountPath != "" {
			v.Add("workspace_mount", "Host environments keep session workspaces under their workspace root; a workspace mount is for sandbox environments.")
		}
		e.WorkspaceMount, e.WorkspaceMountPath = "", ""
	case KindSandbox:
		if !validHTTPURL(e.URL) {
			v.Add("url", "The backend API URL must be an http:// or https:// URL, like https://api.e2b.app or http://cube-api:3000.")
		}
		if e.SandboxScheme == "" {
			e.SandboxScheme = "https"
		}
		if e.SandboxScheme != "http" && e.SandboxScheme != "https" {
			v.Add("sandbox_scheme", "Scheme must be http or https.")
		}
		if e.SandboxDomain != "" && !hostnameRE.MatchString(e.SandboxDomain) {
			v.Add("sandbox_domain", "The sandbox domain must be a host name like e2b.app or cube.app, without a scheme.")
		}
		if e.ProxyBaseURL != "" && !validHTTPURL(e.ProxyBaseURL) {
			v.Add("proxy_base_url", "The proxy base URL must be an http:// or https:// URL.")
		}
		if e.SandboxDomain == "" && e.ProxyBaseURL == "" {
			v.Add("sandbox_domain", "Give the sandbox domain (host-based proxying, <port>-<sandboxID>.<domain>) or a path-based proxy base URL.")
		}
		e.OS, e.Deployment, e.WorkspaceRoot = "linux", "", ""
		validateMount(v, e, mountPrefix)
	default:
		v.Add("kind", "Kind must be host or sandbox.")
	}
	refuseMetadata(v, "url", urlHost(e.URL))
	refuseMetadata(v, "proxy_base_url", urlHost(e.ProxyBaseURL))
	domain := e.SandboxDomain
	if h, _, err := net.SplitHostPort(domain); err == nil {
		domain = h
	}
	refuseMetadata(v, "sandbox_domain", domain)
	if in.AgentdToken != nil {
		t := strings.TrimSpace(*in.AgentdToken)
		if len(t) < MinTokenLength {
			v.Add("agentd_token", "The agentd token must be at least %d characters.", MinTokenLength)
		}
		agentdToken = &t
	} else if creating {
		v.Add("agentd_token", "The agentd bearer token is required: Gatehouse injects it into every call to agentd.")
	}
	if in.APIKey != nil {
		k := strings.TrimSpace(*in.APIKey)
		apiKey = &k
	}
	return agentdToken, apiKey, v.Err()
}

// refuseMetadata adds a field error when host is a literal address that no
// environment may be dialled at (netguard.Metadata): the early, friendly
// form of the rule every call enforces on the address it dials, where a
// name that resolves there is refused too.
func refuseMetadata(v *apperr.ValidationError, field, host string) {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return
	}
	if r := netguard.Metadata(a); r != "" {
		v.Add(field, "The address %s is %s; no environment may point at a link-local or cloud metadata address.", host, r)
	}
}

// urlHost is the host of raw, a URL, without brackets or a trailing dot;
// "" when raw is not a URL.
func urlHost(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
}

// cleanWorkspaceRoot returns the workspace root, a POSIX or Windows
// absolute path, in clean form, or why it is refused (checkPath's
// refusals).
func cleanWorkspaceRoot(p string) (string, string) {
	const example = "The workspace root must be an absolute path, like /srv/work or C:\\work"
	elems, msg := checkPath(p, example, true)
	switch {
	case msg != "":
		return p, msg
	case strings.HasPrefix(p, "/"):
		return path.Clean(p), ""
	case windowsAbsRE.MatchString(p):
		// elems[0] is the drive ("C:").
		return p[:2] + `\` + strings.Join(elems[1:], `\`), ""
	}
	return p, example + "."
}

// create stores a new environment. owner makes it private to that user.
func (s *Service) create(ctx context.Context, in Input, owner *int64, createdBy string) (Environment, error) {
	now := s.now()
	e := Environment{DepartmentID: orgWide(in.DepartmentID), OwnerUserID: owner, HealthStatus: HealthUnknown, CreatedBy: createdBy, CreatedAt: now, UpdatedAt: now}
	tok, key, err := apply(&e, in, true, s.mountPrefix())
	if err = s.checkDepartment(ctx, e.DepartmentID, err); err != nil {
		return e, err
	}
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&e).Error; err != nil {
			return err
		}
		return s.sealSecrets(tx, &e, tok, key)
	})
	if err != nil {
		return e, translate(err)
	}
	return e, nil
}

// orgWide maps department 0 to none (the org), as Update does.
func orgWide(id *int64) *int64 {
	if id != nil && *id == 0 {
		return nil
	}
	return id
}

// checkDepartment adds a field error to verr (a validation error or nil)
// when dept names no department, so a bad id is the caller's mistake
// rather than a foreign-key failure.
func (s *Service) checkDepartment(ctx context.Context, dept *int64, verr error) error {
	if dept == nil {
		return verr
	}
	var n int64
	if err := s.DB.WithContext(ctx).Table("departments").Where("id = ?", *dept).Count(&n).Error; err != nil {
		return fmt.Errorf("read department: %w", err)
	}
	if n > 0 {
		return verr
	}
	v, ok := verr.(*apperr.ValidationError)
	if !ok {
		if verr != nil {
			return verr
		}
		v = apperr.Validation()
	}
	v.Add("department_id", "Department %d does not exist.", *dept)
	return v
}

func translate(err error) error {
	if store.IsUniqueViolation(err) {
		return &apperr.ValidationError{Fields: map[string]string{"name": "An environment with this name already exists."}}
	}
	return fmt.Errorf("save environment: %w", err)
}

func (s *Service) sealSecrets(tx *gorm.DB, e *Environment, tok, key *string) error {
	updates := map[string]any{}
	if tok != nil {
		st, err := s.Box.Seal([]byte(*tok), s.ad(e.ID, "agentd_token"))
		if err != nil {
			return err
		}
		e.SealedAgentdToken = st
		updates["sealed_agentd_token"] = st
	}
	if key != nil {
		sk := ""
		if *key != "" {
			var err error
			if sk, err = s.Box.Seal([]byte(*key), s.ad(e.ID, "api_key")); err != nil {
				return err
			}
		}
		e.SealedAPIKey = sk
		updates["sealed_api_key"] = sk
	}
	if len(updates) == 0 {
		return nil
	}
	return tx.Model(&Environment{}).Where("id = ?", e.ID).Updates(updates).Error
}

// load reads one environment, whoever asks; the exported readers check
// the actor first.
func (s *Service) load(ctx context.Context, id int64) (Environment, error) {
	return store.ByID[Environment](ctx, s.DB, id, "environment")
}

// listAll returns every environment ordered by name, whoever asks.
func (s *Service) listAll(ctx context.Context) ([]Environment, error) {
	var out []Environment
	if err := s.DB.WithContext(ctx).Order("name").Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	return out, nil
}

// update changes fields of before and returns the result.
func (s *Service) update(ctx context.Context, before Environment, in Input) (after Environment, err error) {
	id := before.ID
	after = before
	if in.DepartmentID != nil {
		after.DepartmentID = orgWide(in.DepartmentID)
	}
	tok, key, err := apply(&after, in, false, s.mountPrefix())
	if in.DepartmentID != nil {
		err = s.checkDepartment(ctx, after.DepartmentID, err)
	}
	if err != nil {
		return
	}
	if err = requireSecretsOnMove(before, after, tok, key); err != nil {
		return
	}
	if !sameDepartment(before.DepartmentID, after.DepartmentID) {
		// Agents were validated against the old owner; moving the machine
		// under them could hand it to people who may not use it.
		var n int64
		n, err = s.usage(ctx, id)
		if err != nil {
			return
		}
		if n > 0 {
			err = apperr.New(apperr.ErrConflict, "environment_in_use",
				"Environment %q is used by %d agent(s); remove it from them before moving it to another department.", before.Name, n)
			return
		}
	}
	after.UpdatedAt = s.now()
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Environment{}).Where("id = ?", id).Updates(map[string]any{
			"name": after.Name, "department_id": after.DepartmentID, "url": after.URL, "os": after.OS, "deployment": after.Deployment,
			"workspace_root": after.WorkspaceRoot, "sandbox_domain": after.SandboxDomain, "sandbox_scheme": after.SandboxScheme,
			"proxy_base_url": after.ProxyBaseURL, "workspace_mount": after.WorkspaceMount, "workspace_mount_path": after.WorkspaceMountPath,
			"updated_at": after.UpdatedAt,
		}).Error; err != nil {
			return err
		}
		return s.sealSecrets(tx, &after, tok, key)
	})
	if err != nil {
		err = translate(err)
	}
	return
}

// usage counts the agents that allow or default to an environment.
func (s *Service) usage(ctx context.Context, id int64) (int64, error) {
	var n, d int64
	if err := s.DB.WithContext(ctx).Table("agent_environments").Where("environment_id = ?", id).Count(&n).Error; err != nil {
		return 0, err
	}
	if err := s.DB.WithContext(ctx).Table("agents").Where("default_environment_id = ?", id).Count(&d).Error; err != nil {
		return 0, err
	}
	return max(n, d), nil
}

func sameDepartment(a, b *int64) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// requireSecretsOnMove refuses to keep a stored secret when the address it
// is sent to changes: whoever may edit an environment could otherwise point
// it at their own server and receive the token on the next probe.
func requireSecretsOnMove(before, after Environment, tok, key *string) error {
	v := apperr.Validation()
	moved := before.URL != after.URL || before.SandboxDomain != after.SandboxDomain ||
		before.ProxyBaseURL != after.ProxyBaseURL || before.SandboxScheme != after.SandboxScheme
	if !moved {
		return nil
	}
	if tok == nil && before.HasAgentdToken() {
		v.Add("agentd_token", "Re-enter the agentd token when changing the address: a stored token is never sent to a new address.")
	}
	if key == nil && before.HasAPIKey() && before.URL != after.URL {
		v.Add("api_key", "Re-enter the backend API key when changing the API URL: a stored key is never sent to a new address.")
	}
	return v.Err()
}

// remove deletes e unless an agent still uses it.
func (s *Service) remove(ctx context.Context, e Environment) (Environment, error) {
	id := e.ID
	n, err := s.usage(ctx, id)
	if err != nil {
		return e, err
	}
	if n > 0 {
		return e, apperr.New(apperr.ErrConflict, "environment_in_use", "Environment %q is used by %d agent(s); remove it from them first.", e.Name, n)
	}
	if err := s.DB.WithContext(ctx).Delete(&Environment{}, id).Error; err != nil {
		if strings.Contains(err.Error(), "FOREIGN KEY") || strings.Contains(err.Error(), "foreign key") {
			return e, apperr.New(apperr.ErrConflict, "environment_in_use", "Environment %q is still referenced by agents or templates in use.", e.Name)
		}
		return e, fmt.Errorf("delete environment: %w", err)
	}
	return e, nil
}

// AgentdToken opens the sealed agentd token.
func (s *Service) AgentdToken(e Environment) (string, error) {
	if e.SealedAgentdToken == "" {
		return "", apperr.New(apperr.ErrInvalid, "no_agentd_token", "Environment %q has no agentd token.", e.Name)
	}
	b, err := s.Box.Open(e.SealedAgentdToken, s.ad(e.ID, "agentd_token"))
	if err != nil {
		return "", fmt.Errorf("open agentd token of environment %d: %w", e.ID, err)
	}
	return string(b), nil
}

// Agentd returns a client for a host environment's agentd.
func (s *Service) Agentd(e Environment) (*agentd.Client, error) {
	return s.agentdOver(e, s.clientFor(e))
}

func (s *Service) agentdOver(e Environment, hc *http.Client) (*agentd.Client, error) {
	if e.Kind != KindHost {
		return nil, fmt.Errorf("environment %d is not a host", e.ID)
	}
	tok, err := s.AgentdToken(e)
	if err != nil {
		return nil, err
	}
	return agentd.NewClient(e.URL, tok, hc), nil
}

// Backend returns the sandbox backend client of a sandbox environment.
func (s *Service) Backend(e Environment) (sandbox.Backend, error) {
	return s.backendOver(e, s.clientFor(e))
}

func (s *Service) backendOver(e Environment, hc *http.Client) (sandbox.Backend, error) {
	if e.Kind != KindSandbox {
		return nil, fmt.Errorf("environment %d is not a sandbox backend", e.ID)
	}
	key := ""
	if e.SealedAPIKey != "" {
		b, err := s.Box.Open(e.SealedAPIKey, s.ad(e.ID, "api_key"))
		if err != nil {
			return nil, fmt.Errorf("open api key of environment %d: %w", e.ID, err)
		}
		key = string(b)
	}
	return e2b.New(e.URL, key, hc)
}

// Health is one check's outcome.
type Health struct {
	Status         string
	Error          string
	Latency        time.Duration
	Version        string
	ActiveSessions int
	// ExecReporting and ExecReportingReason: agentd's exec reporting
	// (hosts only; "" when agentd does not say).
	ExecReporting       string
	ExecReportingReason string
	// OwnMachine is set when the probe dialled an address netguard
	// reserves (loopback, link-local, metadata): see Shown.
	OwnMachine bool
	// answered is set once the other end proved to be agentd or a backend.
	answered bool
}

// RecordHealth stores a check result and reports the previous status when
// it changed ("" when it did not).
func (s *Service) RecordHealth(ctx context.Context, id int64, h Health) (prev string, err error) {
	e, err := s.load(ctx, id)
	if err != nil {
		return "", err
	}
	now := s.now()
	updates := map[string]any{"health_status": h.Status, "health_error": clip.String(h.Error, 500), "health_checked_at": now,
		"health_latency_ms": int(h.Latency / time.Millisecond), "agentd_version": h.Version, "active_sessions": h.ActiveSessions,
		"exec_reporting": h.ExecReporting, "exec_reporting_reason": clip.String(h.ExecReportingReason, 500)}
	if e.HealthStatus != h.Status {
		updates["health_changed_at"] = now
		prev = e.HealthStatus
	}
	if err := s.DB.WithContext(ctx).Model(&Environment{}).Where("id = ?", id).Updates(updates).Error; err != nil {
		return "", fmt.Errorf("record health: %w", err)
	}
	return prev, nil
}
