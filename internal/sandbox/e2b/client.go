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
	"net"
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

// maxBody bounds a successful answer (a page of 100 sandboxes with metadata
// is well under 1 MiB).
const maxBody = 16 << 20

// ConnectMode chooses how Connect resumes a sandbox.
type ConnectMode int

const (
	// ConnectAuto uses POST /sandboxes/{id}/connect and falls back to POST
	// /sandboxes/{id}/resume when the server shows it has no connect route
	// (connect answers 404 or 405 for a sandbox whose detail exists). The
	// finding is remembered per client.
	ConnectAuto ConnectMode = iota
	// ConnectOnly never falls back.
	ConnectOnly
	// ResumeOnly always uses /resume, for servers known to predate
	// connect (it saves ConnectAuto's probing call).
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
// http://cube-api:3000). hc nil means a plain http.Client; callers should
// bound calls with their context or pass a client with a timeout. The
// client never follows redirects, whatever hc says: the API key travels in
// X-API-Key, which Go's redirect handling would forward to any host.
func New(baseURL, apiKey string, hc *http.Client, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("e2b: parse base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("e2b: base URL %q: must be an http or https URL with a host", baseURL)
	}
	own := &http.Client{}
	if hc != nil {
		*own = *hc
	}
	own.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c := &Client{base: u, apiKey: apiKey, hc: own, userAgent: "gatehouse"}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Create starts a sandbox from a template (POST /sandboxes; the v1 path is
// served by every E2B-compatible backend, CubeSandbox included).
func (c *Client) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	if req.TemplateID == "" {
		return sandbox.Sandbox{}, sandbox.NotSent(fmt.Errorf("e2b: create: %w: template id is required", sandbox.ErrBadRequest))
	}
	if req.TimeoutSeconds < sandbox.NoTimeoutSeconds || req.TimeoutSeconds > 1<<31-1 {
		return sandbox.Sandbox{}, sandbox.NotSent(fmt.Errorf("e2b: create: %w: timeout %d s is out of range", sandbox.ErrBadRequest, req.TimeoutSeconds))
	}
	private := req.AllowPublicTraffic != nil && !*req.AllowPublicTraffic
	body := newSandboxJSON{
		TemplateID: req.TemplateID,
		AutoPause:  req.AutoPause,
		Metadata:   req.Metadata,
		EnvVars:    req.EnvVars,
		// E2B refuses a private sandbox that is not secure.
		Secure: req.Secure || private,
	}
	if req.TimeoutSeconds != 0 {
		t := int32(req.TimeoutSeconds)
		body.Timeout = &t
	}
	if req.AutoResume {
		body.AutoResume = &autoResumeJSON{Enabled: true}
	}
	if req.AllowPublicTraffic != nil {
		body.Network = &networkJSON{AllowPublicTraffic: req.AllowPublicTraffic}
	}
	if e := req.Egress; e != nil {
		if body.Network == nil {
			body.Network = &networkJSON{}
		}
		body.Network.AllowOut, body.Network.DenyOut = e.AllowOut, e.DenyOut
		allow := e.AllowInternetAccess
		body.AllowInternetAccess = &allow
	}
	if req.AutoPause || req.AutoResume {
		lc := &lifecycleJSON{OnTimeout: string(sandbox.OnTimeoutKill), AutoResume: req.AutoResume}
		if req.AutoPause {
			lc.OnTimeout = string(sandbox.OnTimeoutPause)
		}
		body.Lifecycle = lc
	}
	const op = "POST /sandboxes"
	var out sandboxJSON
	if _, err := c.do(ctx, op, http.MethodPost, "/sandboxes", "", body, &out, http.StatusCreated, http.StatusOK); err != nil {
		return sandbox.Sandbox{}, err
	}
	if err := out.check(op); err != nil {
		return sandbox.Sandbox{}, err
	}
	return out.domain(false), nil
}

// List returns every sandbox matching f from GET /v2/sandboxes, following
// X-Next-Token. CubeSandbox ignores nextToken and answers the first page
// again; List stops at a repeated token or a page that brings nothing new,
// so it ends with what the backend can list instead of looping.
func (c *Client) List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Info, error) {
	var q query
	if len(f.Metadata) > 0 {
		q.add("metadata", metadataFilter(f.Metadata))
	}
	if len(f.States) > 0 {
		s := make([]string, len(f.States))
		for i, st := range f.States {
			s[i] = string(st)
		}
		q.addList("state", s)
	}
	if f.Template != "" {
		q.add("template", f.Template)
	}
	if !f.StartedAfter.IsZero() {
		q.add("startedAfter", f.StartedAfter.UTC().Format(time.RFC3339Nano))
	}
	if f.PageSize > 0 {
		q.add("limit", strconv.Itoa(f.PageSize))
	}

	var out []sandbox.Info
	seen := map[string]bool{}
	tokens := map[string]bool{}
	next := ""
	for page := 0; page < maxPages; page++ {
		pq := q
		if next != "" {
			pq = append(append(query(nil), q...), "nextToken="+encodeURIComponent(next))
		}
		var items []listedSandboxJSON
		h, err := c.do(ctx, "GET /v2/sandboxes", http.MethodGet, "/v2/sandboxes", pq.String(), nil, &items, http.StatusOK)
		if err != nil {
			return nil, err
		}
		fresh := 0
		for _, it := range items {
			if it.SandboxID == "" {
				return nil, fmt.Errorf("e2b: GET /v2/sandboxes: %w: a listed sandbox has no sandboxID", sandbox.ErrMalformed)
			}
			if seen[it.SandboxID] {
				continue
			}
			seen[it.SandboxID] = true
			fresh++
			out = append(out, it.domain())
		}
		next = h.header.Get("X-Next-Token")
		if next == "" || tokens[next] || fresh == 0 {
			return out, nil
		}
		tokens[next] = true
	}
	return out, nil
}

// Get returns one sandbox's detail (GET /sandboxes/{id}).
func (c *Client) Get(ctx context.Context, id string) (sandbox.Info, error) {
	const op = "GET /sandboxes/{id}"
	var out listedSandboxJSON
	if _, err := c.do(ctx, op, http.MethodGet, sandboxPath(id, ""), "", nil, &out, http.StatusOK); err != nil {
		return sandbox.Info{}, err
	}
	if out.SandboxID == "" {
		return sandbox.Info{}, fmt.Errorf("e2b: %s: %w: no sandboxID", op, sandbox.ErrMalformed)
	}
	return out.domain(), nil
}

// Kill destroys a sandbox (DELETE /sandboxes/{id}); ErrNotFound when it does
// not exist.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.do(ctx, "DELETE /sandboxes/{id}", http.MethodDelete, sandboxPath(id, ""), "", nil, nil, http.StatusNoContent, http.StatusOK)
	return err
}

