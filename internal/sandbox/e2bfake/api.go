package e2bfake

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// defaultTimeout is NewSandbox.timeout's default in E2B's OpenAPI document.
const defaultTimeout = 15 * time.Second

// envdVersion is what the fake reports as the in-sandbox daemon version.
const envdVersion = "0.2.0"

// envVarName is CubeSandbox's rule for envVars names; the fake applies it
// in both modes, since a name a shell cannot export is a client bug anyway.
var envVarName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// routes builds the whole surface: proxy traffic is recognised first (by
// Host or by the /sandbox/ path prefix), everything else is the API.
// Unknown routes answer E2B's JSON error shape.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	api := func(pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, s.counted(pattern, s.faulty(pattern, s.authed(h))))
	}
	if !s.cfg.NoHealthRoute {
		mux.Handle("GET /health", s.counted("GET /health", s.faulty("GET /health", http.HandlerFunc(s.health))))
	}
	api("POST /sandboxes", s.create)
	api("POST /v2/sandboxes", s.create)
	api("GET /sandboxes", s.listV1)
	api("GET /v2/sandboxes", s.listV2)
	api("GET /sandboxes/{sandboxID}", s.detail)
	api("DELETE /sandboxes/{sandboxID}", s.kill)
	api("POST /sandboxes/{sandboxID}/pause", s.pause)
	api("POST /sandboxes/{sandboxID}/resume", s.resume)
	api("POST /sandboxes/{sandboxID}/timeout", s.setTimeout)
	if !s.cfg.NoConnectRoute {
		api("POST /sandboxes/{sandboxID}/connect", s.connect)
		api("POST /v2/sandboxes/{sandboxID}/connect", s.connect)
	}
	api("GET /templates", s.listTemplates)
	api("GET /templates/{templateID}", s.getTemplate)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.count("UNKNOWN")
		writeError(w, http.StatusNotFound, fmt.Sprintf("Route %s %s not found.", r.Method, r.URL.Path))
	})

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if port, id, ok := s.hostTarget(r.Host); ok {
			s.count("PROXY")
			s.proxy(w, r, id, port, r.URL.Path)
			return
		}
		if id, port, rest, ok := pathTarget(r.URL.Path); ok {
			s.count("PROXY")
			s.proxy(w, r, id, port, rest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (s *Server) counted(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.count(route)
		h.ServeHTTP(w, r)
	})
}

// authed checks the API key the way E2B and CubeSandbox accept it.
func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.APIKey == "" {
			h(w, r)
			return
		}
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
				key = b
			}
		}
		if key == "" {
			writeError(w, http.StatusUnauthorized, "Missing API key, please provide it in the X-API-Key header.")
			return
		}
		if subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.APIKey)) != 1 {
			writeError(w, http.StatusUnauthorized, "Invalid API key.")
			return
		}
		h(w, r)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) findTemplate(ref string) (Template, string, bool) {
	for _, t := range s.cfg.Templates {
		if t.ID == ref {
			return t, "", true
		}
		if slices.Contains(t.Aliases, ref) {
			return t, ref, true
		}
	}
	return Template{}, "", false
}

// createSpec is a validated create request.
type createSpec struct {
	tpl        Template
	alias      string
	timeout    time.Duration
	onTimeout  sandbox.OnTimeout
	autoResume bool
	secure     bool
	private    bool
	egress     *sandbox.Egress
	metadata   map[string]string
	envVars    map[string]string
	// hostDir is the host-mount directory agentd works in ("" none).
	hostDir string
}

