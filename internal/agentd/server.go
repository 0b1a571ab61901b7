package agentd

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config holds everything a Server needs. Zero fields take the defaults
// documented on each.
type Config struct {
	// Token is the bearer token every request but /healthz must carry.
	// Required.
	Token string
	// Root, when set, confines file operations to this directory (symlinks
	// and ".." cannot leave it) and is the default cwd of commands.
	Root string
	// Shell runs commands as Shell -c COMMAND. Default /bin/sh.
	Shell string
	// MaxSessions caps concurrently running sessions. Default 256.
	MaxSessions int
	// RingBytes bounds each session's buffered output, counting every
	// chunk's data capacity plus a fixed per-chunk overhead. Default 4 MiB.
	RingBytes int
	// PollBytes caps the chunk data of one session response (at least one
	// chunk is always returned); readers continue from next_cursor.
	// Default 1 MiB.
	PollBytes int
	// SessionTTL is how long ended sessions stay readable. Default 5m.
	SessionTTL time.Duration
	// KillGrace is the wait between SIGTERM and SIGKILL. Default 3s.
	KillGrace time.Duration
	// DrainGrace is how long output may keep draining after the command
	// exits (background children can hold the pipes). Default 250ms.
	DrainGrace time.Duration
	// StdinTimeout is how long one stdin request may take, counted from
	// its arrival (waiting behind other writes included). Default 10s.
	StdinTimeout time.Duration
	// FetchMaxBytes caps POST /v1/files/fetch downloads. Default 1 GiB.
	FetchMaxBytes int64
	// WriteMaxBytes caps the body of PUT /v1/files and PUT
	// /v1/files/archive. Default 64 MiB.
	WriteMaxBytes int64
	// UnpackMaxBytes caps the bytes one archive unpacks to (uploaded or
	// fetched) and one copy copies, counted as written, not as an
	// archive's headers claim. Default 1 GiB.
	UnpackMaxBytes int64
	// UnpackMaxFiles caps the entries of one archive or copied tree.
	// Default 10000.
	UnpackMaxFiles int
	// FetchTimeout caps a download's duration. Default 10m.
	FetchTimeout time.Duration
	// FetchClient performs downloads. Default: a client without timeout
	// (the fetch timeout applies through the request context). Its
	// redirects are checked as FetchAllowPrivateRedirects says.
	FetchClient *http.Client
	// FetchAllowPrivateRedirects lets downloads follow redirects to
	// loopback, link-local and cloud metadata addresses, which are refused
	// by default (a redirect must not reach agentd itself or the metadata
	// service).
	FetchAllowPrivateRedirects bool
	// RefuseHardLinks makes GET /v1/files refuse regular files with more
	// than one hard link. Needed when commands run as another user on a
	// system without fs.protected_hardlinks: they could then link a file
	// they cannot read into the root and read it through agentd.
	RefuseHardLinks bool
	// MaxEndedSessions caps ended sessions kept for reading before their
	// TTL; beyond it the oldest are reclaimed early. Default 1024.
	MaxEndedSessions int
	// Cgroup chooses how a session's processes are tracked on Linux:
	// CgroupAuto (default, ""): a cgroup v2 per session when agentd can
	// create one below CgroupParent (default: its own cgroup), otherwise
	// the session id, process group and process tree; CgroupOff: never
	// cgroups; CgroupRequired: fail without them. Other systems never have
	// cgroups. See docs/agentd-protocol.md for what each guarantees.
	Cgroup string
	// CgroupParent is the cgroup v2 directory below which agentd creates
	// its sessions' cgroups. Default: agentd's own cgroup.
	CgroupParent string
	// SessionMemoryMax and SessionPidsMax set memory.max and pids.max of
	// every session's cgroup (0: no limit). Setting either requires
	// cgroups with the memory (or pids) controller delegated to agentd.
	SessionMemoryMax int64
	SessionPidsMax   int64
	// Subreaper makes agentd a child subreaper (Linux): orphaned
	// descendants of commands are reparented to agentd, which reaps them
	// (as PID 1 it would have to anyway) and, without cgroups, treats an
	// orphan no session claims as an escapee to kill when a session ends.
	// Only one Server per process should set it; cmd/agentd does.
	Subreaper bool
	// Spawner starts commands from a helper process holding a handful of
	// descriptors (Linux, with Subreaper; see spawn_linux.go), so a start
	// does not slow down with the sessions agentd runs. Without it, or
	// when the helper cannot run, agentd starts commands itself.
	Spawner bool
	// RunAs runs commands with these credentials (nil: agentd's own).
	RunAs *Credential
	// ExecReporting chooses whether agentd reports the programs started in
	// sessions that ask for them (HeaderExecRecords): ExecReportingAuto
	// (default, ""): where the kernel lets it (Linux's process-events
	// connector, as root); ExecReportingDisabled: never. Health says which.
	ExecReporting string
	// Egress chooses how sessions whose create carries a network policy
	// are confined: EgressAuto (default, ""): a network namespace each as
	// root on Linux, else Landlock; EgressNetns or EgressLandlock: only
	// that; EgressOff: never. Health says which (see egress.go).
	Egress string
	// EgressDNS is the resolver (host:port) agentd asks for the names
	// sessions may resolve and its proxy dials. Default: the host's.
	EgressDNS string
	// EgressRootCAs verifies the servers of inspected connections, which
	// agentd reaches over TLS of its own. Default: the system's roots.
	EgressRootCAs *x509.CertPool
	// Logger receives operational logs. Default: discarded.
	Logger *slog.Logger
}

