package console

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
)

// LocalSandboxes is the built-in local sandbox backend for newcomers: the
// in-repo fake E2B backend, whose sandboxes are agentd processes on this
// machine with a directory each. It isolates nothing; it exists so that
// per-session sandboxes (create, pause, resume, reclaim) can be tried
// with no other set-up. Its address and secrets are kept in the data
// directory so an environment registered once keeps working across
// restarts (the sandboxes themselves do not survive one).
type LocalSandboxes struct {
	Server *e2bfake.Server
	// APIKey and AgentdToken are what to register the environment with.
	APIKey      string
	AgentdToken string
}

type localState struct {
	Addr        string `json:"addr"`
	APIKey      string `json:"api_key"`
	AgentdToken string `json:"agentd_token"`
}

// StartLocalSandboxes starts the local backend with its state under
// dataDir/local-sandboxes.
func StartLocalSandboxes(dataDir string, logger *slog.Logger) (*LocalSandboxes, error) {
	dir := filepath.Join(dataDir, "local-sandboxes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	bin, err := findAgentd(dir)
	if err != nil {
		return nil, err
	}
	statePath := filepath.Join(dir, "backend.json")
	var st localState
	if b, err := os.ReadFile(statePath); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	if st.APIKey == "" || st.AgentdToken == "" {
		st.APIKey, st.AgentdToken = "local_"+rand.Text(), rand.Text()
	}
	cfg := e2bfake.Config{APIKey: st.APIKey, AgentdToken: st.AgentdToken, AgentdBinary: bin, WorkDir: filepath.Join(dir, "sandboxes"),
		TickInterval: time.Second, Addr: st.Addr, Logger: logger}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	srv, err := e2bfake.New(cfg)
	if err != nil && st.Addr != "" {
		// The saved port is taken: take another and save it.
		cfg.Addr = ""
		srv, err = e2bfake.New(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	st.Addr = srv.Addr()
	b, _ := json.Marshal(st)
	if err := os.WriteFile(statePath, b, 0o600); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	return &LocalSandboxes{Server: srv, APIKey: st.APIKey, AgentdToken: st.AgentdToken}, nil
}

// findAgentd looks for agentd next to the console's executable, then on
// PATH, and otherwise builds ./cmd/agentd when run from the source tree
// (go run ./cmd/console).
func findAgentd(dir string) (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "agentd")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("agentd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat(filepath.Join("cmd", "agentd")); err != nil {
		return "", errors.New("local sandboxes: no agentd binary next to the console or on PATH; build it with: go build -o <dir of the console>/agentd ./cmd/agentd")
	}
	out := filepath.Join(dir, "agentd")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/agentd")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("local sandboxes: go build ./cmd/agentd: %v: %s", err, msg)
	}
	return out, nil
}

// Describe says, for the start-up log, what the backend is and how to
// register it.
func (l *LocalSandboxes) Describe() string {
	return fmt.Sprintf("LOCAL SANDBOX BACKEND (agentd processes on this machine, NO isolation; for trying Gatehouse only). "+
		"Register a sandbox environment with: API URL %s, proxy base URL %s, scheme http, API key %s, agentd token %s, then import template \"base\".",
		l.Server.URL(), l.Server.ProxyURL(), l.APIKey, l.AgentdToken)
}

// Close kills the local sandboxes and stops the backend.
func (l *LocalSandboxes) Close() error { return l.Server.Close() }
