//go:build linux

package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// agentdBin is the agentd binary built once by TestMain for the Linux
// tests.
var agentdBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agentd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentdBin = filepath.Join(dir, "agentd")
	if out, err := exec.Command("go", "build", "-o", agentdBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon is a running agentd process.
type daemon struct {
	cmd    *exec.Cmd
	client *agentd.Client
	addr   string
	root   string
	token  string
	exited chan struct{} // closed when agentd has exited
	err    error         // its exit error, once exited is closed
}

// startDaemon runs the agentd binary with args (plus --listen and --root,
// a directory every user may enter) and the token in AGENTD_TOKEN.
func startDaemon(t testing.TB, args ...string) *daemon {
	t.Helper()
	return startDaemonVia(t, nil, args...)
}

// startDaemonVia is startDaemon with agentd run through the command
// prefix, such as unshare.
func startDaemonVia(t testing.TB, prefix []string, args ...string) *daemon {
	t.Helper()
	root := worldDir(t)
	token := "tok-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	argv := append(append(append([]string{}, prefix...), agentdBin, "--listen", "127.0.0.1:0", "--root", root), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(filteredEnv(), "AGENTD_TOKEN="+token)
	cmd.Dir = root
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, root: root, token: token, exited: make(chan struct{})}
	br := bufio.NewReader(stderr)
	line, err := br.ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("agentd %v: %v (stderr %q)", args, err, line)
	}
	// Keep draining the JSON logs so agentd never blocks writing them.
	go io.Copy(io.Discard, br)
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.terminate(prefix != nil)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
	})
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "agentd listening on ")
	if !ok {
		t.Fatalf("first stderr line %q", line)
	}
	d.addr = addr
	d.client = agentd.NewClient("http://"+addr, token, nil)
	return d
}

// terminate sends agentd SIGTERM; viaPrefix: agentd is the child of the
// process started (unshare does not pass SIGTERM on).
func (d *daemon) terminate(viaPrefix bool) {
	pid := d.cmd.Process.Pid
	if viaPrefix {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if f := strings.Fields(string(b)); len(f) > 0 {
			pid, _ = strconv.Atoi(f[0])
		}
	}
	syscall.Kill(pid, syscall.SIGTERM)
}

// worldDir is a fresh directory that every user can enter and write, for
// commands run with --run-as.
func worldDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agentd-root-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

// eventually retries cond for up to 20 seconds; it does not judge speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pgrep lists the pids whose command line matches pattern.
func pgrep(t testing.TB, pattern string) []int {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", pattern).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 {
		return nil // none
	}
	if err != nil {
		t.Fatalf("pgrep: %v", err)
	}
	var pids []int
	for f := range strings.FieldsSeq(string(out)) {
		pid, _ := strconv.Atoi(f)
		if !isZombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitNone waits until pgrep finds no live process matching pattern, for
// at most within; the bound is the guarantee under test.
func waitNone(t testing.TB, pattern string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		pids := pgrep(t, pattern)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v matching %q still run %v after the session ended", pids, pattern, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitSome waits until pgrep finds a live process matching pattern.
func waitSome(t testing.TB, pattern string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(pgrep(t, pattern)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no process matching %q started", pattern)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupModes are the tracking modes the tests run agentd in, each in a
// subtest "cgroup=<mode>": always the process-tree fallback; the cgroup
// mode where this machine lets agentd create cgroups (it does in CI, which
// runs as root on cgroup2). Where it does not, the cgroup mode's subtest is
// skipped here with the reason, so `go test -v` shows it left out.
func cgroupModes(t *testing.T) []string {
	t.Helper()
	modes := []string{agentd.CgroupOff}
	if reason := cgroupUnavailable(); reason != "" {
		t.Run("cgroup="+agentd.CgroupRequired, func(t *testing.T) {
			t.Skipf("cgroup mode not tested here: %s", reason)
		})
		return modes
	}
	return append(modes, agentd.CgroupRequired)
}

// cgroupUnavailable says why agentd could not create cgroups here ("" if
// it can).
func cgroupUnavailable() string {
	srv, err := agentd.NewServer(agentd.Config{Token: "probe-token-0123456789", Cgroup: agentd.CgroupRequired})
	if err != nil {
		return err.Error()
	}
	srv.Close()
	return ""
}
