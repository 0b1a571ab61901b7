//go:build linux

package main_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// Regression tests for issue 17 (agentd under hostile commands), each
// against a real agentd process running real commands.

// TestSessionEndEndsEveryProcess covers findings 2 and 3: whatever ends a
// session (exit, timeout, DELETE, shutdown), every process it started is
// gone within the kill grace plus one second, including background jobs,
// setsid escapes and job-control groups of an interactive shell.
func TestSessionEndEndsEveryProcess(t *testing.T) {
	const grace = 2 * time.Second
	tests := []struct {
		name    string
		req     agentd.CreateSessionRequest
		stdin   string // typed into a TTY session once it runs
		end     string // "exit", "timeout", "delete" or "shutdown"
		state   string
		pattern string // what the leftover process runs
	}{
		{"background job, exit", agentd.CreateSessionRequest{Command: "sleep 3101 >/dev/null 2>&1 &"}, "", "exit", agentd.StateExited, "sleep 3101"},
		{"setsid escape, exit", agentd.CreateSessionRequest{Command: "setsid sh -c 'sleep 3102' >/dev/null 2>&1 </dev/null &"}, "", "exit", agentd.StateExited, "sleep 3102"},
		{"double fork and setsid, timeout", agentd.CreateSessionRequest{Command: "(setsid sh -c 'sleep 3103' >/dev/null 2>&1 </dev/null &) ; sleep 1000", TimeoutMS: 1500}, "", "timeout", agentd.StateTimedOut, "sleep 3103"},
		{"setsid escape, delete", agentd.CreateSessionRequest{Command: "setsid sh -c 'sleep 3104' >/dev/null 2>&1 </dev/null & sleep 1000"}, "", "delete", agentd.StateKilled, "sleep 3104"},
		{"job control on a tty, delete", agentd.CreateSessionRequest{Command: "bash --norc --noprofile -i", TTY: true}, "sleep 3105 &\n", "delete", agentd.StateKilled, "sleep 3105"},
		{"job control on a tty, timeout", agentd.CreateSessionRequest{Command: "bash --norc --noprofile -i", TTY: true, TimeoutMS: 3000}, "(trap '' TERM HUP; exec sleep 3106) &\n", "timeout", agentd.StateTimedOut, "sleep 3106"},
		{"setsid escape, shutdown", agentd.CreateSessionRequest{Command: "setsid sh -c 'sleep 3107' >/dev/null 2>&1 </dev/null & sleep 1000"}, "", "shutdown", agentd.StateKilled, "sleep 3107"},
	}
	for _, mode := range cgroupModes(t) {
		t.Run("cgroup="+mode, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					d := startDaemon(t, "--cgroup", mode, "--kill-grace", grace.String())
					ctx := ctxFor(t)
					pattern := tt.pattern + "$"
					resp, err := d.client.CreateSession(ctx, tt.req)
					if err != nil {
						t.Fatal(err)
					}
					if tt.stdin != "" {
						if err := d.client.WriteStdin(ctx, resp.SessionID, []byte(tt.stdin), false); err != nil {
							t.Fatal(err)
						}
					}
					if tt.end != "exit" {
						waitSome(t, pattern)
					}
					switch tt.end {
					case "delete":
						if _, err := d.client.Kill(ctx, resp.SessionID); err != nil {
							t.Fatal(err)
						}
					case "shutdown":
						d.terminate(false)
						<-d.exited
						if d.err != nil {
							t.Fatalf("agentd exit: %v", d.err)
						}
						waitNone(t, pattern, grace+time.Second)
						return
					}
					final, err := d.client.Follow(ctx, resp.SessionID, 0, nil)
					if err != nil {
						t.Fatal(err)
					}
					if final.State != tt.state {
						t.Fatalf("state %s; want %s", final.State, tt.state)
					}
					waitNone(t, pattern, grace+time.Second)
					h, err := d.client.Health(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if want := map[string]string{agentd.CgroupOff: "process-tree", agentd.CgroupRequired: "cgroup"}[mode]; h.ProcessTracking != want {
						t.Fatalf("process_tracking %q; want %q", h.ProcessTracking, want)
					}
				})
			}
		})
	}
}