// Cgroup modes of Config.Cgroup.
const (
	CgroupAuto     = "auto"     // a cgroup per session if agentd can create one
	CgroupOff      = "off"      // never cgroups
	CgroupRequired = "required" // refuse to start without cgroups
)

// Credential is a user to run commands as.
type Credential struct {
	UID, GID uint32
	Groups   []uint32
	// Env replaces HOME, USER, LOGNAME and SHELL in the commands'
	// environment (KEY=VALUE entries).
	Env []string
}

// Defaults of Config.
const (
	DefaultMaxSessions      = 256
	DefaultMaxEndedSessions = 1024
	DefaultRingBytes        = 4 << 20
	DefaultPollBytes        = 1 << 20
	DefaultSessionTTL       = 5 * time.Minute
	DefaultKillGrace        = 3 * time.Second
	DefaultDrainGrace       = 250 * time.Millisecond
	DefaultStdinTimeout     = 10 * time.Second
	DefaultFetchMaxBytes    = 1 << 30
	DefaultFetchTimeout     = 10 * time.Minute
	DefaultWriteMaxBytes    = 64 << 20
	DefaultUnpackMaxBytes   = 1 << 30
	DefaultUnpackMaxFiles   = 10000
)

func (c *Config) setDefaults() {
	if c.Shell == "" {
		c.Shell = defaultShell
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.MaxEndedSessions <= 0 {
		c.MaxEndedSessions = DefaultMaxEndedSessions
	}
	if c.RingBytes <= 0 {
		c.RingBytes = DefaultRingBytes
	}
	if c.PollBytes <= 0 {
		c.PollBytes = DefaultPollBytes
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.KillGrace <= 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.DrainGrace <= 0 {
		c.DrainGrace = DefaultDrainGrace
	}
	if c.StdinTimeout <= 0 {
		c.StdinTimeout = DefaultStdinTimeout
	}
	if c.FetchMaxBytes <= 0 {
		c.FetchMaxBytes = DefaultFetchMaxBytes
	}
	if c.WriteMaxBytes <= 0 {
		c.WriteMaxBytes = DefaultWriteMaxBytes
	}
	if c.UnpackMaxBytes <= 0 {
		c.UnpackMaxBytes = DefaultUnpackMaxBytes
	}
	if c.UnpackMaxFiles <= 0 {
		c.UnpackMaxFiles = DefaultUnpackMaxFiles
	}
	if c.FetchTimeout <= 0 {
		c.FetchTimeout = DefaultFetchTimeout
	}
	if c.FetchClient == nil {
		c.FetchClient = &http.Client{}
	}
	if !c.FetchAllowPrivateRedirects {
		c.FetchClient = guardRedirects(c.FetchClient, net.DefaultResolver)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server is the agentd HTTP service: sessions, files and health.
type Server struct {
	cfg   Config
	files *fileSystem
	// tokenMu guards tokenHash and rekeyed: POST /v1/token replaces the
	// token once (see handleRekey).
	tokenMu   sync.RWMutex
	tokenHash [sha256.Size]byte
	rekeyed   bool
	// usedBefore records a request other than the rekey that the
	// template's token authenticated before any rekey: set under tokenMu's
	// read lock (hence atomic), read under its write lock by handleRekey.
	usedBefore atomic.Bool
	tracker    *tracker
	// execMon reports what ran in sessions (nil: unavailable, execWhy
	// says why); stopExec ends it.
	execMon  *execMonitor
	execWhy  string
	stopExec func()
	egress   *egressService
	baseEnv  []string
	started  time.Time
	handler  http.Handler

	mu       sync.Mutex
	sessions map[string]*session
	// ended lists the ended sessions in the order they ended (with when),
	// so reclaiming the oldest costs the ones reclaimed, not a look at
	// every session under mu on every start. Entries whose session left
	// sessions already are skipped as they come up.
	ended []endedSession
	// starting holds ids of sessions being started, so two requests for
	// one client-chosen id cannot both start.
	starting map[string]bool
	// killedFirst holds client-chosen ids a kill named before their
	// create arrived (the console closing a session while an exec's
	// create is on its way): that create is refused, and one already
	// starting is killed as it registers, so a kill is never lost to the
	// order two requests arrive in. Entries expire (killedFirstTTL).
	killedFirst map[string]time.Time
	running     int
	closed      bool

	closing     chan struct{} // closed by Close; wakes long-polls
	janitorDone chan struct{}
	closeOnce   sync.Once
}

// NewServer validates cfg and starts the janitor that reclaims ended
// sessions. Call Close to stop it and kill every running command.
func NewServer(cfg Config) (*Server, error) {
	if err := CheckToken(cfg.Token); err != nil {
		return nil, fmt.Errorf("agentd: %w", err)
	}
	cfg.setDefaults()
	fsys, err := newFileSystem(cfg.Root, cfg.RefuseHardLinks)
	if err != nil {
		return nil, err
	}
	if fsys.rootDir != "" {
		cfg.Root = fsys.rootDir
	}
	fsys.sourcesForOthers = cfg.RunAs != nil
	tr, err := newTracker(&cfg)
	if err != nil {
		fsys.close()
		return nil, err
	}
	s := &Server{
		cfg:         cfg,
		tokenHash:   sha256.Sum256([]byte(cfg.Token)),
		files:       fsys,
		tracker:     tr,
		baseEnv:     childEnv(os.Environ(), cfg.RunAs),
		started:     time.Now(),
		sessions:    make(map[string]*session),
		closing:     make(chan struct{}),
		janitorDone: make(chan struct{}),
	}
	s.startExecReporting()
	s.egress = newEgressService(&s.cfg)
	s.handler = s.routes()
	go s.janitor()
	return s, nil
}

// WithoutToken is env without AGENTD_TOKEN, agentd's own secret: what
// agentd re-executes itself with, and what its commands inherit.
func WithoutToken(env []string) []string { return childEnv(env, nil) }

// childEnv strips agentd's own secrets from the environment commands
// inherit and, for commands run as another user, sets that user's HOME,
// USER, LOGNAME and SHELL (agentd's own would name the wrong user's).
func childEnv(env []string, runAs *Credential) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		key, _, _ := strings.Cut(kv, "=")
		if key == "AGENTD_TOKEN" {
			continue
		}
		if runAs != nil && (key == "HOME" || key == "USER" || key == "LOGNAME" || key == "SHELL") {
			continue
		}
		out = append(out, kv)
	}
	if runAs != nil {
		out = append(out, runAs.Env...)
	}
	return out
}

// startExecReporting subscribes to the kernel's process events unless
// turned off; where that fails agentd runs on without exec records and
// says so on /healthz.
func (s *Server) startExecReporting() {
	if s.cfg.ExecReporting == ExecReportingDisabled {
		s.execWhy = "turned off (--exec-reporting off)"
		return
	}
	m, stop, err := startExecMonitor(s.cfg.Logger)
	if err != nil {
		s.execWhy = err.Error()
		s.cfg.Logger.Warn("exec reporting unavailable", "error", err)
		return
	}
	// The spawner's children are sessions' leaders as agentd's are.
	m.spawner.Store(s.tracker.spawn)
	s.execMon, s.stopExec = m, stop
}

func (s *Server) stopExecReporting() {
	if s.stopExec != nil {
		s.stopExec()
	}
}

// ExecReporting reports whether the server reports exec records
// (Health.ExecReporting) and, when not, why.
func (s *Server) ExecReporting() (state, reason string) {
	switch {
	case s.execMon != nil:
		return ExecReportingNetlink, ""
	case s.cfg.ExecReporting == ExecReportingDisabled:
		return ExecReportingOff, s.execWhy
	}
	return ExecReportingUnavailable, s.execWhy
}

// ProcessTracking reports how the server finds every process of a session
// (see Health.ProcessTracking) and, when it fell back from cgroups, why.
func (s *Server) ProcessTracking() (mode string, fallback error) {
	return s.tracker.mode(), s.tracker.fallback
}

// Handler serves the agentd protocol.
func (s *Server) Handler() http.Handler { return s.handler }

// routes is the whole HTTP surface in one table. Everything but /healthz
// requires the bearer token.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthz", methods{http.MethodGet: s.handleHealth})
	mux.Handle("/v1/sessions", s.auth(methods{http.MethodPost: s.handleCreateSession}))
	mux.Handle("/v1/sessions/{id}", s.auth(methods{
		http.MethodGet:    s.handlePollSession,
		http.MethodDelete: s.handleDeleteSession,
	}))
	mux.Handle("/v1/sessions/{id}/stdin", s.auth(methods{http.MethodPost: s.handleStdin}))
	mux.Handle("/v1/sessions/{id}/resize", s.auth(methods{http.MethodPost: s.handleResize}))
	mux.Handle("/v1/sessions/{id}/network_policy", s.auth(methods{http.MethodPut: s.handleNetworkPolicy}))
	mux.Handle("/v1/files", s.auth(methods{
		http.MethodGet: s.handleReadFile,
		http.MethodPut: s.handleWriteFile,
	}))
	mux.Handle("/v1/files/archive", s.auth(methods{http.MethodPut: s.handleWriteArchive}))
	mux.Handle("/v1/files/stat", s.auth(methods{http.MethodPost: s.handleStat}))
	mux.Handle("/v1/files/fetch", s.auth(methods{http.MethodPost: s.handleFetch}))
	mux.Handle("/v1/files/copy", s.auth(methods{http.MethodPost: s.handleCopy}))
	mux.Handle("/v1/token", s.auth(methods{http.MethodPost: s.handleRekey}))
	mux.Handle("/", s.auth(apiFunc(func(w http.ResponseWriter, r *http.Request) error {
		return newError(CodeNotFound, "There is no such endpoint.")
	})))
	return s.recoverer(mux)
}

// apiFunc is a handler that returns its error instead of writing it, so each
// error is turned into a response in one place.
type apiFunc func(w http.ResponseWriter, r *http.Request) error

func (f apiFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := f(w, r); err != nil {
		writeError(w, err)
	}
}

// methods dispatches on the request method and answers others with a JSON 405.
type methods map[string]apiFunc

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, ok := m[r.Method]
	if !ok {
		allowed := make([]string, 0, len(m))
		for k := range m {
			allowed = append(allowed, k)
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, newError(CodeMethodNotAllowed, "The method %s is not allowed here.", r.Method))
		return
	}
	h.ServeHTTP(w, r)
}

