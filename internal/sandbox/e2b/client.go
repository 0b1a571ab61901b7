// Package e2b is a client for E2B's sandbox REST API, which CubeSandbox also
// speaks, so one client serves both. It implements sandbox.Backend.
package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// maxPages bounds List's paging so a server that hands out fresh tokens
// forever cannot loop the client.
const maxPages = 1000

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// ConnectMode chooses how Connect resumes a sandbox.
type ConnectMode int

const (
	// ConnectAuto uses POST /sandboxes/{id}/connect and falls back to POST
	// /sandboxes/{id}/resume when the server shows it has no connect route
	// (a 404/405 whose body is not an E2B error; an unknown sandbox's 404
	// carries {"code":404,...}). The finding is remembered per client.
	ConnectAuto ConnectMode = iota
	// ConnectOnly never falls back.
	ConnectOnly
	// ResumeOnly always uses /resume, for servers known to predate connect
	// whose unknown-route 404 looks like an E2B error.
	ResumeOnly
)

// Option configures a Client.
type Option func(*Client)

// WithConnectMode sets how Connect resumes sandboxes.
func WithConnectMode(m ConnectMode) Option { return func(c *Client) { c.connectMode = m } }

// WithUserAgent sets the User-Agent sent on every call.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// Client talks to one E2B-compatible backend. It is safe for concurrent use.
type Client struct {
	base        *url.URL
	apiKey      string
	hc          *http.Client
	connectMode ConnectMode
	userAgent   string
	// noConnect is set once the server showed it lacks the connect route.
	noConnect atomic.Bool
}

var _ sandbox.Backend = (*Client)(nil)

// New returns a client for the API at baseURL (e.g. https://api.e2b.app or
// http://cube-api:3000). hc nil means http.DefaultClient; callers should pass
// one with a timeout suited to their deployment.
func New(baseURL, apiKey string, hc *http.Client, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("e2b: parse base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("e2b: base URL %q: scheme must be http or https", baseURL)
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	c := &Client{base: u, apiKey: apiKey, hc: hc, userAgent: "gatehouse"}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Create starts a sandbox from a template (POST /sandboxes; the v1 path is
// served by every E2B-compatible backend, CubeSandbox included).
func (c *Client) Create(ctx context.Context, req sandbox.NewSandbox) (sandbox.Sandbox, error) {
	if req.TemplateID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("e2b: create: %w: template id is required", sandbox.ErrBadRequest)
	}
	body := newSandboxJSON{
		TemplateID: req.TemplateID,
		AutoPause:  req.AutoPause,
		Metadata:   req.Metadata,
		EnvVars:    req.EnvVars,
	}
	if req.Timeout != 0 {
		t := seconds(req.Timeout)
		body.Timeout = &t
	}
	if req.AutoResume {
		body.AutoResume = &autoResumeJSON{Enabled: true}
	}
	if req.AllowPublicTraffic != nil {
		body.Network = &networkJSON{AllowPublicTraffic: req.AllowPublicTraffic}
	}
	if req.AutoPause || req.AutoResume {
		lc := &lifecycleJSON{OnTimeout: string(sandbox.OnTimeoutKill), AutoResume: req.AutoResume}
		if req.AutoPause {
			lc.OnTimeout = string(sandbox.OnTimeoutPause)
		}
		body.Lifecycle = lc
	}
	var out sandboxJSON
	if _, err := c.do(ctx, "POST /sandboxes", http.MethodPost, "/sandboxes", nil, body, &out, http.StatusCreated, http.StatusOK); err != nil {
		return sandbox.Sandbox{}, err
	}
	return out.domain(false), nil
}

// List returns every sandbox matching f, following X-Next-Token. Servers that
// ignore nextToken (CubeSandbox) answer the same page again; List stops when
// a page brings nothing new, when the token is empty, or when it repeats.
func (c *Client) List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Info, error) {
	q := url.Values{}
	if len(f.Metadata) > 0 {
		md := url.Values{}
		for k, v := range f.Metadata {
			md.Set(k, v)
		}
		// The API takes the pairs as one urlencoded query string, which is
		// then encoded again as the parameter's value.
		q.Set("metadata", md.Encode())
	}
	if len(f.States) > 0 {
		s := make([]string, len(f.States))
		for i, st := range f.States {
			s[i] = string(st)
		}
		q.Set("state", strings.Join(s, ","))
	}
	if f.PageSize > 0 {
		q.Set("limit", strconv.Itoa(f.PageSize))
	}

	var out []sandbox.Info
	seen := map[string]bool{}
	tokens := map[string]bool{}
	for page := 0; page < maxPages; page++ {
		var items []listedSandboxJSON
		h, err := c.do(ctx, "GET /v2/sandboxes", http.MethodGet, "/v2/sandboxes", q, nil, &items, http.StatusOK)
		if err != nil {
			return nil, err
		}
		fresh := 0
		for _, it := range items {
			if seen[it.SandboxID] {
				continue
			}
			seen[it.SandboxID] = true
			fresh++
			out = append(out, it.domain())
		}
		next := h.header.Get("X-Next-Token")
		if next == "" || tokens[next] || fresh == 0 {
			return out, nil
		}
		tokens[next] = true
		q.Set("nextToken", next)
	}
	return out, nil
}

// Get returns one sandbox's detail (GET /sandboxes/{id}).
func (c *Client) Get(ctx context.Context, id string) (sandbox.Info, error) {
	var out listedSandboxJSON
	if _, err := c.do(ctx, "GET /sandboxes/{id}", http.MethodGet, sandboxPath(id, ""), nil, nil, &out, http.StatusOK); err != nil {
		return sandbox.Info{}, err
	}
	return out.domain(), nil
}

// Kill destroys a sandbox (DELETE /sandboxes/{id}).
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.do(ctx, "DELETE /sandboxes/{id}", http.MethodDelete, sandboxPath(id, ""), nil, nil, nil, http.StatusNoContent, http.StatusOK)
	return err
}