// TestLeftoversCountAgainstTheCap covers the rest of finding 2: a session
// whose command left processes behind stays active (and under the session
// cap) until they are gone, and then /healthz reports 0.
func TestLeftoversCountAgainstTheCap(t *testing.T) {
	// A grace long enough that a loaded machine still finds the leftover
	// in it after the answer of its exit arrives.
	d := startDaemon(t, "--kill-grace", "10s", "--max-sessions", "1")
	ctx := ctxFor(t)
	res, err := d.client.Run(ctx, agentd.CreateSessionRequest{Command: "(trap '' TERM; exec sleep 3111) >/dev/null 2>&1 &", WaitMS: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != agentd.StateExited {
		t.Fatalf("state %s", res.State)
	}
	// The TERM-ignoring leftover still has its grace: the slot is taken.
	// (It must be running: one killed at once, or never started, fails
	// here rather than skipping the check.)
	waitSome(t, "sleep 3111$")
	if _, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{Command: "true"}); !errors.Is(err, agentd.ErrTooManySessions) {
		t.Fatalf("second session while the first one's process runs: %v; want too_many_sessions", err)
	}
	if len(pgrep(t, "sleep 3111$")) == 0 {
		t.Fatal("the leftover ended before the second session was refused; the check proved nothing")
	}
	waitNone(t, "sleep 3111$", 15*time.Second)
	eventually(t, "active_sessions to drop to 0", func() bool {
		h, err := d.client.Health(ctx)
		return err == nil && h.ActiveSessions == 0
	})
}

// TestKillGraceHonouredForMembers covers finding 7: a group member that
// traps SIGTERM keeps the whole grace after the shell has died.
func TestKillGraceHonouredForMembers(t *testing.T) {
	for _, mode := range cgroupModes(t) {
		t.Run("cgroup="+mode, func(t *testing.T) {
			d := startDaemon(t, "--cgroup", mode, "--kill-grace", "4s")
			ctx := ctxFor(t)
			termFile := filepath.Join(d.root, "got-term")
			readyFile := filepath.Join(d.root, "trap-set")
			resp, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{
				Command: fmt.Sprintf("sh -c 'trap \"touch %s\" TERM; touch %s; while :; do sleep 0.05; done; : 3121' & echo started; wait", termFile, readyFile),
			})
			if err != nil {
				t.Fatal(err)
			}
			waitSome(t, ": 3121")
			// The member exists before its trap is set: a SIGTERM in between
			// (a loaded machine) would kill it at once and prove nothing.
			eventually(t, "the member to set its trap", func() bool {
				_, err := os.Stat(readyFile)
				return err == nil
			})
			final, err := d.client.Kill(ctx, resp.SessionID)
			if err != nil {
				t.Fatal(err)
			}
			if final.State != agentd.StateKilled || *final.ExitCode != 128+15 {
				t.Fatalf("state %s code %v; want killed by SIGTERM", final.State, final.ExitCode)
			}
			eventually(t, "the member to get SIGTERM", func() bool {
				_, err := os.Stat(termFile)
				return err == nil
			})
			// The shell is gone and reaped; the member must still be within
			// its 4 s grace rather than killed at once.
			if len(pgrep(t, ": 3121")) == 0 {
				t.Fatal("the TERM-trapping member was killed as soon as the shell was reaped")
			}
			waitNone(t, ": 3121", 5*time.Second)
		})
	}
}

// TestOrphansAreReaped covers finding 4: agentd is a child subreaper, so
// orphans of commands become its children, and it reaps them.
func TestOrphansAreReaped(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxFor(t)
	res, err := d.client.Run(ctx, agentd.CreateSessionRequest{
		Command: "for i in $(seq 20); do sleep 0.1 & done; exit 0",
		WaitMS:  10000,
	})
	if err != nil || res.State != agentd.StateExited {
		t.Fatalf("run: %v %+v", err, res)
	}
	eventually(t, "no zombie children of agentd", func() bool {
		return len(zombieChildren(d.cmd.Process.Pid)) == 0
	})

	// As PID 1 of a PID namespace (the main process of a sandbox), every
	// orphan of the namespace is agentd's to reap.
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare is needed to run agentd as PID 1: %v", err)
	}
	pid1 := startDaemonVia(t, []string{"unshare", "--fork", "--pid", "--mount-proc", "--kill-child=SIGTERM"})
	res, err = pid1.client.Run(ctx, agentd.CreateSessionRequest{
		Command: "readlink /proc/1/exe; for i in $(seq 20); do (sleep 0.1 &) ; done; sleep 0.2; " +
			"for i in $(seq 100); do n=$(ps -eo stat= | grep -c '^Z'); [ \"$n\" = 0 ] && break; sleep 0.1; done; echo $n",
		WaitMS: 30000,
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(res.Stdout))
	bin, err := filepath.EvalSymlinks(agentdBin)
	if err != nil {
		t.Fatal(err)
	}
	// The command's parent is agentd's spawner, not agentd: PID 1 is
	// told by its binary.
	if len(lines) != 2 || lines[0] != bin {
		t.Fatalf("output %q; want agentd (%s) as PID 1 and a zombie count", res.Stdout, bin)
	}
	if lines[1] != "0" {
		t.Fatalf("%s zombies in agentd's PID namespace", lines[1])
	}
}

