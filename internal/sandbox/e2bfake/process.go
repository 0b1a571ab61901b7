package e2bfake

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Launcher starts the process that backs one sandbox. The default execs the
// agentd binary; tests of the API layer alone may plug in something lighter.
type Launcher interface {
	Launch(ctx context.Context, spec LaunchSpec) (Process, error)
}

// LaunchSpec describes one sandbox's process.
type LaunchSpec struct {
	SandboxID string
	// Workspace is agentd's --root: the sandbox's own directory, or the
	// host directory of its host-mount (CubeSandbox mode).
	Workspace string
	// StateDir holds files that are not part of the workspace (addr file).
	StateDir string
	// Env are the sandbox's envVars, added to the process environment.
	Env map[string]string
}

// Process is a running sandbox process.
type Process interface {
	// Addr is the host:port agentd listens on.
	Addr() string
	// PID is the OS process id, 0 when there is none.
	PID() int
	// Freeze stops the process and all its descendants; Thaw continues them.
	Freeze() error
	Thaw() error
	// Kill ends the process tree and waits for the process to exit.
	Kill() error
}

// ExecLauncher runs the agentd binary under the contract cmd/agentd
// implements: `agentd --listen 127.0.0.1:0 --addr-file F --root W` with
// AGENTD_TOKEN in the environment; it prints "agentd listening on <addr>" to
// stderr and writes F once listening.
type ExecLauncher struct {
	Binary string
	Token  string
	// ExtraEnv is added to every process's environment (KEY=VALUE).
	ExtraEnv []string
	// Environ, when set, gives each process its whole base environment
	// instead of the launcher's own (os.Environ), which would hand the
	// sandbox whatever secrets the process running the fake holds.
	// AGENTD_TOKEN, ExtraEnv and the sandbox's envVars are added to it.
	Environ func(spec LaunchSpec) ([]string, error)
	// Log receives agentd's stderr; nil discards it.
	Log io.Writer
	// StartTimeout bounds the wait for agentd to listen (default 15 s).
	StartTimeout time.Duration
}

const listenPrefix = "agentd listening on "

// Launch starts agentd and waits until it listens.
func (l ExecLauncher) Launch(ctx context.Context, spec LaunchSpec) (Process, error) {
	if l.Binary == "" {
		return nil, errors.New("e2bfake: no agentd binary configured")
	}
	addrFile := filepath.Join(spec.StateDir, "agentd.addr")
	cmd := exec.Command(l.Binary, "--listen", "127.0.0.1:0", "--addr-file", addrFile, "--root", spec.Workspace)
	cmd.Dir = spec.Workspace
	base := os.Environ()
	if l.Environ != nil {
		var err error
		if base, err = l.Environ(spec); err != nil {
			return nil, fmt.Errorf("e2bfake: environment of sandbox %s: %w", spec.SandboxID, err)
		}
	}
	cmd.Env = append(base, "AGENTD_TOKEN="+l.Token)
	cmd.Env = append(cmd.Env, l.ExtraEnv...)
	for k, v := range spec.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// Its own process group, so signals aimed at the test's group do not
	// reach it and Kill can take the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	// A plain pipe (not cmd.StderrPipe) so that Wait does not depend on the
	// reader and the reader outlives startup.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("e2bfake: stderr pipe: %w", err)
	}
	cmd.Stderr = w
	cmd.Stdout = w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("e2bfake: start agentd: %w", err)
	}
	w.Close()

	p := &execProcess{cmd: cmd, exited: make(chan struct{})}
	listening := make(chan string, 1)
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			p.logLine(line)
			if l.Log != nil {
				fmt.Fprintf(l.Log, "agentd[%s] %s\n", spec.SandboxID, line)
			}
			if i := strings.Index(line, listenPrefix); i >= 0 {
				select {
				case listening <- strings.TrimSpace(line[i+len(listenPrefix):]):
				default:
				}
			}
		}
	}()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	timeout := l.StartTimeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case addr := <-listening:
		// The addr file is the contract's durable answer; the log line is
		// what arrives first. Prefer the file when it is there.
		if b, err := os.ReadFile(addrFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			addr = string(bytes.TrimSpace(b))
		}
		p.addr = addr
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("e2bfake: agentd exited before listening (%v): %s", p.waitErr, p.tail())
	case <-ctx.Done():
		_ = p.Kill()
		return nil, fmt.Errorf("e2bfake: waiting for agentd: %w", ctx.Err())
	case <-timer.C:
		_ = p.Kill()
		return nil, fmt.Errorf("e2bfake: agentd did not listen within %s: %s", timeout, p.tail())
	}
}

