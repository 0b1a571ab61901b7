//go:build linux

package main_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// spawnerOf is the pid of agentd's spawner (its child run as
// "agentd-spawner"), 0 if it has none.
func spawnerOf(t *testing.T, agentdPid int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := stat[bytes.LastIndexByte(stat, ')')+2:]
		fields := strings.Fields(string(rest))
		if len(fields) < 2 || fields[1] != strconv.Itoa(agentdPid) {
			continue
		}
		if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); string(cmdline) == "agentd-spawner\x00" {
			return pid
		}
	}
	return 0
}

// TestSpawnerStartsCommands: agentd starts commands through its spawner
// (so a start does not copy and close agentd's descriptors, thousands
// with thousands of sessions), and a command started so is what it was:
// its exit status and signal, its TTY, its stdin, its session's cgroup,
// and nothing inherited from the spawner.
func TestSpawnerStartsCommands(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxFor(t)
	helper := spawnerOf(t, d.cmd.Process.Pid)
	if helper == 0 {
		t.Fatal("agentd runs no spawner")
	}
	cases := []struct {
		name string
		req  agentd.CreateSessionRequest
		code int
		out  func(string) error
	}{
		{"the spawner is the parent; only stdio is inherited",
			agentd.CreateSessionRequest{Command: "echo $PPID; ls -l /proc/$$/fd"}, 0, func(out string) error {
				if first, _, _ := strings.Cut(out, "\n"); first != strconv.Itoa(helper) {
					return fmt.Errorf("parent %s, want the spawner %d", first, helper)
				}
				if strings.Contains(out, "socket:") {
					return fmt.Errorf("the command holds a socket:\n%s", out)
				}
				return nil
			}},
		{"exit status", agentd.CreateSessionRequest{Command: "exit 3"}, 3, nil},
		{"killed by a signal", agentd.CreateSessionRequest{Command: "kill -9 $$"}, 137, nil},
		{"a TTY", agentd.CreateSessionRequest{Command: "tty; stty size", TTY: true, Rows: 33, Cols: 101}, 0, func(out string) error {
			if !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "33 101") {
				return fmt.Errorf("output %q, want a pts of 33 rows and 101 columns", out)
			}
			return nil
		}},
		{"its session's cgroup", agentd.CreateSessionRequest{Command: "cat /proc/self/cgroup"}, 0, func(out string) error {
			health, err := d.client.Health(ctx)
			if err != nil {
				return err
			}
			if health.ProcessTracking == "cgroup" && !strings.Contains(out, "/s-") {
				return fmt.Errorf("cgroup %q, want the session's", out)
			}
			return nil
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.req.WaitMS = 10000
			res, err := d.client.Run(ctx, c.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != c.code {
				t.Fatalf("exit code %d, want %d (output %q)", res.ExitCode, c.code, res.Stdout)
			}
			if c.out != nil {
				if err := c.out(string(res.Stdout)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	t.Run("stdin", func(t *testing.T) {
		resp, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{Command: "read l; echo got $l", Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.client.WriteStdin(ctx, resp.SessionID, []byte("typed\n"), true); err != nil {
			t.Fatal(err)
		}
		out := waitEnd(t, d, resp.SessionID)
		if out.ExitCode == nil || *out.ExitCode != 0 || !strings.Contains(stdout(out), "got typed") {
			t.Fatalf("end %+v, output %q", out, stdout(out))
		}
	})
}

// TestSpawnerLost: when the spawner dies, or stops answering (stopped
// here; a child held between its fork and its exec does the same, and
// agentd gives up on it within its timeouts), a command it started still
// ends with its own exit status (agentd, the subreaper, adopts and reaps
// it), and agentd starts the next commands itself.
func TestSpawnerLost(t *testing.T) {
	for _, c := range []struct {
		name string
		sig  syscall.Signal
	}{{"killed", syscall.SIGKILL}, {"stuck", syscall.SIGSTOP}} {
		t.Run(c.name, func(t *testing.T) {
			d := startDaemon(t)
			ctx := ctxFor(t)
			helper := spawnerOf(t, d.cmd.Process.Pid)
			if helper == 0 {
				t.Fatal("agentd runs no spawner")
			}
			running, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 0.5; exit 5"})
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(helper, c.sig); err != nil {
				t.Fatal(err)
			}
			out := waitEnd(t, d, running.SessionID)
			if out.ExitCode == nil || *out.ExitCode != 5 {
				t.Fatalf("the command the %s spawner started ended %+v, want exit code 5", c.name, out)
			}
			res, err := d.client.Run(ctx, agentd.CreateSessionRequest{Command: "echo $PPID", WaitMS: 10000})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("a command after the spawner was lost: %+v, %v", res, err)
			}
			if got := strings.TrimSpace(string(res.Stdout)); got != strconv.Itoa(d.cmd.Process.Pid) {
				t.Fatalf("its parent is %s, want agentd (%d)", got, d.cmd.Process.Pid)
			}
			eventually(t, "the spawner gone", func() bool { return spawnerOf(t, d.cmd.Process.Pid) == 0 })
		})
	}
}

// TestSpawnerStuckMidStart: a start the spawner takes and never answers
// fails within the spawner's deadline rather than hang, whatever the
// spawner might have forked for it is killed, and the next start is
// agentd's own.
func TestSpawnerStuckMidStart(t *testing.T) {
	d := startDaemon(t, "--cgroup", "off")
	ctx := ctxFor(t)
	helper := spawnerOf(t, d.cmd.Process.Pid)
	if helper == 0 {
		t.Fatal("agentd runs no spawner")
	}
	if err := syscall.Kill(helper, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(d.root, "ran")
	start := time.Now()
	if _, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{Command: "touch " + marker}); err == nil {
		t.Fatal("a start the stuck spawner took succeeded")
	}
	if took := time.Since(start); took > time.Minute {
		t.Fatalf("the failed start took %s", took)
	}
	res, err := d.client.Run(ctx, agentd.CreateSessionRequest{Command: "echo $PPID", WaitMS: 10000})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(d.cmd.Process.Pid) {
		t.Fatalf("the next start: %+v, %v; want agentd's own", res, err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command of the failed start ran")
	}
}

// waitEnd polls session id until it has ended and returns its last state
// with all its output.
func waitEnd(t *testing.T, d *daemon, id string) agentd.SessionResponse {
	t.Helper()
	ctx := ctxFor(t)
	var all agentd.SessionResponse
	var cursor uint64
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		r, err := d.client.Poll(ctx, id, cursor, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		all.Chunks = append(all.Chunks, r.Chunks...)
		cursor = r.NextCursor
		if r.State != agentd.StateRunning && !r.More {
			all.State, all.ExitCode = r.State, r.ExitCode
			return all
		}
	}
	t.Fatalf("session %s did not end", id)
	return all
}

func stdout(r agentd.SessionResponse) string {
	var b strings.Builder
	for _, c := range r.Chunks {
		if c.Stream == agentd.StreamStdout {
			b.Write(c.Data)
		}
	}
	return b.String()
}

// TestSpawnerUnreachableFromCommands: agentd run as an unprivileged user
// without --run-as runs commands as that same user; the spawner, like
// agentd, is non-dumpable, so such a command cannot read its memory or
// environment (nor ptrace it, nor take its socket with pidfd_getfd).
func TestSpawnerUnreachableFromCommands(t *testing.T) {
	world := worldDir(t)
	bin := filepath.Join(world, "agentd")
	raw, err := os.ReadFile(agentdBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	// setpriv and sh exec in place: agentd keeps the pid started.
	// Without root there are no cgroups and no exec reports: off, so
	// their warnings do not come before the line startDaemonVia reads.
	d := startDaemonVia(t, []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", `exec "` + bin + `" "$@"`},
		"--cgroup", "off", "--exec-reporting", "off")
	defer func() {
		syscall.Kill(d.cmd.Process.Pid, syscall.SIGTERM)
		<-d.exited
	}()
	helper := spawnerOf(t, d.cmd.Process.Pid)
	if helper == 0 {
		t.Fatal("agentd runs no spawner")
	}
	ctx := ctxFor(t)
	res, err := d.client.Run(ctx, agentd.CreateSessionRequest{WaitMS: 10000, Command: fmt.Sprintf(
		`id -u; for p in %d %d; do cat /proc/$p/environ >/dev/null 2>&1 && echo "read $p"; ls /proc/$p/fd >/dev/null 2>&1 && echo "listed $p"; done; true`,
		d.cmd.Process.Pid, helper)})
	if err != nil {
		t.Fatal(err)
	}
	if out := strings.TrimSpace(string(res.Stdout)); out != "65534" {
		t.Fatalf("a command of agentd's own user reached agentd or its spawner:\n%s", out)
	}
}