// auth rejects requests without the right bearer token. Comparing digests
// in constant time hides both content and length of the token.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authz := r.Header.Get("Authorization")
		ok := len(authz) > len("Bearer ") && strings.EqualFold(authz[:len("Bearer ")], "Bearer ")
		sum := sha256.Sum256([]byte(authz[min(len(authz), len("Bearer ")):]))
		s.tokenMu.RLock()
		valid := ok && subtle.ConstantTimeCompare(sum[:], s.tokenHash[:]) == 1
		if valid && !s.rekeyed && r.URL.Path != "/v1/token" {
			// Under the read lock: a rekey (write lock) sees it.
			s.usedBefore.Store(true)
		}
		s.tokenMu.RUnlock()
		if !valid {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentd"`)
			writeError(w, newError(CodeUnauthorized, "A valid bearer token is required."))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// recoverer turns a handler panic into a logged 500 instead of a dropped
// connection.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.cfg.Logger.Error("handler panic", "path", r.URL.Path, "panic", fmt.Sprint(v))
				writeError(w, fmt.Errorf("panic: %v", v))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// writeError answers with the JSON error envelope. Errors that are not
// protocol errors become a 500 whose details stay out of the response.
func writeError(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = newError(CodeInternal, "An internal error occurred.")
	}
	writeJSON(w, e.Status, ErrorEnvelope{Error: ErrorBody{Code: e.Code, Message: e.Message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"code":"internal","message":"The response could not be encoded."}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", fmt.Sprint(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// decodeJSON reads one JSON object of at most limit bytes into v, strictly:
// see checkStrictJSON.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			return jsonError(err, limit)
		}
		return newError(CodeMalformedJSON, "The body could not be read.")
	}
	if err := checkStrictJSON(raw, v); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return jsonError(err, limit)
	}
	return nil
}

