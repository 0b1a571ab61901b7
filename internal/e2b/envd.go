package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/filesystem/filesystemconnect"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/process/processconnect"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Port is envd's port: the SDK addresses a sandbox's envd as
// 49983-<sandboxID>.<domain>.
const Port = "49983"

// HostPrefix starts the Host of every data-plane request addressed by
// host name.
const HostPrefix = Port + "-"

// PortHeader names the sandbox's port on the shared URL; only envd's is
// served.
const PortHeader = "E2b-Sandbox-Port"

// SandboxHeader names the sandbox when the SDK uses one shared data-plane
// URL (E2B_SANDBOX_URL).
const SandboxHeader = "E2b-Sandbox-Id"

// Binding is what a sandbox id and its access token resolve to: the
// session the sandbox is, in its org, and the principal acting in it.
type Binding struct {
	Org       gateway.Org
	Actor     *authz.Actor
	SessionID int64
	// User is the run-as user the SDK asked for; the gateway runs every
	// command as agentd's user, so it is not acted on.
	User string
	// Release returns the org's database handle once the request is done
	// with Org (nil: nothing to return).
	Release func()
	// Recheck repeats the resolver's checks (token, key, access) for a
	// request that goes on after its first operation: each further poll
	// of a stream, each streamed input, each further uploaded file. An
	// error ends the request. nil: nothing to recheck.
	Recheck func(ctx context.Context) error
}

// Resolver finds the sandbox a request names and checks its access token.
// Every refusal is one error, so none tells whether another request would
// have passed: Service answers apperr.ErrUnauthorized (401
// invalid_access_token) for an unknown sandbox, another org's, a missing or
// wrong token and a revoked key alike; NoSandboxes, which knows none,
// answers apperr.ErrNotFound.
type Resolver interface {
	ResolveSandbox(ctx context.Context, sandboxID, accessToken string) (Binding, error)
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, sandboxID, accessToken string) (Binding, error)

// ResolveSandbox calls f.
func (f ResolverFunc) ResolveSandbox(ctx context.Context, sandboxID, accessToken string) (Binding, error) {
	return f(ctx, sandboxID, accessToken)
}

// Gateway is what the data plane needs of the audited terminal gateway.
type Gateway interface {
	Exec(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID int64, req gateway.ExecRequest) (gateway.Output, error)
	Poll(ctx context.Context, org gateway.Org, a *authz.Actor, sessionID, commandID int64, cursor uint64, waitMS int64) (gateway.Output, error)
	Stdin(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64, data []byte, eof bool) error
	Resize(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64, rows, cols uint16) error
	Kill(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64) (gateway.Output, error)
	Commands(ctx context.Context, org gateway.Org, a *authz.Actor, f recordings.Filter) ([]recordings.Command, error)
	WriteFile(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID int64, req gateway.WriteRequest) (*agentd.WriteResponse, error)
	ReadFile(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID int64, p string, offset, limit int64) (*agentd.FileRange, error)
	Stat(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID int64, paths []string) ([]agentd.FileStat, error)
}

// Server serves envd's API for every sandbox of every org.
type Server struct {
	Gateway  Gateway
	Resolver Resolver
	// TrustProxy takes the caller's address from X-Forwarded-For (the
	// console runs behind a proxy that sets it).
	TrustProxy bool
	Logger     *slog.Logger
	// MaxStreams caps the streams (Start, Connect, StreamInput) open at
	// once on one sandbox; 0 is DefaultMaxStreams. Running commands are
	// capped by the gateway, but any number of Connect streams could
	// follow one command, each a goroutine polling agentd.
	MaxStreams int

	mu      sync.Mutex
	streams map[streamKey]int
}

// DefaultMaxStreams is the cap on a sandbox's open streams: well above
// what an SDK runtime keeps open (a stream per running command).
const DefaultMaxStreams = 100

// streamKey names a sandbox across orgs: session ids are per org.
type streamKey struct {
	org     string
	session int64
}

// holdStream counts a stream open on c's sandbox, refusing one past the
// cap (resource_exhausted); call the answer when the stream ends.
func (s *Server) holdStream(c call) (func(), error) {
	limit := s.MaxStreams
	if limit <= 0 {
		limit = DefaultMaxStreams
	}
	k := streamKey{org: c.Org.Slug, session: c.SessionID}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams[k] >= limit {
		return nil, apperr.New(apperr.ErrTooMany, "too_many_streams",
			"This sandbox has %d streams open, the most it may; end one (or let a command finish) first.", limit)
	}
	if s.streams == nil {
		s.streams = map[streamKey]int{}
	}
	s.streams[k]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.streams[k]--; s.streams[k] <= 0 {
			delete(s.streams, k)
		}
	}, nil
}

// maxMessage bounds one RPC message (the largest is a SendInput's bytes),
// as agentd bounds a stdin write.
const maxMessage = 8 << 20

type bindingKey struct{}

// call is one data-plane request as the gateway sees it.
type call struct {
	Binding
	meta gateway.Meta
}

// recheck is checked on every operation after a request's first: a key
// revoked (or an owner's access lost) while a stream is open ends it.
func (c call) recheck(ctx context.Context) error {
	if c.Recheck == nil {
		return nil
	}
	return c.Recheck(ctx)
}

func callOf(ctx context.Context) call {
	c, _ := ctx.Value(bindingKey{}).(call)
	return c
}

// Handler is envd's API. Every request is resolved to its sandbox's
// binding first; one that names no sandbox, an unknown one or carries a
// wrong token gets no further.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithInterceptors(flushDenials{s: s}), connect.WithReadMaxBytes(maxMessage)}
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.Handle("GET /files", http.HandlerFunc(s.readFile))
	mux.Handle("POST /files", http.HandlerFunc(s.writeFile))
	mux.Handle("GET /health", http.HandlerFunc(s.health))
	// Anything else is not envd's: answered in envd's error shape, so a
	// request that named a sandbox never falls through to anything else.
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, apperr.New(apperr.ErrNotFound, "not_served", "envd's API has no %s %s.", r.Method, r.URL.Path))
	}))
	return s.resolve(checkEnvelopes(mux))
}

