package console

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"time"

	"github.com/gatehouse/gatehouse/internal/handlers"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
)

// LocalSandboxes is the built-in local sandbox backend for newcomers: the
// in-repo fake E2B backend, whose sandboxes are agentd processes on this
// machine with a directory each. It isolates nothing (they run as the
// console's user); it exists so that per-session sandboxes (create, pause,
// resume, reclaim) can be tried with no other set-up. What it does keep
// from them is what the console need not hand out: its environment (the
// master key, the database URL, the admin password) and a path to the
// backend's own files from theirs. Its address and secrets are kept in the
// data directory so an environment registered once keeps working across
// restarts (the sandboxes themselves do not survive one).
type LocalSandboxes struct {
	Server *e2bfake.Server
	// APIKey and AgentdToken are what to register the environment with.
	APIKey      string
	AgentdToken string
	// Sandboxes is the directory holding one directory per sandbox, made
	// for this run outside the data directory and removed by Close.
	Sandboxes string
	// State is backend.json (0600): the address, API key and agentd
	// token, which the start-up log names instead of printing them.
	State string
}

type localState struct {
	Addr        string `json:"addr"`
	APIKey      string `json:"api_key"`
	AgentdToken string `json:"agentd_token"`
}

// StartLocalSandboxes starts the local backend with its state under
// dataDir/local-sandboxes (0700, backend.json 0600) and its sandboxes in a
// new directory under the system's temporary directory: a sandbox's
// working directory is then no relative path away from backend.json, the
// agentd binary or the databases. A sandbox can still name them by their
// absolute paths and, running as the same user, read them; that is what
// "no isolation" means, and docs/sessions.md says so.
func StartLocalSandboxes(dataDir string, logger *slog.Logger) (*LocalSandboxes, error) {
	return StartLocalSandboxesFrom(dataDir, "", logger)
}

// StartLocalSandboxesFrom is StartLocalSandboxes running the agentd binary
// at agentdPath ("" finds or builds one, as findAgentd says).
func StartLocalSandboxesFrom(dataDir, agentdPath string, logger *slog.Logger) (*LocalSandboxes, error) {
	// Absolute: the agentd binary found or built under it is started from
	// each sandbox's own directory.
	dir, err := filepath.Abs(filepath.Join(dataDir, "local-sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	// MkdirAll leaves an existing directory's mode alone; an older version
	// made this one the sandboxes' parent.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	bin := agentdPath
	if bin == "" {
		if bin, err = findAgentd(dir); err != nil {
			return nil, err
		}
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	statePath := filepath.Join(dir, "backend.json")
	var st localState
	if b, err := os.ReadFile(statePath); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	if st.APIKey == "" || st.AgentdToken == "" {
		st.APIKey, st.AgentdToken = "local_"+rand.Text(), rand.Text()
	}
	work, err := os.MkdirTemp("", "gatehouse-local-sandboxes-")
	if err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	cfg := e2bfake.Config{APIKey: st.APIKey, AgentdToken: st.AgentdToken, AgentdBinary: bin, WorkDir: work,
		AgentdEnviron: sandboxEnviron, TickInterval: time.Second, Addr: st.Addr, Logger: logger}
	srv, err := e2bfake.New(cfg)
	if err != nil && st.Addr != "" {
		// The saved port is taken: take another and save it.
		cfg.Addr = ""
		srv, err = e2bfake.New(cfg)
	}
	if err != nil {
		_ = os.RemoveAll(work)
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	l := &LocalSandboxes{Server: srv, APIKey: st.APIKey, AgentdToken: st.AgentdToken, Sandboxes: work, State: statePath}
	st.Addr = srv.Addr()
	b, _ := json.Marshal(st)
	if err := errors.Join(os.WriteFile(statePath, b, 0o600), os.Chmod(statePath, 0o600)); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}
	return l, nil
}

// sandboxPath is the PATH of local sandboxes: the usual system directories,
// not the console's own PATH, which may name directories of its deployment.
const sandboxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sandboxEnviron is the whole environment a local sandbox's agentd, and so
// every command in it, starts with: what a shell needs and nothing of the
// console's. The console's own environment holds GATEHOUSE_MASTER_KEY,
// DATABASE_URL, the admin password and whatever its deployment added;
// a sandbox inheriting it could open every org's secrets. HOME and TMPDIR
// are directories of the sandbox (removed with it), so tools that write
// there do not write into the console user's home.
func sandboxEnviron(spec e2bfake.LaunchSpec) ([]string, error) {
	home, tmp := filepath.Join(spec.StateDir, "home"), filepath.Join(spec.StateDir, "tmp")
	if err := errors.Join(os.MkdirAll(home, 0o700), os.MkdirAll(tmp, 0o700)); err != nil {
		return nil, err
	}
	lang := "C.UTF-8"
	// A locale name is no secret, and a sandbox in the console's language
	// is what a newcomer expects; anything odd falls back to C.UTF-8.
	if l := os.Getenv("LANG"); localeRE.MatchString(l) {
		lang = l
	}
	env := []string{"PATH=" + sandboxPath, "HOME=" + home, "TMPDIR=" + tmp, "LANG=" + lang, "TERM=dumb", "SHELL=/bin/sh"}
	if u, err := user.Current(); err == nil {
		env = append(env, "USER="+u.Username, "LOGNAME="+u.Username)
	}
	return env, nil
}

// localeRE is what a locale name looks like (C, POSIX, en_US.UTF-8,
// de_DE@euro).
var localeRE = regexp.MustCompile(`^[A-Za-z]{1,8}(_[A-Za-z]{2})?(\.[A-Za-z0-9-]{1,16})?(@[A-Za-z0-9]{1,16})?$`)

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
// register it. The API key and agentd token are named by the file that
// holds them, never printed: the agentd token runs commands as the
// console's user, and logs travel further than the data directory.
func (l *LocalSandboxes) Describe() string {
	return fmt.Sprintf("LOCAL SANDBOX BACKEND (agentd processes on this machine, NO isolation; for trying Gatehouse only). "+
		"The environments page registers it in one action; by hand: API URL %s, proxy base URL %s, scheme http, the API key (api_key) and agentd token (agentd_token) in %s, then import template \"base\".",
		l.Server.URL(), l.Server.ProxyURL(), l.State)
}

// localTemplate is the backend template the local backend offers.
const localTemplate = "base"

// backend is what registering l as a sandbox environment takes, for the
// environments page's one action (nil without a local backend).
func (l *LocalSandboxes) backend() *handlers.LocalBackend {
	if l == nil {
		return nil
	}
	return &handlers.LocalBackend{APIURL: l.Server.URL(), ProxyBaseURL: l.Server.ProxyURL(), APIKey: l.APIKey,
		AgentdToken: l.AgentdToken, Template: localTemplate}
}

// Close kills the local sandboxes, stops the backend and removes the
// sandboxes' directories (a sandbox does not survive a restart anyway).
func (l *LocalSandboxes) Close() error {
	return errors.Join(l.Server.Close(), os.RemoveAll(l.Sandboxes))
}
