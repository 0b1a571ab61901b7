// Package e2bfaketest helps tests run the fake sandbox backend with real
// agentd processes: it builds cmd/agentd once per test binary and starts
// fakes that close at test cleanup.
//
// The test binary can stand in for agentd (a minimal server speaking the
// same launch contract and the subset of POST /v1/sessions the sandbox
// tests use), but only with GATEHOUSE_ALLOW_AGENTD_STANDIN=1, while hacking
// on agentd; by default a broken agentd build fails the tests.
package e2bfaketest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
)

// standInEnv marks a process started as the stand-in agentd.
const standInEnv = "GATEHOUSE_E2BFAKE_STANDIN_AGENTD"

// Token is the agentd bearer token fakes started by New use.
const Token = "test-agentd-token"

// APIKey is the backend API key fakes started by New require.
const APIKey = "e2b_test_key"

// Binary is the agentd executable for a test run.
type Binary struct {
	Path string
	// Env must be passed to the fake as AgentdEnv.
	Env []string
	// StandIn is true when Path is the test binary standing in for agentd;
	// Reason says why the real one was not used.
	StandIn bool
	Reason  string
}

// Main is TestMain for packages that run fakes: it serves as the stand-in
// agentd when started as one, otherwise builds agentd into a temporary
// directory, runs the tests and cleans up. The binary is passed to run.
func Main(m *testing.M, set func(Binary)) {
	if os.Getenv(standInEnv) == "1" {
		os.Exit(serveStandIn(os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "gatehouse-agentd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2bfaketest:", err)
		os.Exit(1)
	}
	bin, err := BuildAgentd(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2bfaketest:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	if bin.StandIn {
		fmt.Fprintf(os.Stderr, "e2bfaketest: using the stand-in agentd: %s\n", bin.Reason)
	}
	set(bin)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// BuildAgentd builds ./cmd/agentd of the enclosing module into dir. When it
// does not build it fails, unless GATEHOUSE_ALLOW_AGENTD_STANDIN=1 asks for
// the stand-in.
func BuildAgentd(dir string) (Binary, error) {
	root, err := moduleRoot()
	if err != nil {
		return Binary{}, err
	}
	out := filepath.Join(dir, "agentd")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/agentd")
	cmd.Dir = root
	msg, err := cmd.CombinedOutput()
	if err == nil {
		return Binary{Path: out}, nil
	}
	reason := fmt.Sprintf("go build ./cmd/agentd: %v: %s", err, bytes.TrimSpace(msg))
	if os.Getenv("GATEHOUSE_ALLOW_AGENTD_STANDIN") != "1" {
		return Binary{}, errors.New(reason)
	}
	self, err := os.Executable()
	if err != nil {
		return Binary{}, fmt.Errorf("locate test binary: %w", err)
	}
	return Binary{Path: self, Env: []string{standInEnv + "=1"}, StandIn: true, Reason: reason}, nil
}

// moduleRoot walks up from the working directory to go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("e2bfaketest: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// New starts a fake backend running bin, with APIKey and Token unless cfg
// sets its own, and closes it when the test ends.
func New(t testing.TB, bin Binary, cfg e2bfake.Config) *e2bfake.Server {
	t.Helper()
	if cfg.AgentdBinary == "" && cfg.Launcher == nil {
		cfg.AgentdBinary = bin.Path
		cfg.AgentdEnv = append(cfg.AgentdEnv, bin.Env...)
	}
	if cfg.AgentdToken == "" {
		cfg.AgentdToken = Token
	}
	if cfg.APIKey == "" {
		cfg.APIKey = APIKey
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = t.TempDir()
	}
	f, err := e2bfake.New(cfg)
	if err != nil {
		t.Fatalf("start fake backend: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close fake backend: %v", err)
		}
	})
	return f
}

// ManualClock is a clock tests set by hand.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock starts at t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{now: t} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// StubLauncher starts in-process HTTP servers instead of agentd, for tests
// of the API layer that need no real process. Each answers any request with
// 200 and the text "stub <sandboxID> <path>", except agentd's rekey
// (POST /v1/token), which it takes with 204 as a fresh agentd does: the
// console rekeys every sandbox it creates and kills one that refuses.
type StubLauncher struct{}

// Launch starts one stub.
func (StubLauncher) Launch(_ context.Context, spec e2bfake.LaunchSpec) (e2bfake.Process, error) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/token" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		fmt.Fprintf(w, "stub %s %s", spec.SandboxID, r.URL.Path)
	})}
	ln, err := listenLoopback()
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.Serve(ln) }()
	return &stubProcess{srv: srv, addr: ln.Addr().String()}, nil
}

type stubProcess struct {
	srv  *http.Server
	addr string
}

func (p *stubProcess) Addr() string  { return p.addr }
func (p *stubProcess) PID() int      { return 0 }
func (p *stubProcess) Freeze() error { return nil }
func (p *stubProcess) Thaw() error   { return nil }
func (p *stubProcess) Kill() error   { return p.srv.Close() }