func jsonError(err error, limit int64) error {
	var maxErr *http.MaxBytesError
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &maxErr):
		return newError(CodeTooLarge, "The body exceeds the limit of %d bytes.", limit)
	case errors.Is(err, io.EOF):
		return newError(CodeMalformedJSON, "The body is empty; a JSON object is required.")
	case errors.As(err, &syntaxErr):
		return newError(CodeMalformedJSON, "The body is not valid JSON (at byte %d).", syntaxErr.Offset)
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return newError(CodeMalformedJSON, "The body must be a JSON object.")
		}
		return newError(CodeMalformedJSON, "The field %q must be of type %s.", typeErr.Field, typeErr.Type)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return newError(CodeMalformedJSON, "The body has an unknown field %s.", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return newError(CodeMalformedJSON, "The body is not valid JSON.")
	}
}

// newSessionID returns an unguessable session id.
func newSessionID() string { return rand.Text() }

// janitor reclaims sessions that ended more than SessionTTL ago.
func (s *Server) janitor() {
	defer close(s.janitorDone)
	every := min(max(s.cfg.SessionTTL/10, 10*time.Millisecond), 30*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case now := <-t.C:
			s.reclaim(now.Add(-s.cfg.SessionTTL))
		}
	}
}

// endedSession is an entry of Server.ended.
type endedSession struct {
	sess *session
	at   time.Time
}