// Pause snapshots a running sandbox. Pausing a paused sandbox answers
// ErrConflict.
func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := c.do(ctx, "POST /sandboxes/{id}/pause", http.MethodPost, sandboxPath(id, "/pause"), nil, nil, nil, http.StatusNoContent, http.StatusOK)
	return err
}

// SetTimeout makes the sandbox expire timeout from now (POST
// /sandboxes/{id}/timeout). sandbox.NoTimeout sends -1 (CubeSandbox only).
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	_, err := c.do(ctx, "POST /sandboxes/{id}/timeout", http.MethodPost, sandboxPath(id, "/timeout"), nil,
		timeoutJSON{Timeout: seconds(timeout)}, nil, http.StatusNoContent, http.StatusOK)
	return err
}

// Connect resumes a paused sandbox or confirms a running one, setting its
// timeout. See ConnectMode for how servers without the connect route are
// handled.
func (c *Client) Connect(ctx context.Context, id string, timeout time.Duration) (sandbox.Sandbox, error) {
	body := timeoutJSON{Timeout: seconds(timeout)}
	if c.connectMode == ResumeOnly || (c.connectMode == ConnectAuto && c.noConnect.Load()) {
		return c.resume(ctx, id, timeout)
	}
	var out sandboxJSON
	h, err := c.do(ctx, "POST /sandboxes/{id}/connect", http.MethodPost, sandboxPath(id, "/connect"), nil, body, &out, http.StatusOK, http.StatusCreated)
	if err != nil {
		var rm *routeMissingError
		if c.connectMode == ConnectAuto && errors.As(err, &rm) {
			c.noConnect.Store(true)
			return c.resume(ctx, id, timeout)
		}
		return sandbox.Sandbox{}, err
	}
	return out.domain(h.status == http.StatusCreated), nil
}

// resume is connect for servers that predate it. /resume answers 409 for a
// running sandbox; that is success for Connect, so the timeout is set and
// the sandbox is described from its detail.
func (c *Client) resume(ctx context.Context, id string, timeout time.Duration) (sandbox.Sandbox, error) {
	var out sandboxJSON
	_, err := c.do(ctx, "POST /sandboxes/{id}/resume", http.MethodPost, sandboxPath(id, "/resume"), nil,
		timeoutJSON{Timeout: seconds(timeout)}, &out, http.StatusCreated, http.StatusOK)
	if err == nil {
		return out.domain(true), nil
	}
	if !errors.Is(err, sandbox.ErrConflict) {
		return sandbox.Sandbox{}, err
	}
	if err := c.SetTimeout(ctx, id, timeout); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("e2b: connect via resume: %w", err)
	}
	info, err := c.Get(ctx, id)
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("e2b: connect via resume: %w", err)
	}
	return sandbox.Sandbox{
		ID:          info.ID,
		TemplateID:  info.TemplateID,
		Alias:       info.Alias,
		ClientID:    info.ClientID,
		EnvdVersion: info.EnvdVersion,
		Domain:      info.Domain,
	}, nil
}

