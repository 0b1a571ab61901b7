// Package e2bfake is an in-repo stand-in for an E2B-compatible sandbox
// backend (E2B, CubeSandbox) for tests and local development. It is a real
// HTTP server that follows the published REST API's paths, field names,
// status codes and error shape, and also acts as the sandbox proxy
// (host-based <port>-<id>.<domain> and path-based /sandbox/<id>/<port>/).
// Every sandbox is a real agentd process with its own workspace directory;
// pause freezes its process tree and connect thaws it.
//
// It is as strict as the real backends, so that it does not hide client
// bugs: requests are validated like E2B's OpenAPI validation and handlers
// (content type, types, required fields, enums, date-times, timeouts,
// private-needs-secure), the metadata list filter is decoded in E2B's
// steps, and lists are newest first with E2B's filters and paging.
// Config.CubeSandbox switches to CubeAPI's behaviour where it differs.
//
// For tests of callers: InjectFault spoils chosen calls (5xx, 503 with
// Retry-After, slow or missing answers, malformed bodies, a create that
// happened but whose answer was lost); Seed adds many sandboxes without
// processes, and NopLauncher creates API sandboxes without processes, for
// benchmarks at scale; Advance and Tick drive timeouts from a test clock.
//
// Its wire types are written separately from the client's on purpose, so
// that a misreading of the API in one does not pass silently in both.
package e2bfake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// Template is a template the fake serves; it is always built (ready).
type Template struct {
	ID          string
	Aliases     []string
	CPU         int
	MemoryMB    int
	DiskSizeMB  int
	EnvdVersion string
}

// Config configures a fake backend.
type Config struct {
	// APIKey, when set, is required in X-API-Key or Authorization: Bearer.
	APIKey string
	// Domain is the proxy domain reported in Sandbox.domain and matched on
	// Host headers (default "e2b.local").
	Domain string
	// AgentdBinary is the agentd executable each sandbox runs.
	AgentdBinary string
	// AgentdToken is passed to agentd as AGENTD_TOKEN.
	AgentdToken string
	// AgentdEnv is extra environment (KEY=VALUE) for every agentd.
	AgentdEnv []string
	// AgentdEnviron, when set, is each agentd's whole base environment
	// (see ExecLauncher.Environ); nil inherits the fake's own.
	AgentdEnviron func(spec LaunchSpec) ([]string, error)
	// WorkDir holds one directory per sandbox; empty means a temporary
	// directory removed by Close.
	WorkDir string
	// Clock is the wall clock; Advance adds to it. Default time.Now.
	Clock func() time.Time
	// Templates are served by /templates; default one "base" template.
	Templates []Template
	// Launcher replaces the agentd exec (tests of the API layer alone).
	Launcher Launcher
	// Addr is the listen address (default 127.0.0.1:0).
	Addr string
	// TickInterval, when positive, applies timeouts in the background (dev
	// mode). Tests leave it zero and call Tick or Advance.
	TickInterval time.Duration
	// CubeSandbox mimics CubeAPI where it differs from E2B (see "Where
	// CubeSandbox differs" in shared/e2b-api.md): the host-mount metadata
	// key is honoured (see HostMountPrefix), a timeout of -1 means
	// never (and is the create default), create honours lifecycle
	// {onTimeout, autoResume} over the flat fields, connect answers 200
	// even when it resumed, GET /sandboxes lists at most 200, and
	// nextToken is ignored (IgnoreNextToken). Off, the fake is E2B: -1 is
	// refused and lifecycle is ignored.
	CubeSandbox bool
	// HostMountPrefix is the directory host-mount host paths must lie
	// under, in CubeSandbox mode (default DefaultHostMountPrefix, as
	// CubeAPI ships). A sandbox created with a host-mount has its agentd
	// work in that host directory, created if missing, which outlives the
	// sandbox.
	HostMountPrefix string
	// IgnoreNextToken mimics CubeSandbox alone: X-Next-Token is sent but
	// the nextToken parameter is ignored, so every request gets the first
	// page.
	IgnoreNextToken bool
	// NoConnectRoute mimics servers that predate /connect.
	NoConnectRoute bool
	// NoHealthRoute mimics E2B, which has no /health.
	NoHealthRoute bool
	// Logger receives agentd output and proxy errors; nil discards.
	Logger *slog.Logger
}

// Server is a running fake backend.
type Server struct {
	cfg       Config
	launcher  Launcher
	ln        net.Listener
	srv       *http.Server
	handler   http.Handler
	transport *http.Transport // to agentd processes
	ownDir    bool
	stop      chan struct{}
	done      sync.WaitGroup

	faults faultSet

	mu        sync.Mutex
	sandboxes map[string]*box
	seq       int64
	offset    time.Duration
	calls     map[string]int
	closed    bool
}