// reclaimOldestEnded drops ended sessions beyond MaxEndedSessions, oldest
// first, so short TTL-bound bursts cannot hold unbounded output. s.mu must be
// held.
func (s *Server) reclaimOldestEnded() {
	for len(s.sessions)-s.running > s.cfg.MaxEndedSessions && len(s.ended) > 0 {
		s.dropOldestEndedLocked()
	}
}

// reclaim drops the sessions that ended before endedBefore, told by when
// they were listed as ended: after their remains were ended too (the
// kill and drain graces at most, past their end), so they stay readable
// at least SessionTTL.
func (s *Server) reclaim(endedBefore time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.ended) > 0 && s.ended[0].at.Before(endedBefore) {
		s.dropOldestEndedLocked()
	}
}

// dropOldestEndedLocked removes the first entry of ended and its session,
// if that is still the one under its id.
func (s *Server) dropOldestEndedLocked() {
	e := s.ended[0]
	s.ended[0] = endedSession{}
	s.ended = s.ended[1:]
	if s.sessions[e.sess.id] == e.sess {
		delete(s.sessions, e.sess.id)
	}
}

// Close stops the janitor, refuses new sessions, ends every process of
// every session (SIGTERM, then SIGKILL after the kill grace) and waits for
// them to be gone. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		all := make([]*session, 0, len(s.sessions))
		for _, sess := range s.sessions {
			all = append(all, sess)
		}
		s.mu.Unlock()
		close(s.closing)
		<-s.janitorDone
		defer s.files.close()
		defer s.tracker.close()
		defer s.egress.close()
		defer s.stopExecReporting()
		for _, sess := range all {
			sess.kill(StateKilled)
		}
		deadline := time.NewTimer(s.cfg.KillGrace + s.cfg.DrainGrace + 2*time.Second)
		defer deadline.Stop()
		for i, sess := range all {
			select {
			case <-sess.gone:
			case <-deadline.C:
				// A machine too loaded to see them end in time: what is
				// left gets SIGKILL now rather than outliving agentd.
				left := 0
				for _, rest := range all[i:] {
					select {
					case <-rest.gone:
					default:
						rest.proc.killAll()
						left++
					}
				}
				s.cfg.Logger.Warn("sessions did not end after kill; killed what was left", "sessions", left)
				return
			}
		}
	})
	return nil
}

// resolveCwd picks a command's working directory: relative to the root (or
// agentd's cwd), defaulting to the root, and never outside the root.
func (s *Server) resolveCwd(cwd string) (string, error) {
	if cwd == "" {
		return s.cfg.Root, nil
	}
	if s.files.rootDir == "" {
		return filepath.Clean(cwd), nil
	}
	rel, err := s.files.rel(cwd)
	if err != nil {
		return "", err
	}
	fi, err := s.files.root.Stat(rel)
	if err != nil {
		return "", s.files.pathError(cwd, err)
	}
	if !fi.IsDir() {
		return "", newError(CodeBadRequest, "The cwd %q is not a directory.", cwd)
	}
	// Resolve symlinks inside the root so the command starts where the
	// confined lookup ended.
	real, err := filepath.EvalSymlinks(filepath.Join(s.files.rootDir, rel))
	if err != nil || !within(s.files.rootDir, real) {
		return "", newError(CodePathOutsideRoot, "The cwd %q is outside the root directory.", cwd)
	}
	return real, nil
}
