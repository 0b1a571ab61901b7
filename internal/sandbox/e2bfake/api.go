package e2bfake

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// defaultTimeout is NewSandbox.timeout's default in E2B's OpenAPI document.
const defaultTimeout = 15 * time.Second

// envdVersion is what the fake reports as the in-sandbox daemon version.
const envdVersion = "0.2.0"

// envVarName is CubeSandbox's rule for envVars names.
var envVarName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Wire types, per E2B's OpenAPI document (spec/openapi.yml, e2b-dev/infra).

type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type wireAutoResume struct {
	Enabled bool `json:"enabled"`
}

type wireNetwork struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
}

type wireLifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

type wireNewSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int32            `json:"timeout"`
	AutoPause           bool              `json:"autoPause"`
	AutoResume          *wireAutoResume   `json:"autoResume"`
	Secure              bool              `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *wireNetwork      `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Lifecycle           *wireLifecycle    `json:"lifecycle"`
}

type wireSandbox struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

type wireListedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   string            `json:"startedAt"`
	EndAt       string            `json:"endAt,omitempty"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

type wireSandboxDetail struct {
	wireListedSandbox
	EnvdAccessToken string        `json:"envdAccessToken,omitempty"`
	Domain          *string       `json:"domain"`
	Lifecycle       wireLifecycle `json:"lifecycle"`
}

type wireTimeout struct {
	Timeout *int32 `json:"timeout"`
}

type wireTemplate struct {
	TemplateID    string   `json:"templateID"`
	BuildID       string   `json:"buildID"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int      `json:"memoryMB"`
	DiskSizeMB    int      `json:"diskSizeMB"`
	Public        bool     `json:"public"`
	Aliases       []string `json:"aliases"`
	Names         []string `json:"names"`
	CreatedAt     string   `json:"createdAt"`
	UpdatedAt     string   `json:"updatedAt"`
	CreatedBy     *string  `json:"createdBy"`
	LastSpawnedAt *string  `json:"lastSpawnedAt"`
	SpawnCount    int64    `json:"spawnCount"`
	BuildCount    int32    `json:"buildCount"`
	BuildStatus   string   `json:"buildStatus"`
	EnvdVersion   string   `json:"envdVersion"`
}