// parseCreate validates a NewSandbox body like E2B's spec validation and
// create handler (and, in CubeSandbox mode, like CubeAPI).
func (s *Server) parseCreate(r *http.Request) (createSpec, error) {
	var req wireNewSandbox
	if err := decodeBody(r, &req, true); err != nil {
		return createSpec{}, err
	}
	if req.TemplateID == nil || *req.TemplateID == "" {
		return createSpec{}, badf("request body has an error: property \"templateID\" is missing")
	}
	var sp createSpec
	var ok bool
	sp.tpl, sp.alias, ok = s.findTemplate(*req.TemplateID)
	if !ok {
		return createSpec{}, statusError{http.StatusNotFound, fmt.Sprintf("Template '%s' not found.", *req.TemplateID)}
	}
	sp.timeout = defaultTimeout
	if s.cfg.CubeSandbox {
		sp.timeout = -1 // CubeAPI's shipped default: never
	}
	if req.Timeout != nil {
		switch t := *req.Timeout; {
		case t == -1 && s.cfg.CubeSandbox:
			sp.timeout = -1
		case t < 0:
			return createSpec{}, badf("request body has an error: property \"timeout\": number must be at least 0")
		case t == 0:
			return createSpec{}, badf("Timeout must be at least 1 second.")
		default:
			sp.timeout = time.Duration(t) * time.Second
		}
	}
	if req.AutoResume != nil && req.AutoResume.Enabled == nil {
		return createSpec{}, badf("request body has an error: property \"autoResume\": property \"enabled\" is missing")
	}
	var err error
	if sp.metadata, err = stringMap("metadata", req.Metadata); err != nil {
		return createSpec{}, err
	}
	if sp.envVars, err = stringMap("envVars", req.EnvVars); err != nil {
		return createSpec{}, err
	}
	for k := range sp.envVars {
		if !envVarName.MatchString(k) {
			return createSpec{}, badf("Invalid environment variable name %q.", k)
		}
	}
	if raw, ok := sp.metadata[MetaHostMount]; ok && s.cfg.CubeSandbox {
		if sp.hostDir, err = s.parseHostMount(raw); err != nil {
			return createSpec{}, err
		}
	}
	sp.secure = req.Secure != nil && *req.Secure
	sp.private = req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic
	if sp.private && !sp.secure {
		return createSpec{}, badf("You cannot create a sandbox without public access unless you enable secure sandbox access ('secure': true).")
	}
	if sp.egress, err = parseEgress(req); err != nil {
		return createSpec{}, err
	}
	sp.onTimeout = sandbox.OnTimeoutKill
	if req.AutoPause != nil && *req.AutoPause {
		sp.onTimeout = sandbox.OnTimeoutPause
	}
	if req.AutoResume != nil {
		sp.autoResume = *req.AutoResume.Enabled
	}
	// CubeAPI: lifecycle takes precedence over the flat fields. E2B does
	// not know the field and ignores it, so a client relying on it alone
	// would not get auto-pause there.
	if s.cfg.CubeSandbox && req.Lifecycle != nil {
		switch sandbox.OnTimeout(req.Lifecycle.OnTimeout) {
		case sandbox.OnTimeoutKill, sandbox.OnTimeoutPause:
			sp.onTimeout = sandbox.OnTimeout(req.Lifecycle.OnTimeout)
		case "":
		default:
			return createSpec{}, badf("lifecycle.onTimeout must be kill or pause.")
		}
		sp.autoResume = req.Lifecycle.AutoResume
	}
	return sp, nil
}

// stringMap refuses null values, which the spec's string maps do not allow
// (a Go client's map[string]*string or a JSON null from a script).
func stringMap(field string, in map[string]*string) (map[string]string, error) {
	if in == nil {
		return nil, nil
	}
	out := make(map[string]string, len(in))
	for k, v := range in {
		if v == nil {
			return nil, badf("request body has an error: property %q: property %q: value must be a string, not null", field, k)
		}
		out[k] = *v
	}
	return out, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	sp, err := s.parseCreate(r)
	if err != nil {
		writeBad(w, err)
		return
	}
	id := randomID(10)
	dir := filepath.Join(s.cfg.WorkDir, id)
	ws := filepath.Join(dir, "workspace")
	if sp.hostDir != "" {
		// The mounted directory is the workspace; only the state stays
		// in the sandbox's own directory (and goes with it).
		if err := s.prepareHostMount(sp.hostDir); err != nil {
			writeBad(w, err)
			return
		}
		ws = sp.hostDir
	}
	if err := errors.Join(os.MkdirAll(dir, 0o755), os.MkdirAll(ws, 0o755)); err != nil {
		writeError(w, http.StatusInternalServerError, "Cannot create the sandbox workspace.")
		return
	}
	// The process starts outside the lock: it takes a while and must not
	// stall other calls. Its lifetime is not the request's: a client that
	// gives up after sending still gets a sandbox, as at a real backend.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	proc, err := s.launcher.Launch(ctx, LaunchSpec{SandboxID: id, Workspace: ws, StateDir: dir, Env: sp.envVars})
	if err != nil {
		_ = os.RemoveAll(dir)
		s.cfg.Logger.Error("launch sandbox", "sandbox_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, "Failed to start the sandbox: "+err.Error())
		return
	}
	b := s.newBox(id, sp, proc)
	b.dir, b.workspace = dir, ws
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = proc.Kill()
		_ = os.RemoveAll(dir)
		writeError(w, http.StatusServiceUnavailable, "The backend is shutting down.")
		return
	}
	s.addLocked(b, s.nowLocked())
	out := s.wireSandboxLocked(b)
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, out)
}