// Pause snapshots a running sandbox. Pausing a paused sandbox answers
// ErrAlreadyPaused (which also matches ErrConflict).
func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := c.do(ctx, "POST /sandboxes/{id}/pause", http.MethodPost, sandboxPath(id, "/pause"), "", nil, nil, http.StatusNoContent, http.StatusOK)
	if errors.Is(err, sandbox.ErrConflict) {
		return fmt.Errorf("%w: %w", sandbox.ErrAlreadyPaused, err)
	}
	return err
}

// SetTimeout makes the sandbox expire timeout from now (POST
// /sandboxes/{id}/timeout). sandbox.NoTimeout sends -1 (CubeSandbox only).
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	_, err := c.do(ctx, "POST /sandboxes/{id}/timeout", http.MethodPost, sandboxPath(id, "/timeout"), "",
		timeoutJSON{Timeout: seconds(timeout)}, nil, http.StatusNoContent, http.StatusOK)
	return err
}

// Connect resumes a paused sandbox or confirms a running one, setting its
// timeout. The answer's Resumed is true on 201 (resumed) and false on 200
// (was running, or CubeSandbox, which always answers 200). See ConnectMode
// for servers without the connect route.
func (c *Client) Connect(ctx context.Context, id string, timeout time.Duration) (sandbox.Sandbox, error) {
	if c.connectMode == ResumeOnly || (c.connectMode == ConnectAuto && c.noConnect.Load()) {
		return c.resume(ctx, id, timeout)
	}
	const op = "POST /sandboxes/{id}/connect"
	var out sandboxJSON
	h, err := c.do(ctx, op, http.MethodPost, sandboxPath(id, "/connect"), "", timeoutJSON{Timeout: seconds(timeout)}, &out, http.StatusOK, http.StatusCreated)
	if err != nil {
		if c.connectMode == ConnectAuto && routeMaybeMissing(err) {
			// An unknown sandbox and a server without the route both
			// answer 404 (and both may use the JSON error shape); the
			// detail call tells them apart.
			if _, gerr := c.Get(ctx, id); gerr == nil {
				c.noConnect.Store(true)
				return c.resume(ctx, id, timeout)
			}
		}
		return sandbox.Sandbox{}, err
	}
	if err := out.check(op); err != nil {
		return sandbox.Sandbox{}, err
	}
	return out.domain(h.status == http.StatusCreated), nil
}