// New starts a fake backend listening on cfg.Addr.
func New(cfg Config) (*Server, error) {
	if cfg.Domain == "" {
		cfg.Domain = "e2b.local"
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if len(cfg.Templates) == 0 {
		cfg.Templates = []Template{{ID: "base", Aliases: []string{"base"}, CPU: 2, MemoryMB: 512, DiskSizeMB: 1024}}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.CubeSandbox {
		cfg.IgnoreNextToken = true
	}
	s := &Server{
		cfg:       cfg,
		launcher:  cfg.Launcher,
		sandboxes: map[string]*box{},
		calls:     map[string]int{},
		stop:      make(chan struct{}),
		transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
	}
	if s.launcher == nil {
		if cfg.AgentdBinary == "" {
			return nil, errors.New("e2bfake: AgentdBinary or Launcher is required")
		}
		// Each agentd starts in its sandbox's directory, where a
		// relative path to the binary names nothing.
		bin, err := filepath.Abs(cfg.AgentdBinary)
		if err != nil {
			return nil, fmt.Errorf("e2bfake: agentd binary: %w", err)
		}
		s.launcher = ExecLauncher{
			Binary:   bin,
			Token:    cfg.AgentdToken,
			ExtraEnv: cfg.AgentdEnv,
			Environ:  cfg.AgentdEnviron,
			Log:      slogWriter{cfg.Logger},
		}
	}
	if s.cfg.WorkDir == "" {
		dir, err := os.MkdirTemp("", "e2bfake-")
		if err != nil {
			return nil, fmt.Errorf("e2bfake: work dir: %w", err)
		}
		s.cfg.WorkDir, s.ownDir = dir, true
	}
	s.handler = s.routes()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("e2bfake: listen: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		_ = s.srv.Serve(ln)
	}()
	if cfg.TickInterval > 0 {
		s.done.Add(1)
		go s.tickLoop(cfg.TickInterval)
	}
	return s, nil
}

func (s *Server) tickLoop(every time.Duration) {
	defer s.done.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Tick()
		}
	}
}

// Close kills every sandbox, stops the server and removes a temporary work
// directory.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	boxes := make([]*box, 0, len(s.sandboxes))
	for _, b := range s.sandboxes {
		boxes = append(boxes, b)
	}
	s.sandboxes = map[string]*box{}
	s.mu.Unlock()

	close(s.stop)
	s.faults.clear()
	var errs []error
	for _, b := range boxes {
		if err := b.proc.Kill(); err != nil {
			errs = append(errs, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	s.done.Wait()
	s.transport.CloseIdleConnections()
	if s.ownDir {
		if err := os.RemoveAll(s.cfg.WorkDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Handler is the fake's whole surface (API and proxy), for mounting it in
// another server.
func (s *Server) Handler() http.Handler { return s.handler }

// URL is the API base URL, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// ProxyURL is the base for path-based proxying: <ProxyURL>/sandbox/<id>/<port>/.
func (s *Server) ProxyURL() string { return s.URL() }

// Domain is the proxy domain for host-based URLs.
func (s *Server) Domain() string { return s.cfg.Domain }

// Addr is the listener's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// SandboxURL is the host-based URL of a port inside a sandbox,
// http://<port>-<id>.<domain>. It resolves nowhere; reach it with
// Transport or HTTPClient.
func (s *Server) SandboxURL(id string, port int) string {
	return fmt.Sprintf("http://%d-%s.%s", port, id, s.cfg.Domain)
}

// Transport dials the fake's listener whatever the URL's host, so
// host-based sandbox URLs work on loopback without DNS.
func (s *Server) Transport() *http.Transport {
	addr := s.ln.Addr().String()
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}
}

// DialContext dials the fake's listener whatever address is asked for.
func (s *Server) DialContext(ctx context.Context, network, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, s.ln.Addr().String())
}

// HTTPClient is an http.Client over Transport.
func (s *Server) HTTPClient() *http.Client {
	return &http.Client{Transport: s.Transport(), Timeout: 60 * time.Second}
}

// Calls reports how many requests a route has served, named as registered,
// e.g. "POST /sandboxes" or "GET /v2/sandboxes"; proxied requests count as
// "PROXY".
func (s *Server) Calls(route string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[route]
}

func (s *Server) count(route string) {
	s.mu.Lock()
	s.calls[route]++
	s.mu.Unlock()
}

// Now is the fake's current time: the clock plus everything Advanced.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nowLocked()
}

func (s *Server) nowLocked() time.Time { return s.cfg.Clock().Add(s.offset).UTC() }

// Advance moves the fake's time forward and applies timeouts.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	s.offset += d
	s.mu.Unlock()
	s.Tick()
}

// Tick applies timeouts as of now: an expired running sandbox is paused
// when its lifecycle says so (autoPause, or CubeSandbox's lifecycle
// onTimeout: pause), killed otherwise.
func (s *Server) Tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	for _, b := range s.sortedLocked() {
		if b.state != sandbox.StateRunning || b.endAt.IsZero() || now.Before(b.endAt) {
			continue
		}
		if b.onTimeout == sandbox.OnTimeoutPause {
			// Paused when the timeout expired, which is what endAt
			// already says.
			if err := s.pauseLocked(b, b.endAt); err != nil {
				s.cfg.Logger.Error("pause on timeout", "sandbox_id", b.id, "err", err)
			}
			continue
		}
		s.killLocked(b)
	}
}