// newBox builds a sandbox record from a validated request.
func (s *Server) newBox(id string, sp createSpec, proc Process) *box {
	b := &box{
		id:         id,
		tpl:        sp.tpl,
		alias:      sp.alias,
		clientID:   randomID(4),
		metadata:   sp.metadata,
		timeout:    sp.timeout,
		state:      sandbox.StateRunning,
		onTimeout:  sp.onTimeout,
		autoResume: sp.autoResume,
		egress:     sp.egress,
		proc:       proc,
	}
	if sp.secure {
		b.envdToken = randomID(16)
	}
	if sp.private {
		b.trafficToken = randomID(16)
	}
	return b
}

// addLocked registers b as started at start.
func (s *Server) addLocked(b *box, start time.Time) {
	s.seq++
	b.seq = s.seq
	b.startedAt = start
	if b.endAt.IsZero() && b.state == sandbox.StateRunning {
		b.endAt = endAfter(start, b.timeout)
	}
	s.sandboxes[b.id] = b
}

func (s *Server) wireSandboxLocked(b *box) wireSandbox {
	domain := s.cfg.Domain
	out := wireSandbox{
		SandboxID:       b.id,
		TemplateID:      b.tpl.ID,
		Alias:           b.alias,
		ClientID:        b.clientID,
		EnvdVersion:     b.tpl.envd(),
		EnvdAccessToken: b.envdToken,
		Domain:          &domain,
	}
	if b.trafficToken != "" {
		t := b.trafficToken
		out.TrafficAccessToken = &t
	}
	return out
}

func (b *box) listed() wireListedSandbox {
	out := wireListedSandbox{
		SandboxID:   b.id,
		TemplateID:  b.tpl.ID,
		Alias:       b.alias,
		ClientID:    b.clientID,
		StartedAt:   b.startedAt.UTC().Format(time.RFC3339Nano),
		CPUCount:    b.tpl.CPU,
		MemoryMB:    b.tpl.MemoryMB,
		DiskSizeMB:  b.tpl.DiskSizeMB,
		State:       string(b.state),
		EnvdVersion: b.tpl.envd(),
		Metadata:    copyMap(b.metadata),
	}
	// CubeSandbox omits endAt for sandboxes that never time out.
	if !b.endAt.IsZero() {
		out.EndAt = b.endAt.UTC().Format(time.RFC3339Nano)
	}
	return out
}

// listQuery is a validated list request.
type listQuery struct {
	metadata     map[string]string
	states       map[sandbox.State]bool
	template     string
	startedAfter time.Time
	asc          bool
	limit        int
	after        *cursor
}

func (q listQuery) matches(b *box) bool {
	if len(q.states) > 0 && !q.states[b.state] {
		return false
	}
	for k, v := range q.metadata {
		if got, ok := b.metadata[k]; !ok || got != v {
			return false
		}
	}
	if q.template != "" && q.template != b.tpl.ID && q.template != b.alias && !slices.Contains(b.tpl.Aliases, q.template) {
		return false
	}
	return q.startedAfter.IsZero() || b.startedAt.After(q.startedAfter)
}

// cursor is a page boundary: the last listed sandbox's start time and
// creation sequence, so a boundary survives sandboxes being killed between
// calls (E2B's token is start time and sandbox ID the same way).
type cursor struct {
	started time.Time
	seq     int64
}

func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.started.UTC().Format(time.RFC3339Nano) + "__" + strconv.FormatInt(c.seq, 10)))
}

