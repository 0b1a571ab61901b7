package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

// TestLocalSandboxesKeepTheConsolesSecrets is item 14 of issue 21: a
// command in a --local-sandboxes sandbox (a real agentd process started by
// the local backend, reached over HTTP through the backend's proxy) sees
// none of the console's environment, and its working directory is no
// relative path away from the backend's own files.
//
// Not tested, because it is not true: the sandbox runs as the console's
// user, so it can read backend.json (and the data directory) by its
// absolute path, or by a relative one that climbs to / and down again.
// docs/sessions.md says so.
func TestLocalSandboxesKeepTheConsolesSecrets(t *testing.T) {
	// t.Setenv: the console's process environment is what is under test.
	secrets := map[string]string{
		"GATEHOUSE_MASTER_KEY":     testMasterKey,
		"DATABASE_URL":             "postgres://gatehouse:db-password-4711@db.internal:5432/gatehouse",
		"GATEHOUSE_ADMIN_PASSWORD": "admin-password-0815-secret",
		"GATEHOUSE_DEPLOY_CANARY":  "canary-value-from-the-console",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	bin, err := e2bfaketest.BuildAgentd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if bin.StandIn {
		// What is under test is what a shell inside the sandbox sees: the
		// stand-in runs no shell, so it could prove nothing here.
		t.Fatalf("this test needs the real agentd (it runs shell commands); only the stand-in could be had: %s", bin.Reason)
	}
	// The local backend finds agentd on PATH, as an installed console would.
	t.Setenv("PATH", filepath.Dir(bin.Path)+string(os.PathListSeparator)+os.Getenv("PATH"))
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	dataDir := t.TempDir()

	local, err := console.StartLocalSandboxes(dataDir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := local.Close(); err != nil {
			t.Errorf("close the local backend: %v", err)
		}
	})
	statePath := filepath.Join(dataDir, "local-sandboxes", "backend.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := createSandbox(t, ctx, local)
	c := agentd.NewClient(local.Server.ProxyURL()+"/sandbox/"+id+"/"+strconv.Itoa(sandbox.AgentdPort), local.AgentdToken, nil)
	run := func(command string) *agentd.Result {
		t.Helper()
		res, err := c.Run(ctx, agentd.CreateSessionRequest{Command: command})
		if err != nil {
			t.Fatalf("run %q in the sandbox: %v", command, err)
		}
		return res
	}

	t.Run("env shows nothing of the console's", func(t *testing.T) {
		res := run("env")
		out := string(res.Stdout)
		if res.ExitCode != 0 || !strings.Contains(out, "PATH=") {
			t.Fatalf("env: exit %d, output %q", res.ExitCode, out)
		}
		for k, v := range secrets {
			if strings.Contains(out, k) || strings.Contains(out, v) {
				t.Errorf("the sandbox's environment shows the console's %s:\n%s", k, out)
			}
		}
		// Whatever else the console's environment holds stays out too:
		// only what a shell needs is there.
		allowed := map[string]bool{"PATH": true, "HOME": true, "TMPDIR": true, "LANG": true, "TERM": true, "SHELL": true,
			"USER": true, "LOGNAME": true, "PWD": true, "SHLVL": true, "_": true, "OLDPWD": true}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			k, _, _ := strings.Cut(line, "=")
			if !allowed[k] {
				t.Errorf("the sandbox's environment has %q, which is not one a shell needs", line)
			}
		}
		for _, line := range strings.Split(out, "\n") {
			if k, v, _ := strings.Cut(line, "="); (k == "HOME" || k == "TMPDIR") && !strings.HasPrefix(v, local.Sandboxes+string(filepath.Separator)+id) {
				t.Errorf("%s = %q, want a directory of the sandbox", k, v)
			}
		}
	})

	t.Run("backend.json is no relative path away", func(t *testing.T) {
		res := run("pwd")
		cwd := strings.TrimSpace(string(res.Stdout))
		if cwd == "" {
			t.Fatalf("pwd in the sandbox: exit %d, output %q", res.ExitCode, res.Stdout)
		}
		if strings.HasPrefix(cwd, dataDir) {
			t.Errorf("the sandbox works in %q, want a directory outside the data directory %s", cwd, dataDir)
		}
		// No way up from the working directory leads to it: the file is in
		// none of the sandbox's parent directories. (A path that goes up
		// to / and down again is its absolute path by another name.)
		var tries []string
		for up := 1; up <= strings.Count(cwd, "/"); up++ {
			tries = append(tries, strings.Repeat("../", up)+"backend.json", strings.Repeat("../", up)+"local-sandboxes/backend.json")
		}
		for _, p := range tries {
			if res := run("cat " + p); res.ExitCode == 0 || bytes.Contains(res.Stdout, []byte(local.APIKey)) {
				t.Errorf("cat %s from the sandbox read backend.json: %q", p, res.Stdout)
			}
		}
	})

	t.Run("the backend's files are the console user's alone", func(t *testing.T) {
		for path, want := range map[string]os.FileMode{filepath.Dir(statePath): 0o700, statePath: 0o600} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s has mode %o, want %o", path, fi.Mode().Perm(), want)
			}
		}
		if !strings.HasPrefix(local.Sandboxes, tmp) {
			t.Errorf("the sandboxes live in %s, want the temporary directory %s", local.Sandboxes, tmp)
		}
	})
}

// createSandbox creates a sandbox of template base at the local backend,
// over its E2B API, and returns its id.
func createSandbox(t *testing.T, ctx context.Context, local *console.LocalSandboxes) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, local.Server.URL()+"/sandboxes", strings.NewReader(`{"templateID":"base"}`))
	req.Header.Set("X-API-Key", local.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ SandboxID string }
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(body, &out) != nil || out.SandboxID == "" {
		t.Fatalf("create a sandbox: %d %s", resp.StatusCode, body)
	}
	return out.SandboxID
}