// routes builds the whole surface: proxy traffic is recognised first (by
// Host or by the /sandbox/ path prefix), everything else is the API.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	api := func(pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, s.counted(pattern, s.authed(h)))
	}
	if !s.cfg.NoHealthRoute {
		mux.Handle("GET /health", s.counted("GET /health", http.HandlerFunc(s.health)))
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
		for _, a := range t.Aliases {
			if a == ref {
				return t, a, true
			}
		}
	}
	return Template{}, "", false
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req wireNewSandbox
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "Invalid request body: "+err.Error())
		return
	}
	if req.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required.")
		return
	}
	tpl, alias, ok := s.findTemplate(req.TemplateID)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Template '%s' not found.", req.TemplateID))
		return
	}
	timeout := defaultTimeout
	if req.Timeout != nil {
		switch t := *req.Timeout; {
		case t == -1:
			timeout = -1 // CubeSandbox: never times out
		case t < 0:
			writeError(w, http.StatusBadRequest, "timeout must be at least 0.")
			return
		default:
			timeout = time.Duration(t) * time.Second
		}
	}
	for k := range req.EnvVars {
		if !envVarName.MatchString(k) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("Invalid environment variable name %q.", k))
			return
		}
	}
	onTimeout, autoResume := sandbox.OnTimeoutKill, false
	if req.AutoPause {
		onTimeout = sandbox.OnTimeoutPause
	}
	if req.AutoResume != nil {
		autoResume = req.AutoResume.Enabled
	}
	// CubeSandbox: lifecycle takes precedence over the flat fields.
	if req.Lifecycle != nil {
		switch sandbox.OnTimeout(req.Lifecycle.OnTimeout) {
		case sandbox.OnTimeoutKill, sandbox.OnTimeoutPause:
			onTimeout = sandbox.OnTimeout(req.Lifecycle.OnTimeout)
		case "":
		default:
			writeError(w, http.StatusBadRequest, "lifecycle.onTimeout must be kill or pause.")
			return
		}
		autoResume = req.Lifecycle.AutoResume
	}

	id := randomID(10)
	dir := filepath.Join(s.cfg.WorkDir, id)
	ws := filepath.Join(dir, "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		writeError(w, http.StatusInternalServerError, "Cannot create the sandbox workspace.")
		return
	}
	// The process starts outside the lock: it takes a while and must not
	// stall other calls. Its lifetime is not the request's.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	proc, err := s.launcher.Launch(ctx, LaunchSpec{SandboxID: id, Workspace: ws, StateDir: dir, Env: req.EnvVars})
	if err != nil {
		_ = os.RemoveAll(dir)
		s.cfg.Logger.Error("launch sandbox", "sandbox_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, "Failed to start the sandbox: "+err.Error())
		return
	}

	b := &box{
		id:         id,
		tpl:        tpl,
		alias:      alias,
		clientID:   randomID(4),
		metadata:   copyMap(req.Metadata),
		timeout:    timeout,
		state:      sandbox.StateRunning,
		onTimeout:  onTimeout,
		autoResume: autoResume,
		envdToken:  randomID(16),
		dir:        dir,
		workspace:  ws,
		proc:       proc,
	}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic {
		b.trafficToken = randomID(16)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = proc.Kill()
		_ = os.RemoveAll(dir)
		writeError(w, http.StatusServiceUnavailable, "The backend is shutting down.")
		return
	}
	s.seq++
	b.seq = s.seq
	b.startedAt = s.nowLocked()
	b.endAt = endAfter(b.startedAt, timeout)
	s.sandboxes[id] = b
	out := s.wireSandboxLocked(b)
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) wireSandboxLocked(b *box) wireSandbox {
	domain := s.cfg.Domain
	out := wireSandbox{
		SandboxID:       b.id,
		TemplateID:      b.tpl.ID,
		Alias:           b.alias,
		ClientID:        b.clientID,
		EnvdVersion:     b.envdVersion(),
		EnvdAccessToken: b.envdToken,
		Domain:          &domain,
	}
	if b.trafficToken != "" {
		t := b.trafficToken
		out.TrafficAccessToken = &t
	}
	return out
}

func (b *box) envdVersion() string {
	if b.tpl.EnvdVersion != "" {
		return b.tpl.EnvdVersion
	}
	return envdVersion
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
		EnvdVersion: b.envdVersion(),
		Metadata:    copyMap(b.metadata),
	}
	// CubeSandbox omits endAt for sandboxes that never time out.
	if !b.endAt.IsZero() {
		out.EndAt = b.endAt.UTC().Format(time.RFC3339Nano)
	}
	return out
}

// parseMetadataFilter reads the metadata parameter: one urlencoded query
// string of k=v pairs, all of which must match.
func parseMetadataFilter(raw string) (url.Values, error) {
	if raw == "" {
		return nil, nil
	}
	return url.ParseQuery(raw)
}

func matches(b *box, md url.Values, states map[sandbox.State]bool) bool {
	if len(states) > 0 && !states[b.state] {
		return false
	}
	for k, vs := range md {
		for _, v := range vs {
			if got, ok := b.metadata[k]; !ok || got != v {
				return false
			}
		}
	}
	return true
}