func parseCursor(tok string) (*cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, badf("Invalid next token")
	}
	ts, seq, ok := strings.Cut(string(raw), "__")
	t, err1 := time.Parse(time.RFC3339Nano, ts)
	n, err2 := strconv.ParseInt(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return nil, badf("Invalid next token")
	}
	return &cursor{started: t, seq: n}, nil
}

// before orders sandboxes by start time, then creation.
func (c cursor) before(o cursor) bool {
	if !c.started.Equal(o.started) {
		return c.started.Before(o.started)
	}
	return c.seq < o.seq
}

func (b *box) cursor() cursor { return cursor{started: b.startedAt, seq: b.seq} }

// parseListQuery validates GET /v2/sandboxes' parameters like E2B's spec.
func (s *Server) parseListQuery(r *http.Request) (listQuery, error) {
	q := r.URL.Query()
	lq := listQuery{limit: 100}
	var err error
	if lq.metadata, err = parseMetadataFilter(q.Get("metadata")); err != nil {
		return lq, err
	}
	lq.states = map[sandbox.State]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			switch sandbox.State(st) {
			case sandbox.StateRunning, sandbox.StatePaused:
				lq.states[sandbox.State(st)] = true
			default:
				return lq, badf("parameter \"state\" in query has an error: value %q is not one of the allowed values [running paused]", st)
			}
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 || n > 100 {
			return lq, badf("parameter \"limit\" in query has an error: value %q must be an integer from 1 to 100", v)
		}
		lq.limit = int(n)
	}
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, badf("parameter \"order\" in query has an error: value %q is not one of the allowed values [asc desc]", o)
	}
	if v := q.Get("startedAfter"); v != "" {
		if lq.startedAfter, err = parseDateTime("startedAfter", v); err != nil {
			return lq, err
		}
	}
	lq.template = q.Get("template")
	if tok := q.Get("nextToken"); tok != "" && !s.cfg.IgnoreNextToken {
		if lq.after, err = parseCursor(tok); err != nil {
			return lq, err
		}
	}
	return lq, nil
}

// listedLocked returns the sandboxes q selects, newest first unless asc.
func (s *Server) listedLocked(q listQuery) []*box {
	out := make([]*box, 0, len(s.sandboxes))
	for _, b := range s.sandboxes {
		if q.matches(b) {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if q.asc {
			return out[i].cursor().before(out[j].cursor())
		}
		return out[j].cursor().before(out[i].cursor())
	})
	return out
}

// listV1 is GET /sandboxes: running sandboxes, newest first, optionally by
// metadata (CubeSandbox caps it at 200).
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	md, err := parseMetadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		writeBad(w, err)
		return
	}
	q := listQuery{metadata: md, states: map[sandbox.State]bool{sandbox.StateRunning: true}}
	s.mu.Lock()
	boxes := s.listedLocked(q)
	if s.cfg.CubeSandbox && len(boxes) > 200 {
		boxes = boxes[:200]
	}
	out := make([]wireListedSandbox, len(boxes))
	for i, b := range boxes {
		out[i] = b.listed()
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// listV2 is GET /v2/sandboxes with metadata, state, template and
// startedAfter filters, order and X-Next-Token paging. With IgnoreNextToken
// (CubeSandbox) the token is still sent but never read back.
func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	q, err := s.parseListQuery(r)
	if err != nil {
		writeBad(w, err)
		return
	}
	s.mu.Lock()
	boxes := s.listedLocked(q)
	if q.after != nil {
		i := sort.Search(len(boxes), func(i int) bool {
			c := boxes[i].cursor()
			if q.asc {
				return q.after.before(c)
			}
			return c.before(*q.after)
		})
		boxes = boxes[i:]
	}
	more := len(boxes) > q.limit
	if more {
		boxes = boxes[:q.limit]
	}
	out := make([]wireListedSandbox, len(boxes))
	for i, b := range boxes {
		out[i] = b.listed()
	}
	if more {
		w.Header().Set("X-Next-Token", boxes[len(boxes)-1].cursor().token())
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// lookupLocked finds a sandbox or writes E2B's 404.
func (s *Server) lookupLocked(w http.ResponseWriter, id string) (*box, bool) {
	b, ok := s.sandboxes[id]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox \"%s\" doesn't exist or you don't have access to it", id))
	}
	return b, ok
}