// zombieChildren lists pid's children that are zombies.
func zombieChildren(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for f := range strings.FieldsSeq(string(b)) {
			if c, _ := strconv.Atoi(f); isZombie(c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// TestTokenUnreadableToCommands covers finding 5: neither agentd's
// environment, its command line, its memory nor the token file gives the
// token to a command run with --run-as; without --run-as the environment
// and command line still do not hold it.
func TestTokenUnreadableToCommands(t *testing.T) {
	probe := `cat /proc/$PPID/environ 2>&1 | tr '\0' '\n'; echo; cat /proc/$PPID/cmdline 2>&1 | tr '\0' ' '; echo; head -c 64 /proc/$PPID/mem 2>&1; cat %s 2>&1; id -u`
	tests := []struct {
		name     string
		args     []string
		tokenDir bool // pass the token with --token-file
		wantUID  string
	}{
		{"env token, same user", nil, false, "0"},
		{"env token, run as nobody", []string{"--run-as", "nobody"}, false, "65534"},
		{"token file, run as nobody", []string{"--run-as", "nobody"}, true, "65534"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tokenFile := filepath.Join(t.TempDir(), "token")
			args := tt.args
			if tt.tokenDir {
				if err := os.WriteFile(tokenFile, []byte("file-token-0123456789-"+strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--token-file", tokenFile)
			}
			d := startDaemon(t, args...)
			client := d.client
			secret := d.token
			if tt.tokenDir {
				secret = "file-token-0123456789-" + strconv.Itoa(os.Getpid())
				client = agentd.NewClient("http://"+d.addr, secret, nil)
			}
			res, err := client.Run(ctxFor(t), agentd.CreateSessionRequest{Command: fmt.Sprintf(probe, tokenFile), WaitMS: 10000})
			if err != nil {
				t.Fatal(err)
			}
			out := string(res.Stdout) + string(res.Stderr)
			if strings.Contains(out, secret) || strings.Contains(out, "AGENTD_TOKEN") {
				t.Fatalf("the command read the token:\n%s", out)
			}
			if tt.tokenDir && strings.Contains(out, "--token-file") {
				t.Fatalf("agentd's command line names the token file:\n%s", out)
			}
			if lines := strings.Fields(out); lines[len(lines)-1] != tt.wantUID {
				t.Fatalf("command ran as uid %s; want %s", lines[len(lines)-1], tt.wantUID)
			}
		})
	}
}

// TestFileReadsNeverBlockOnFIFOs covers finding 6: a FIFO swapped in while
// reads run is refused, never waited on.
func TestFileReadsNeverBlockOnFIFOs(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxFor(t)
	resp, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{
		Command: "mkfifo fifo; while :; do rm -f x; echo hi > x; rm -f x; mkfifo x; done",
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.client.ReadFile(ctx, "fifo", 0, 0); !errors.Is(err, agentd.ErrBadRequest) {
		eventually(t, "the fifo to exist", func() bool {
			_, err := os.Stat(filepath.Join(d.root, "fifo"))
			return err == nil
		})
		if _, _, err := d.client.ReadFile(ctx, "fifo", 0, 0); !errors.Is(err, agentd.ErrBadRequest) {
			t.Fatalf("read of a fifo: %v; want bad_request", err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for range 8 {
		wg.Go(func() {
			for range 50 {
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				_, _, err := d.client.ReadFile(rctx, "x", 0, 0)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if n := len(errs); n > 0 {
		t.Fatalf("%d of 400 reads hung", n)
	}
	if _, err := d.client.Kill(ctx, resp.SessionID); err != nil {
		t.Fatal(err)
	}
}

// TestStdinDeadlinesStartOnArrival covers finding 8: concurrent writes to a
// command that never reads each time out after their own deadline, not
// one after another.
func TestStdinDeadlinesStartOnArrival(t *testing.T) {
	const timeout = 2 * time.Second
	d := startDaemon(t, "--stdin-timeout", timeout.String())
	ctx := ctxFor(t)
	resp, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 1000", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1<<20)
	start := time.Now()
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- d.client.WriteStdin(ctx, resp.SessionID, data, false) }()
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, agentd.ErrTimeout) {
			t.Fatalf("write: %v; want timeout", err)
		}
	}
	// Queued deadlines would take 3 × 2 s; each request's own takes 2 s.
	if took := time.Since(start); took >= 3*timeout-time.Second {
		t.Fatalf("three concurrent writes took %v: their deadlines queued", took)
	}
}