// SandboxID is the sandbox a request names: by Host (49983-<id>.<domain>)
// or, on the shared data-plane URL, by the E2b-Sandbox-Id header. The
// Host wins: it is what the SDK's per-sandbox URL carries.
func SandboxID(r *http.Request) string {
	if id, ok := HostSandbox(r.Host); ok {
		return id
	}
	return strings.TrimSpace(r.Header.Get(SandboxHeader))
}

// HostSandbox reads the sandbox id of a data-plane Host, 49983-<id>.<domain>.
func HostSandbox(host string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	rest, ok := strings.CutPrefix(strings.ToLower(host), HostPrefix)
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, ".")
	if !ok || id == "" {
		return "", false
	}
	return id, true
}

// runAsUser reads the SDK's run-as user from Authorization: Basic
// base64("<user>:").
func runAsUser(r *http.Request) string {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user
}

func (s *Server) resolve(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := SandboxID(r)
		if r.URL.Path == "/health" && id == "" {
			// The data plane's own health (a load balancer's probe).
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if id == "" {
			writeError(w, r, apperr.New(apperr.ErrNotFound, "sandbox_not_found",
				"Name the sandbox: address it as %s<sandboxID>.<domain> or send the %s header.", HostPrefix, SandboxHeader))
			return
		}
		if _, byHost := HostSandbox(r.Host); !byHost {
			if p := r.Header.Get(PortHeader); p != "" && p != Port {
				writeError(w, r, apperr.New(apperr.ErrNotFound, "port_not_served",
					"Only envd's port (%s) of a sandbox is served here, not %s.", Port, p))
				return
			}
		}
		b, err := s.Resolver.ResolveSandbox(r.Context(), id, r.Header.Get("X-Access-Token"))
		if err != nil && r.URL.Path == "/health" && (errors.Is(err, apperr.ErrUnauthorized) || errors.Is(err, apperr.ErrNotFound)) {
			// A killed sandbox resolves no more: its health is E2B's
			// answer for a sandbox that is gone. Every refusal answers
			// so, which tells a caller nothing a wrong token did not.
			notRunning(w)
			return
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if b.Release != nil {
			defer b.Release()
		}
		if u := runAsUser(r); u != "" {
			b.User = u
		}
		c := call{Binding: b, meta: gateway.Meta{SourceIP: s.sourceIP(r), UserAgent: r.UserAgent()}}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bindingKey{}, c)))
	})
}

// sourceIP reads the caller's address as the console's router does
// (handlers.New's IPExtractor): behind a proxy, the rightmost untrusted
// X-Forwarded-For entry, never the leftmost one the caller wrote itself.
func (s *Server) sourceIP(r *http.Request) string {
	if s.TrustProxy {
		return echo.ExtractIPFromXFFHeader()(r)
	}
	return echo.ExtractIPDirect()(r)
}

// flushDenials records the refusals of each call (a casbin deny, the
// command policy) in the org's audit log once the call returned, as the
// console's own routes do.
// Errors the caller is not told the details of are logged here.
type flushDenials struct{ s *Server }

func (f flushDenials) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, f.after(ctx, req.Spec().Procedure, err)
	}
}

func (flushDenials) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (f flushDenials) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return f.after(ctx, conn.Spec().Procedure, next(ctx, conn))
	}
}

func (f flushDenials) after(ctx context.Context, procedure string, err error) error {
	c := callOf(ctx)
	if c.Actor != nil {
		if ferr := c.Actor.Flush(ctx); ferr != nil {
			err = gateway.Unrecorded(ferr)
		}
	}
	cerr := toConnect(err)
	switch code := connect.CodeOf(cerr); {
	case cerr == nil:
	case ctx.Err() == nil && (code == connect.CodeInternal || code == connect.CodeUnavailable):
		f.s.logger().Error("e2b data plane call failed", "procedure", procedure, "session_id", c.SessionID, "error", err)
	default:
		// The caller's own mistake or a refusal: the caller is told, the
		// log need not shout.
		f.s.logger().Debug("e2b data plane call refused", "procedure", procedure, "session_id", c.SessionID, "code", code.String(), "error", err)
	}
	return cerr
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// NoSandboxes knows no sandbox: the resolver of a console without an
// E2B-compatible control plane.
type NoSandboxes struct{}

// ResolveSandbox answers not found.
func (NoSandboxes) ResolveSandbox(context.Context, string, string) (Binding, error) {
	return Binding{}, apperr.New(apperr.ErrNotFound, "sandbox_not_found", "No such sandbox.")
}

// health is envd's GET /health for one sandbox, which the SDK's isRunning
// reads: 204 while its session runs, 502 once it does not (closed, lost,
// paused, no sandbox yet), as E2B's proxy answers for a sandbox that is
// gone.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	t, err := c.Org.Sessions.Locate(r.Context(), c.Actor, c.SessionID)
	if ferr := c.Actor.Flush(r.Context()); ferr != nil && err == nil {
		err = gateway.Unrecorded(ferr)
	}
	switch {
	case err == nil && t.Session.State == sessions.StateRunning:
		w.WriteHeader(http.StatusNoContent)
	case err == nil || sessions.IsFinal(err) || sessions.IsUnstarted(err):
		notRunning(w)
	default:
		s.fail(w, r, err)
	}
}

func notRunning(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	_, _ = w.Write([]byte(`{"code":502,"message":"The sandbox is not running."}`))
}