// ListTemplates returns the templates the key can use (GET /templates).
func (c *Client) ListTemplates(ctx context.Context) ([]sandbox.Template, error) {
	var items []templateJSON
	if _, err := c.do(ctx, "GET /templates", http.MethodGet, "/templates", nil, nil, &items, http.StatusOK); err != nil {
		return nil, err
	}
	out := make([]sandbox.Template, len(items))
	for i, t := range items {
		out[i] = t.domain()
	}
	return out, nil
}

// GetTemplate returns one template (GET /templates/{id}).
func (c *Client) GetTemplate(ctx context.Context, id string) (sandbox.Template, error) {
	var t templateJSON
	if _, err := c.do(ctx, "GET /templates/{id}", http.MethodGet, "/templates/"+url.PathEscape(id), nil, nil, &t, http.StatusOK); err != nil {
		return sandbox.Template{}, err
	}
	if t.TemplateID == "" {
		t.TemplateID = id
	}
	return t.domain(), nil
}

// Health checks that the backend answers and the key works. GET /health is
// unauthenticated on CubeSandbox; E2B has no such route, so a 404 there falls
// back to an authenticated GET /templates, which also proves the key.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.do(ctx, "GET /health", http.MethodGet, "/health", nil, nil, nil, http.StatusOK)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sandbox.ErrNotFound) {
		return err
	}
	_, err = c.do(ctx, "GET /templates", http.MethodGet, "/templates", nil, nil, nil, http.StatusOK)
	return err
}

// routeMissingError marks a 404/405 that came from the server's router rather
// than from the API (no E2B error body).
type routeMissingError struct{ *sandbox.APIError }

func (e *routeMissingError) Unwrap() error { return e.APIError }

// answer is what do reports of a successful call.
type answer struct {
	status int
	header http.Header
}

// do sends one call and decodes a JSON answer into out (when non-nil and the
// body is non-empty). op names the route for errors.
func (c *Client) do(ctx context.Context, op, method, path string, q url.Values, in, out any, ok ...int) (answer, error) {
	// path is already escaped (sandboxPath), so the URL is built as text.
	target := c.base.String() + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return answer{}, fmt.Errorf("e2b: %s: encode request: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return answer{}, fmt.Errorf("e2b: %s: %w", op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.apiKey != "" {
		req.Header.Set("X-API-Key", c.apiKey)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return answer{}, fmt.Errorf("e2b: %s: %w", op, ctx.Err())
		}
		return answer{}, fmt.Errorf("e2b: %s: %w: %w", op, sandbox.ErrUnavailable, err)
	}
	defer resp.Body.Close()

	for _, s := range ok {
		if resp.StatusCode != s {
			continue
		}
		h := answer{status: resp.StatusCode, header: resp.Header}
		if out == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
			return h, nil
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return answer{}, fmt.Errorf("e2b: %s: read answer: %w", op, err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return h, nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return answer{}, fmt.Errorf("e2b: %s: decode answer: %w", op, err)
		}
		return h, nil
	}
	return answer{}, parseError(op, resp)
}

func parseError(op string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &sandbox.APIError{Status: resp.StatusCode, Code: resp.StatusCode, Op: "e2b: " + op}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		if s, err := strconv.Atoi(ra); err == nil && s >= 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	}
	var ej errorJSON
	isAPI := json.Unmarshal(b, &ej) == nil && ej.Code != nil
	if isAPI {
		e.Code, e.Message, e.ErrorCode = *ej.Code, ej.Message, ej.ErrorCode
	} else if ej.Message != "" {
		e.Message = ej.Message
	} else {
		// Not the API's error shape: do not repeat whatever the server
		// sent, so a backend URL cannot be used to read arbitrary pages.
		e.Message = "the server did not answer like an E2B-compatible API"
	}
	if !isAPI && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed) {
		return &routeMissingError{e}
	}
	return e
}

func sandboxPath(id, suffix string) string {
	return "/sandboxes/" + url.PathEscape(id) + suffix
}

// AgentdURL is the base URL of a port inside a sandbox. With pathProxyBase
// set it is path-based, <pathProxyBase>/sandbox/<id>/<port>, for deployments
// without wildcard DNS; otherwise host-based, <scheme>://<port>-<id>.<domain>
// (scheme defaults to https).
func AgentdURL(sandboxID, domain, scheme, pathProxyBase string, port int) string {
	if pathProxyBase != "" {
		return strings.TrimRight(pathProxyBase, "/") + "/sandbox/" + url.PathEscape(sandboxID) + "/" + strconv.Itoa(port)
	}
	if scheme == "" {
		scheme = "https"
	}
	return scheme + "://" + strconv.Itoa(port) + "-" + sandboxID + "." + domain
}
