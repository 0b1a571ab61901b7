package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gatehouse/gatehouse/internal/netfault"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
)

// replica is one console process of the chaos run. It keeps its address
// across restarts, so the balancer in front of the replicas needs no
// telling.
type replica struct {
	idx     int
	addr    string
	bin     string
	env     []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// listeningPrefix is what `console serve` prints once it listens.
const listeningPrefix = "Gatehouse console listening on "

// start runs `console serve` on the replica's address and waits until it
// listens (the port may be briefly held by a connection of the process
// before: it retries for a while).
func (r *replica) start(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := r.startOnce(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (r *replica) startOnce(ctx context.Context) error {
	cmd := exec.Command(r.bin, "serve", "--listen", r.addr)
	cmd.Env = append(os.Environ(), r.env...)
	// A run that dies (a test timeout) takes its replicas with it.
	cmd.SysProcAttr = dieWithParent()
	logf, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "=== start %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start console %d: %w", r.idx, err)
	}
	done := make(chan struct{})
	listening := make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), listeningPrefix) {
				select {
				case listening <- struct{}{}:
				default:
				}
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case <-listening:
	case <-done:
		return fmt.Errorf("console %d exited before listening (see %s)", r.idx, r.logPath)
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("console %d did not listen within 90 s (see %s)", r.idx, r.logPath)
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	return nil
}

// signal sends sig and waits for the process to end.
func (r *replica) signal(sig syscall.Signal) error {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("console %d did not exit within 30 s of %s", r.idx, sig)
	}
}

// ready reports whether the replica answers /readyz with 200.
func (r *replica) ready(ctx context.Context, hc *http.Client) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.addr+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// freeServicePort is a free loopback port below the kernel's ephemeral
// range, so that no outgoing connection takes a killed replica's port
// before it restarts.
func freeServicePort() (string, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	base := 10000
	if lo <= base+1000 {
		base = 1025
	}
	for range 200 {
		p := base + rand.IntN(lo-base)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		return addr, nil
	}
	return "", errors.New("no free loopback port below the ephemeral range")
}

// host is an agentd host environment of the chaos run: a real agentd
// process behind a forwarder, so a restarted agentd (on a new port) is
// reached at the same URL.
type host struct {
	name     string
	launcher e2bfake.ExecLauncher
	spec     e2bfake.LaunchSpec
	fwd      *netfault.Forwarder

	mu   sync.Mutex
	proc e2bfake.Process
}

func startHost(ctx context.Context, name, bin, token, dir string) (*host, error) {
	h := &host{name: name, launcher: e2bfake.ExecLauncher{Binary: bin, Token: token},
		spec: e2bfake.LaunchSpec{SandboxID: name, Workspace: filepath.Join(dir, "ws"), StateDir: filepath.Join(dir, "state")}}
	for _, d := range []string{h.spec.Workspace, h.spec.StateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	p, err := h.launcher.Launch(ctx, h.spec)
	if err != nil {
		return nil, fmt.Errorf("start agentd %s: %w", name, err)
	}
	h.proc = p
	if h.fwd, err = netfault.NewForwarder(p.Addr()); err != nil {
		_ = p.Kill()
		return nil, err
	}
	return h, nil
}

// URL is where the console reaches this host's agentd.
func (h *host) URL() string { return "http://" + h.fwd.Addr() }

// restart kills agentd (its whole process tree: the commands it ran die
// with it, as on a real host's restart), waits down, and starts it again.
func (h *host) restart(ctx context.Context, down time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.proc.Kill(); err != nil {
		return fmt.Errorf("kill agentd %s: %w", h.name, err)
	}
	select {
	case <-time.After(down):
	case <-ctx.Done():
	}
	p, err := h.launcher.Launch(context.WithoutCancel(ctx), h.spec)
	if err != nil {
		return fmt.Errorf("restart agentd %s: %w", h.name, err)
	}
	h.proc = p
	h.fwd.SetTarget(p.Addr())
	return nil
}

func (h *host) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.fwd.Close()
	_ = h.proc.Kill()
}
