package handlers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

const (
	adminEmail    = "root@example.com"
	adminPassword = "correct horse battery staple"
)

// testEnv is a console assembled exactly as main builds it, served over a
// real HTTP listener.
type testEnv struct {
	t   *testing.T
	c   *console.Console
	srv *httptest.Server
	cfg config.Config
	// logs holds everything the console logged, for secret-leak checks.
	logs *lockedBuffer
}

// lockedBuffer is a goroutine-safe log sink.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newEnv builds a console on dialect d: the embedded SQLite default in a
// temp dir, or a fresh Postgres catalog database whose org databases carry
// a per-test prefix and are dropped at cleanup. The admin is adminEmail
// with adminPassword unless an option changes the config.
func newEnv(t *testing.T, d store.Dialect, opts ...func(*config.Config)) *testEnv {
	t.Helper()
	cfg := config.Config{DataDir: t.TempDir(), AdminEmail: adminEmail, AdminPassword: adminPassword, TokenTTL: time.Hour,
		PasswordCost: testPasswordCost}
	cfg.OrgDBPrefix = storetest.NewName("gh_test_org_") + "_"
	if d == store.Postgres {
		cfg.DatabaseURL = storetest.DSN(t, store.Postgres)
		cfg.MasterKey = randomHex(32)
		storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
	}
	// Options see the whole config (a test may reroute DATABASE_URL).
	for _, o := range opts {
		o(&cfg)
	}
	logs := &lockedBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := console.New(context.Background(), cfg, logger)
	if err != nil {
		t.Fatalf("console.New: %v", err)
	}
	// Failed logins are slowed with real sleeps in production.
	c.Platform.Sleep = func(context.Context, time.Duration) {}
	srv := httptest.NewServer(validateAPI(t, c.Handler()))
	t.Cleanup(func() {
		srv.Close()
		c.Close()
	})
	return &testEnv{t: t, c: c, srv: srv, cfg: cfg, logs: logs}
}

// testPasswordCost makes the tests' thousands of password hashes cheap
// (the production cost is 19 MiB and two passes each, a minute in all
// under the race detector); auth's tests hold the default.
var testPasswordCost = auth.PasswordCost{Time: 1, MemoryKiB: 64}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// response is a finished HTTP exchange with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// errorEnvelope is the API's error shape.
type errorEnvelope struct {
	Error struct {
		Code    string            `json:"code"`
		Message string            `json:"message"`
		Fields  map[string]string `json:"fields"`
	} `json:"error"`
}

// envelope decodes the error envelope, failing when the body is not one.
func (r response) envelope(t *testing.T) errorEnvelope {
	t.Helper()
	var e errorEnvelope
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("status %d: body is not the error envelope {\"error\":{\"code\",\"message\"}}: %s (%v)", r.status, r.body, err)
	}
	return e
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("status %d: decode %s: %v", r.status, r.body, err)
	}
}

// request describes one call; zero fields are left out.
type request struct {
	method      string
	path        string
	body        io.Reader
	contentType string
	token       string
	header      http.Header
	cookies     []*http.Cookie
}

func (e *testEnv) do(r request) response {
	e.t.Helper()
	req, err := http.NewRequest(r.method, e.srv.URL+r.path, r.body)
	if err != nil {
		e.t.Fatal(err)
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	for k, vs := range r.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	for _, ck := range r.cookies {
		req.AddCookie(ck)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// json sends v as a JSON body with the bearer token.
func (e *testEnv) json(method, path, token string, v any) response {
	e.t.Helper()
	var body io.Reader
	ct := ""
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			e.t.Fatal(err)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	return e.do(request{method: method, path: path, body: body, contentType: ct, token: token})
}

type loginResult struct {
	Token              string    `json:"token"`
	ExpiresAt          time.Time `json:"expires_at"`
	MustChangePassword bool      `json:"must_change_password"`
}

// login signs in through the API and returns the token.
func (e *testEnv) login(email, password string) loginResult {
	e.t.Helper()
	r := e.json(http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": email, "password": password})
	if r.status != http.StatusOK {
		e.t.Fatalf("login %s: status %d: %s", email, r.status, r.body)
	}
	var res loginResult
	r.decode(e.t, &res)
	if res.Token == "" {
		e.t.Fatalf("login returned no token: %s", r.body)
	}
	return res
}

func (e *testEnv) adminToken() string {
	e.t.Helper()
	return e.login(adminEmail, adminPassword).Token
}

func (e *testEnv) createOrg(token, slug, name string) {
	e.t.Helper()
	r := e.json(http.MethodPost, "/api/v1/orgs", token, map[string]string{"slug": slug, "name": name})
	if r.status != http.StatusCreated {
		e.t.Fatalf("create org %s: status %d: %s", slug, r.status, r.body)
	}
}

func wantStatus(t *testing.T, what string, r response, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: status %d, want %d; body: %s", what, r.status, want, r.body)
	}
}

func mustContain(t *testing.T, what, got string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(strings.ToLower(got), strings.ToLower(s)) {
			t.Errorf("%s: %q does not mention %q", what, got, s)
		}
	}
}