// resume is connect for servers that predate it. /resume answers 409 for a
// running sandbox; that is success for Connect, so the timeout is set and
// the sandbox is described from its detail.
func (c *Client) resume(ctx context.Context, id string, timeout time.Duration) (sandbox.Sandbox, error) {
	const op = "POST /sandboxes/{id}/resume"
	var out sandboxJSON
	_, err := c.do(ctx, op, http.MethodPost, sandboxPath(id, "/resume"), "",
		timeoutJSON{Timeout: seconds(timeout)}, &out, http.StatusCreated, http.StatusOK)
	if err == nil {
		if err := out.check(op); err != nil {
			return sandbox.Sandbox{}, err
		}
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
	if _, err := c.do(ctx, "GET /templates", http.MethodGet, "/templates", "", nil, &items, http.StatusOK); err != nil {
		return nil, err
	}
	out := make([]sandbox.Template, len(items))
	for i, t := range items {
		out[i] = t.domain()
	}
	return out, nil
}

// GetTemplate returns one template (GET /templates/{id}); E2B answers the
// template-with-builds shape, whose newest build gives sizes and status.
func (c *Client) GetTemplate(ctx context.Context, id string) (sandbox.Template, error) {
	var t templateJSON
	if _, err := c.do(ctx, "GET /templates/{id}", http.MethodGet, "/templates/"+url.PathEscape(id), "", nil, &t, http.StatusOK); err != nil {
		return sandbox.Template{}, err
	}
	if t.TemplateID == "" {
		t.TemplateID = id
	}
	return t.domain(), nil
}

// Health checks that the backend answers and that it accepts the key. GET
// /health needs no key (E2B answers 204, CubeSandbox 200, some servers have
// no such route), so it proves only reachability; an authenticated GET
// /templates follows, and a refused key is reported as such.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.do(ctx, "GET /health", http.MethodGet, "/health", "", nil, nil, http.StatusOK, http.StatusNoContent)
	if err != nil && !routeMaybeMissing(err) {
		return err
	}
	_, err = c.do(ctx, "GET /templates", http.MethodGet, "/templates", "", nil, nil, http.StatusOK)
	if errors.Is(err, sandbox.ErrUnauthorized) {
		return fmt.Errorf("e2b: health: the backend answers but refuses the API key: %w", err)
	}
	return err
}

// routeMaybeMissing reports a 404 or 405, which a server without the route
// answers too.
func routeMaybeMissing(err error) bool {
	var ae *sandbox.APIError
	return errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed)
}

// answer is what do reports of a successful call.
type answer struct {
	status int
	header http.Header
}

// do sends one call and decodes a JSON answer into out (when non-nil). op
// names the route for errors; path is already escaped and rawQuery already
// encoded.
func (c *Client) do(ctx context.Context, op, method, path, rawQuery string, in, out any, ok ...int) (answer, error) {
	target := c.base.String() + path
	if rawQuery != "" {
		target += "?" + rawQuery
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return answer{}, sandbox.NotSent(fmt.Errorf("e2b: %s: encode request: %w", op, err))
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return answer{}, sandbox.NotSent(fmt.Errorf("e2b: %s: %w", op, err))
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
		return answer{}, transportError(ctx, op, err)
	}
	defer resp.Body.Close()

	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return answer{}, redirectError(op, resp)
	}
	for _, s := range ok {
		if resp.StatusCode != s {
			continue
		}
		h := answer{status: resp.StatusCode, header: resp.Header}
		if out == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
			return h, nil
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err != nil {
			return answer{}, transportError(ctx, op+": read answer", err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			return answer{}, fmt.Errorf("e2b: %s: %w: status %d with a body that is not the API's JSON: %v", op, sandbox.ErrMalformed, resp.StatusCode, err)
		}
		return h, nil
	}
	return answer{}, parseError(op, resp)
}

// transportError classifies a failed exchange: no answer in time (the
// caller's deadline or the HTTP client's timeout), the caller giving up, or
// a backend that cannot be reached.
func transportError(ctx context.Context, op string, err error) error {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("e2b: %s: %w (the call may still have taken effect): %w", op, sandbox.ErrTimeout, ctx.Err())
	case ctx.Err() != nil:
		return fmt.Errorf("e2b: %s: %w", op, ctx.Err())
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("e2b: %s: %w (the call may still have taken effect): %w", op, sandbox.ErrTimeout, err)
	}
	return fmt.Errorf("e2b: %s: %w: %w", op, sandbox.ErrUnavailable, err)
}

// redirectError reports a 3xx: the client follows none, so that the API key
// never reaches another address; the message says where it pointed so the
// admin can correct the base URL.
func redirectError(op string, resp *http.Response) error {
	where := resp.Header.Get("Location")
	if where == "" {
		where = "(no Location header)"
	} else if u, err := resp.Request.URL.Parse(where); err == nil {
		u.User = nil
		where = u.Redacted()
	}
	return fmt.Errorf("e2b: %s: %w with %d to %s; redirects are not followed, so the API key is never sent elsewhere: set the environment's URL to the API itself",
		op, sandbox.ErrRedirect, resp.StatusCode, where)
}

func parseError(op string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &sandbox.APIError{Status: resp.StatusCode, Code: resp.StatusCode, Op: "e2b: " + op}
	if ra := strings.TrimSpace(resp.Header.Get("Retry-After")); ra != "" {
		if s, err := strconv.Atoi(ra); err == nil && s >= 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		} else if t, err := http.ParseTime(ra); err == nil {
			e.RetryAfter = max(time.Until(t), 0)
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
	return e
}

func sandboxPath(id, suffix string) string {
	return "/sandboxes/" + url.PathEscape(id) + suffix
}