func (s *Server) detail(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.lookupLocked(w, r.PathValue("sandboxID"))
	if !ok {
		return
	}
	domain := s.cfg.Domain
	writeJSON(w, http.StatusOK, wireSandboxDetail{
		wireListedSandbox: b.listed(),
		EnvdAccessToken:   b.envdToken,
		Domain:            &domain,
		Lifecycle:         wireLifecycle{OnTimeout: string(b.onTimeout), AutoResume: b.autoResume},
	})
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.lookupLocked(w, r.PathValue("sandboxID"))
	if !ok {
		return
	}
	s.killLocked(b)
	w.WriteHeader(http.StatusNoContent)
}

// pause freezes a running sandbox; E2B answers 409 for a paused one. The
// optional body is validated ({"memory": bool}).
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var body wirePause
	if err := decodeBody(r, &body, false); err != nil {
		writeBad(w, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.lookupLocked(w, r.PathValue("sandboxID"))
	if !ok {
		return
	}
	if b.state == sandbox.StatePaused {
		writeError(w, http.StatusConflict, fmt.Sprintf("Error pausing sandbox - sandbox '%s' is already paused", b.id))
		return
	}
	if err := s.pauseLocked(b, s.nowLocked()); err != nil {
		s.cfg.Logger.Error("pause sandbox", "sandbox_id", b.id, "err", err)
		writeError(w, http.StatusInternalServerError, "Error pausing sandbox")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeTimeout reads a {"timeout": seconds} body, which the spec requires
// for connect and timeout (minimum 0; CubeSandbox also takes -1 for
// never). def, when given, is ResumedSandbox's default.
func (s *Server) decodeTimeout(r *http.Request, def *time.Duration) (time.Duration, error) {
	var t wireTimeout
	if err := decodeBody(r, &t, true); err != nil {
		return 0, err
	}
	if t.Timeout == nil {
		if def != nil {
			return *def, nil
		}
		return 0, badf("request body has an error: property \"timeout\" is missing")
	}
	switch v := *t.Timeout; {
	case v == -1 && s.cfg.CubeSandbox:
		return -1, nil
	case v < 0:
		return 0, badf("request body has an error: property \"timeout\": number must be at least 0")
	default:
		return time.Duration(v) * time.Second, nil
	}
}

// connect resumes a paused sandbox (201; CubeSandbox answers 200) or
// extends a running one's timeout when the new end is later (200).
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	timeout, err := s.decodeTimeout(r, nil)
	if err != nil {
		writeBad(w, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.lookupLocked(w, r.PathValue("sandboxID"))
	if !ok {
		return
	}
	if b.state == sandbox.StatePaused {
		if err := s.thawLocked(b, timeout); err != nil {
			writeError(w, http.StatusInternalServerError, "Failed to resume the sandbox.")
			return
		}
		status := http.StatusCreated
		if s.cfg.CubeSandbox {
			status = http.StatusOK
		}
		writeJSON(w, status, s.wireSandboxLocked(b))
		return
	}
	if end := endAfter(s.nowLocked(), timeout); timeout < 0 || (!b.endAt.IsZero() && end.After(b.endAt)) {
		b.endAt, b.timeout = end, timeout
	}
	writeJSON(w, http.StatusOK, s.wireSandboxLocked(b))
}

// resume is the older route: 201 for a paused sandbox, 409 for a running one.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	def := defaultTimeout
	timeout, err := s.decodeTimeout(r, &def)
	if err != nil {
		writeBad(w, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.lookupLocked(w, r.PathValue("sandboxID"))
	if !ok {
		return
	}
	if b.state != sandbox.StatePaused {
		writeError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is already running.", b.id))
		return
	}
	if err := s.thawLocked(b, timeout); err != nil {
		writeError(w, http.StatusInternalServerError, "Failed to resume the sandbox.")
		return
	}
	writeJSON(w, http.StatusCreated, s.wireSandboxLocked(b))
}

// setTimeout sets endAt to now+timeout (it may shorten it); 0 expires the
// sandbox now, -1 never (CubeSandbox). E2B keeps timeouts only for running
// sandboxes, so a paused one is 404 there: resume it with connect.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	timeout, err := s.decodeTimeout(r, nil)
	if err != nil {
		writeBad(w, err)
		return
	}
	s.mu.Lock()
	b, ok := s.sandboxes[r.PathValue("sandboxID")]
	if !ok || b.state != sandbox.StateRunning {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "Sandbox not found")
		return
	}
	b.timeout = timeout
	b.endAt = endAfter(s.nowLocked(), timeout)
	s.mu.Unlock()
	if timeout == 0 {
		s.Tick()
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateTimes is when every fake template was created and built.
var templateTimes = time.Unix(0, 0).UTC().Format(time.RFC3339)

func (t Template) buildID() string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("e2bfake:template:"+t.ID)).String()
}

func (t Template) envd() string {
	if t.EnvdVersion != "" {
		return t.EnvdVersion
	}
	return envdVersion
}

func (t Template) aliases() []string {
	if t.Aliases == nil {
		return []string{}
	}
	return t.Aliases
}

func (s *Server) wireTemplate(t Template) wireTemplate {
	return wireTemplate{
		TemplateID:  t.ID,
		BuildID:     t.buildID(),
		CPUCount:    t.CPU,
		MemoryMB:    t.MemoryMB,
		DiskSizeMB:  t.DiskSizeMB,
		Aliases:     t.aliases(),
		Names:       t.aliases(),
		CreatedAt:   templateTimes,
		UpdatedAt:   templateTimes,
		BuildCount:  1,
		BuildStatus: "ready",
		EnvdVersion: t.envd(),
	}
}

func (s *Server) listTemplates(w http.ResponseWriter, _ *http.Request) {
	out := make([]wireTemplate, 0, len(s.cfg.Templates))
	for _, t := range s.cfg.Templates {
		out = append(out, s.wireTemplate(t))
	}
	writeJSON(w, http.StatusOK, out)
}

// getTemplate answers E2B's TemplateWithBuilds: sizes and status live in
// the builds, not at the top level.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, _, ok := s.findTemplate(r.PathValue("templateID"))
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Template '%s' not found.", r.PathValue("templateID")))
		return
	}
	writeJSON(w, http.StatusOK, wireTemplateWithBuilds{
		TemplateID: t.ID,
		Aliases:    t.aliases(),
		Names:      t.aliases(),
		CreatedAt:  templateTimes,
		UpdatedAt:  templateTimes,
		Builds: []wireTemplateBuild{{
			BuildID:     t.buildID(),
			Status:      "ready",
			CreatedAt:   templateTimes,
			UpdatedAt:   templateTimes,
			FinishedAt:  templateTimes,
			CPUCount:    t.CPU,
			MemoryMB:    t.MemoryMB,
			DiskSizeMB:  t.DiskSizeMB,
			EnvdVersion: t.envd(),
		}},
	})
}

// parseEgress reads the create's outgoing-traffic settings (network's
// allowOut and denyOut, allow_internet_access): nil when it sets none.
// Each host must be an address, a CIDR or a host name.
func parseEgress(req wireNewSandbox) (*sandbox.Egress, error) {
	var allowOut, denyOut []string
	if req.Network != nil {
		allowOut, denyOut = req.Network.AllowOut, req.Network.DenyOut
	}
	if allowOut == nil && denyOut == nil && req.AllowInternetAccess == nil {
		return nil, nil
	}
	for _, list := range [][]string{allowOut, denyOut} {
		for _, h := range list {
			if !egressHost(h) {
				return nil, badf("request body has an error: network: %q is not an IP address, a CIDR block or a domain name", h)
			}
		}
	}
	e := &sandbox.Egress{AllowInternetAccess: true, AllowOut: allowOut, DenyOut: denyOut}
	if req.AllowInternetAccess != nil {
		e.AllowInternetAccess = *req.AllowInternetAccess
	}
	return e, nil
}

// egressHost reports whether h is an address, a CIDR block or a domain
// name (optionally *.-prefixed).
func egressHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if _, err := netip.ParsePrefix(h); err == nil {
		return true
	}
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || strings.Trim(label, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
			return false
		}
	}
	return true
}