// listV1 is GET /sandboxes: running sandboxes, optionally by metadata.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	md, err := parseMetadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "Invalid metadata filter.")
		return
	}
	s.mu.Lock()
	out := []wireListedSandbox{}
	for _, b := range s.sortedLocked() {
		if matches(b, md, map[sandbox.State]bool{sandbox.StateRunning: true}) && len(out) < 200 {
			out = append(out, b.listed())
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// listV2 is GET /v2/sandboxes with metadata and state filters and
// X-Next-Token paging. Tokens are opaque to clients; here they encode the
// creation sequence number of the page's last sandbox, so a page boundary
// survives sandboxes being killed between calls.
func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	md, err := parseMetadataFilter(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "Invalid metadata filter.")
		return
	}
	states := map[sandbox.State]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			switch sandbox.State(st) {
			case sandbox.StateRunning, sandbox.StatePaused:
				states[sandbox.State(st)] = true
			case "":
			default:
				writeError(w, http.StatusBadRequest, fmt.Sprintf("Invalid state %q.", st))
				return
			}
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 100.")
			return
		}
		limit = n
	}
	var after int64
	if tok := q.Get("nextToken"); tok != "" && !s.cfg.IgnoreNextToken {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err == nil {
			after, err = strconv.ParseInt(string(b), 10, 64)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "Invalid next token.")
			return
		}
	}

	s.mu.Lock()
	out := []wireListedSandbox{}
	var last int64
	more := false
	for _, b := range s.sortedLocked() {
		if b.seq <= after || !matches(b, md, states) {
			continue
		}
		if len(out) == limit {
			more = true
			break
		}
		out = append(out, b.listed())
		last = b.seq
	}
	s.mu.Unlock()
	if more {
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(last, 10))))
	}
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

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.lookupLocked(w, r.PathValue("sandboxID"))
	if !ok {
		return
	}
	if b.state == sandbox.StatePaused {
		writeError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is already paused.", b.id))
		return
	}
	if err := b.proc.Freeze(); err != nil {
		s.cfg.Logger.Error("pause sandbox", "sandbox_id", b.id, "err", err)
		writeError(w, http.StatusInternalServerError, "Failed to pause the sandbox.")
		return
	}
	b.state = sandbox.StatePaused
	w.WriteHeader(http.StatusNoContent)
}

// decodeTimeout reads a {"timeout": seconds} body; missing means required
// unless def is given.
func decodeTimeout(r *http.Request, def *time.Duration) (time.Duration, error) {
	var t wireTimeout
	if err := json.NewDecoder(r.Body).Decode(&t); err != nil {
		if def != nil && errors.Is(err, io.EOF) {
			return *def, nil
		}
		return 0, fmt.Errorf("invalid request body: %w", err)
	}
	if t.Timeout == nil {
		if def != nil {
			return *def, nil
		}
		return 0, fmt.Errorf("timeout is required")
	}
	switch v := *t.Timeout; {
	case v == -1:
		return -1, nil
	case v < 0:
		return 0, fmt.Errorf("timeout must be at least 0")
	default:
		return time.Duration(v) * time.Second, nil
	}
}

// connect resumes a paused sandbox (201) or extends a running one's
// timeout when the new end is later (200).
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	timeout, err := decodeTimeout(r, nil)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
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
		writeJSON(w, http.StatusCreated, s.wireSandboxLocked(b))
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
	timeout, err := decodeTimeout(r, &def)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
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
// sandbox now, -1 never (CubeSandbox).
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	timeout, err := decodeTimeout(r, nil)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	b, ok := s.lookupLocked(w, r.PathValue("sandboxID"))
	if !ok {
		s.mu.Unlock()
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

func (s *Server) wireTemplate(t Template) wireTemplate {
	created := time.Unix(0, 0).UTC().Format(time.RFC3339)
	v := t.EnvdVersion
	if v == "" {
		v = envdVersion
	}
	aliases := t.Aliases
	if aliases == nil {
		aliases = []string{}
	}
	return wireTemplate{
		TemplateID:  t.ID,
		BuildID:     "build-" + t.ID,
		CPUCount:    t.CPU,
		MemoryMB:    t.MemoryMB,
		DiskSizeMB:  t.DiskSizeMB,
		Aliases:     aliases,
		Names:       aliases,
		CreatedAt:   created,
		UpdatedAt:   created,
		BuildCount:  1,
		BuildStatus: "ready",
		EnvdVersion: v,
	}
}

func (s *Server) listTemplates(w http.ResponseWriter, _ *http.Request) {
	out := make([]wireTemplate, 0, len(s.cfg.Templates))
	for _, t := range s.cfg.Templates {
		out = append(out, s.wireTemplate(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, _, ok := s.findTemplate(r.PathValue("templateID"))
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Template '%s' not found.", r.PathValue("templateID")))
		return
	}
	writeJSON(w, http.StatusOK, s.wireTemplate(t))
}
