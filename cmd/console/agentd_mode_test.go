//go:build unix

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TestBinaryRunsAsAgentdUnderThatName: the console's binary started as
// agentd (the name the connect page's command saves it under; here a
// link) is agentd: --version prints agentd's, and with a token it listens,
// re-executes itself still as agentd, and answers agentd's /healthz.
func TestBinaryRunsAsAgentdUnderThatName(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "console")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	as := filepath.Join(dir, "agentd")
	if err := os.Symlink(bin, as); err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command(as, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != agentd.Version {
		t.Fatalf("agentd --version: %q (%v), want %q", out, err, agentd.Version)
	}
	if out, err := exec.Command(as, "serve").CombinedOutput(); err == nil || !strings.Contains(string(out), "unexpected arguments: serve") {
		t.Errorf("agentd serve (a console command) ran as the console or was taken: %v\n%s", err, out)
	}

	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	const token = "agentd-mode-token-0123456789"
	cmd := exec.Command(as, "--listen", "127.0.0.1:0", "--root", root)
	cmd.Env = append(os.Environ(), "AGENTD_TOKEN="+token)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^agentd listening on (127\.0\.0\.1:\d+)\n$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("first stderr line %q, want agentd's", line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := agentd.NewClient("http://"+m[1], token, nil).Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != agentd.Version {
		t.Errorf("/healthz version %q, want %q", h.Version, agentd.Version)
	}
}