// pauseLocked freezes b's processes. Like E2B, a paused sandbox reports
// endAt as the time it was paused (its snapshot's time), which is what a
// reclaimer measures idleness from.
// A freeze that fails part-way is undone: the sandbox stays running with
// every process continued, never half-stopped while reported running.
func (s *Server) pauseLocked(b *box, at time.Time) error {
	if err := b.proc.Freeze(); err != nil {
		if terr := b.proc.Thaw(); terr != nil {
			return errors.Join(err, fmt.Errorf("continue after the failed freeze: %w", terr))
		}
		return err
	}
	b.state = sandbox.StatePaused
	b.endAt = at
	return nil
}

// Snapshot is a sandbox's state as the fake holds it, for tests.
type Snapshot struct {
	ID         string
	State      sandbox.State
	PID        int
	Workspace  string
	AgentdAddr string
	StartedAt  time.Time
	EndAt      time.Time
	Metadata   map[string]string
	// Egress is the outgoing-traffic settings of the create (nil: none).
	Egress *sandbox.Egress
}

// Inspect returns a sandbox's state, or false when it does not exist.
func (s *Server) Inspect(id string) (Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.sandboxes[id]
	if !ok {
		return Snapshot{}, false
	}
	return Snapshot{
		ID:         b.id,
		State:      b.state,
		PID:        b.proc.PID(),
		Workspace:  b.workspace,
		AgentdAddr: b.proc.Addr(),
		StartedAt:  b.startedAt,
		EndAt:      b.endAt,
		Metadata:   copyMap(b.metadata),
		Egress:     b.egress,
	}, true
}

// box is one sandbox.
type box struct {
	seq          int64
	id           string
	tpl          Template
	alias        string
	clientID     string
	metadata     map[string]string
	startedAt    time.Time
	endAt        time.Time // zero: never times out
	timeout      time.Duration
	state        sandbox.State
	onTimeout    sandbox.OnTimeout
	autoResume   bool
	envdToken    string // empty: not a secure sandbox
	trafficToken string // empty: public traffic allowed
	// egress is what the create asked the backend to enforce of outgoing
	// traffic (nil: nothing). The fake records it; the sandbox's agentd
	// is what enforces a policy here.
	egress    *sandbox.Egress
	dir       string // empty: seeded, nothing on disk
	workspace string
	proc      Process
}

func (s *Server) sortedLocked() []*box {
	out := make([]*box, 0, len(s.sandboxes))
	for _, b := range s.sandboxes {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

// killLocked ends a sandbox's processes and forgets it.
func (s *Server) killLocked(b *box) {
	if err := b.proc.Kill(); err != nil {
		s.cfg.Logger.Error("kill sandbox", "sandbox_id", b.id, "err", err)
	}
	delete(s.sandboxes, b.id)
	if b.dir == "" {
		return
	}
	if err := os.RemoveAll(b.dir); err != nil {
		s.cfg.Logger.Error("remove sandbox dir", "sandbox_id", b.id, "err", err)
	}
}

// thawLocked resumes a paused sandbox with a fresh timeout.
func (s *Server) thawLocked(b *box, timeout time.Duration) error {
	if err := b.proc.Thaw(); err != nil {
		return err
	}
	b.state = sandbox.StateRunning
	b.timeout = timeout
	b.endAt = endAfter(s.nowLocked(), timeout)
	return nil
}

// endAfter is when a timeout set at now expires; zero for never (negative).
func endAfter(now time.Time, timeout time.Duration) time.Time {
	if timeout < 0 {
		return time.Time{}
	}
	return now.Add(timeout)
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// slogWriter turns agentd's stderr lines into debug log records.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Debug("agentd output", "line", string(p))
	return len(p), nil
}