type execProcess struct {
	cmd     *exec.Cmd
	addr    string
	exited  chan struct{}
	waitErr error

	mu   sync.Mutex
	logs []string
}

func (p *execProcess) logLine(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logs = append(p.logs, s)
	if len(p.logs) > 20 {
		p.logs = p.logs[len(p.logs)-20:]
	}
}

func (p *execProcess) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.logs, "\n")
}

func (p *execProcess) Addr() string  { return p.addr }
func (p *execProcess) PID() int      { return p.cmd.Process.Pid }
func (p *execProcess) Freeze() error { return stopTree(p.PID()) }
func (p *execProcess) Thaw() error   { return contTree(p.PID()) }

func (p *execProcess) Kill() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	killed := killTree(p.PID())
	deadline := time.After(10 * time.Second)
	select {
	case <-p.exited:
	case <-deadline:
		return fmt.Errorf("e2bfake: agentd %d did not exit after SIGKILL", p.PID())
	}
	// A real backend answers DELETE once the VM is gone, so the fake waits
	// for every process it killed too: a SIGKILLed child can linger a moment
	// in state D while the kernel tears it down.
	for _, pid := range killed {
		for {
			if s := ProcState(pid); s == 0 || s == 'Z' || s == 'X' {
				break
			}
			select {
			case <-deadline:
				return fmt.Errorf("e2bfake: process %d of agentd %d did not exit after SIGKILL", pid, p.PID())
			case <-time.After(time.Millisecond):
			}
		}
	}
	return nil
}

// procStat is the part of /proc/<pid>/stat the fake needs.
type procStat struct {
	state byte
	ppid  int
}

// readStat parses /proc/<pid>/stat. The command name may hold spaces and
// parentheses, so fields are counted from the last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+4 > len(b) {
		return procStat{}, fmt.Errorf("e2bfake: malformed stat for %d", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return procStat{}, fmt.Errorf("e2bfake: malformed stat for %d", pid)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("e2bfake: malformed stat for %d: %w", pid, err)
	}
	return procStat{state: f[0][0], ppid: ppid}, nil
}

// ProcState returns the one-letter state of a process from /proc (e.g. 'S',
// 'R', 'T' for stopped), or 0 when the process does not exist.
func ProcState(pid int) byte {
	st, err := readStat(pid)
	if err != nil {
		return 0
	}
	return st.state
}

// descendants returns every process below root, found by scanning the ppid
// of every process in /proc: it works without CONFIG_PROC_CHILDREN and also
// sees children of every thread.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue
		}
		children[st.ppid] = append(children[st.ppid], pid)
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// stopTree SIGSTOPs root and its descendants, rescanning until no new
// process appears (a child may fork between scan and signal), then waits
// until each is really stopped so a 204 from pause means frozen.
func stopTree(root int) error {
	stopped := map[int]bool{}
	for round := 0; round < 20; round++ {
		fresh := 0
		for _, pid := range append([]int{root}, descendants(root)...) {
			if stopped[pid] {
				continue
			}
			stopped[pid] = true
			fresh++
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && pid == root {
				return fmt.Errorf("e2bfake: stop %d: %w", pid, err)
			}
		}
		if fresh == 0 {
			break
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for pid := range stopped {
		for {
			s := ProcState(pid)
			if s == 0 || s == 'T' || s == 't' || s == 'Z' || s == 'X' {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("e2bfake: process %d did not stop (state %c)", pid, s)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// contTree SIGCONTs root and its descendants.
func contTree(root int) error {
	if err := syscall.Kill(root, syscall.SIGCONT); err != nil {
		return fmt.Errorf("e2bfake: continue %d: %w", root, err)
	}
	for _, pid := range descendants(root) {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	return nil
}

// killTree freezes the tree first, so nothing forks while it is killed,
// then SIGKILLs every member and root's process group. It returns the
// descendants it killed.
func killTree(root int) []int {
	_ = stopTree(root)
	killed := descendants(root)
	for _, pid := range killed {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-root, syscall.SIGKILL)
	_ = syscall.Kill(root, syscall.SIGKILL)
	return killed
}
