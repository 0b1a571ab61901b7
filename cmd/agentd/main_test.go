//go:build unix

package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// buildAgentd compiles the command once per test binary run.
func buildAgentd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agentd")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestAgentdBinary(t *testing.T) {
	bin := buildAgentd(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	addrFile := filepath.Join(dir, "addr")
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--addr-file", addrFile, "--root", root, "--kill-grace", "200ms", "--write-max-bytes", "16")
	cmd.Env = append(os.Environ(), "AGENTD_TOKEN=s3cret-token-0123456789")
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
		t.Fatalf("first stderr line %q", line)
	}
	addr := m[1]
	written, err := os.ReadFile(addrFile)
	if err != nil || strings.TrimSpace(string(written)) != addr {
		t.Fatalf("addr file %q (%v); want %q", written, err, addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := agentd.NewClient("http://"+addr, "s3cret-token-0123456789", nil)
	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := agentd.NewClient("http://"+addr, "wrong", nil).Stat(ctx, "x"); !errors.Is(err, agentd.ErrUnauthorized) {
		t.Fatalf("wrong token: %v", err)
	}
	// --write-max-bytes reaches the server: 16 bytes are taken, 17 refused.
	if _, err := c.WriteFile(ctx, "fits", 0, strings.NewReader(strings.Repeat("x", 16)), 16); err != nil {
		t.Fatalf("16-byte write under --write-max-bytes 16: %v", err)
	}
	if _, err := c.WriteFile(ctx, "over", 0, strings.NewReader(strings.Repeat("x", 17)), 17); !errors.Is(err, agentd.ErrTooLarge) {
		t.Fatalf("17-byte write under --write-max-bytes 16: %v; want ErrTooLarge", err)
	}
	res, err := c.Run(ctx, agentd.CreateSessionRequest{Command: "echo ${AGENTD_TOKEN:-unset}; pwd", WaitMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	realRoot, _ := filepath.EvalSymlinks(root)
	if want := "unset\n" + realRoot + "\n"; string(res.Stdout) != want {
		t.Fatalf("stdout %q; want %q (the token must not leak to commands)", res.Stdout, want)
	}

	// Graceful shutdown kills running process groups.
	pidFile := filepath.Join(root, "pid")
	if _, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: fmt.Sprintf("sleep 1000 & echo $! > %s; wait", pidFile)}); err != nil {
		t.Fatal(err)
	}
	var pid int
	for pid == 0 {
		if b, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agentd exit: %v", err)
	}
	// SIGKILL is sent before agentd exits, but the kernel may still be
	// tearing the sleep down (state D) for a moment after that.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) || isZombie(pid) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("background sleep %d survived shutdown", pid)
		}
	}
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

func TestAgentdTokenSources(t *testing.T) {
	bin := buildAgentd(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("from-file-token-0123456789\n"), 0o600)
	shortFile := tokenFile + ".short"
	os.WriteFile(shortFile, []byte("fifteen-chars!!\n"), 0o600)
	tests := []struct {
		name    string
		args    []string
		env     []string
		token   string
		wantErr string
	}{
		{"no token", nil, nil, "", "no token"},
		{"token file", []string{"--token-file", tokenFile}, nil, "from-file-token-0123456789", ""},
		{"missing token file", []string{"--token-file", tokenFile + ".nope"}, nil, "", "token file"},
		{"env from AGENTD_LISTEN", nil, []string{"AGENTD_TOKEN=env-token-0123456789", "AGENTD_LISTEN=127.0.0.1:0"}, "env-token-0123456789", ""},
		// The console's rule: it refuses to store a shorter token, so agentd
		// refuses to start with one.
		{"short token from env", nil, []string{"AGENTD_TOKEN=123456789"}, "", "must have at least 16"},
		{"short token file", []string{"--token-file", shortFile}, nil, "", "must have at least 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--listen", "127.0.0.1:0"}, tt.args...)
			if len(tt.env) > 0 {
				args = tt.args
			}
			cmd := exec.Command(bin, args...)
			cmd.Env = append(filteredEnv(), tt.env...)
			stderr, _ := cmd.StderrPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			line, _ := bufio.NewReader(stderr).ReadString('\n')
			if tt.wantErr != "" {
				if !strings.Contains(line, tt.wantErr) {
					t.Fatalf("stderr %q; want it to mention %q", line, tt.wantErr)
				}
				return
			}
			addr, ok := strings.CutPrefix(strings.TrimSpace(line), "agentd listening on ")
			if !ok {
				t.Fatalf("stderr %q", line)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := agentd.NewClient("http://"+addr, tt.token, nil).Stat(ctx, "/"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func filteredEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AGENTD_") {
			out = append(out, kv)
		}
	}
	return out
}
