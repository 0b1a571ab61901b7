//go:build unix

package agentd_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	tests := []struct {
		name    string
		command string
		code    int
		stdout  string
	}{
		{"success", "echo hello", 0, "hello\n"},
		{"failure", "echo out; exit 3", 3, "out\n"},
		{"signalled", "kill -9 $$", 128 + 9, ""},
		{"no output", "true", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := c.Run(testCtx(t), agentd.CreateSessionRequest{Command: tt.command, WaitMS: 5000})
			if err != nil {
				t.Fatal(err)
			}
			if res.State != agentd.StateExited || res.ExitCode != tt.code || string(res.Stdout) != tt.stdout {
				t.Fatalf("got state %s code %d stdout %q; want exited %d %q", res.State, res.ExitCode, res.Stdout, tt.code, tt.stdout)
			}
		})
	}
}

func TestCreateWaitReturnsFinalState(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	resp, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "printf abc", WaitMS: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if resp.State != agentd.StateExited || resp.ExitCode == nil || *resp.ExitCode != 0 {
		t.Fatalf("state %s exit %v; want exited 0", resp.State, resp.ExitCode)
	}
	if len(resp.Chunks) != 1 || string(resp.Chunks[0].Data) != "abc" || resp.Chunks[0].ID != 1 || resp.NextCursor != 1 {
		t.Fatalf("chunks %+v next %d", resp.Chunks, resp.NextCursor)
	}
	if resp.SessionID == "" {
		t.Fatal("no session id")
	}

	running, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "sleep 30", WaitMS: 10})
	if err != nil {
		t.Fatal(err)
	}
	if running.State != agentd.StateRunning || running.ExitCode != nil || running.SessionID == "" {
		t.Fatalf("got %+v; want a running session", running)
	}
	killed, err := c.Kill(testCtx(t), running.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if killed.State != agentd.StateKilled || killed.ExitCode == nil || *killed.ExitCode != 128+15 {
		t.Fatalf("after kill: %+v", killed)
	}
}

func TestStdoutStderrSeparateAndOrdered(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	const n = 500
	resp, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{
		Command: fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo out$i; echo err$i >&2; i=$((i+1)); done`, n),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out streams
	out.add(resp)
	final, err := c.Follow(testCtx(t), resp.SessionID, resp.NextCursor, out.add)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != agentd.StateExited {
		t.Fatalf("state %s", final.State)
	}
	var wantOut, wantErr strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&wantOut, "out%d\n", i)
		fmt.Fprintf(&wantErr, "err%d\n", i)
	}
	if out.stdout.String() != wantOut.String() {
		t.Errorf("stdout mixed or out of order: %q", out.stdout.String())
	}
	if out.stderr.String() != wantErr.String() {
		t.Errorf("stderr mixed or out of order: %q", out.stderr.String())
	}
}

func TestTTYEchoesStdin(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "cat", TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.TTY {
		t.Fatal("session is not a tty")
	}
	if err := c.WriteStdin(ctx, resp.SessionID, []byte("hello tty\n"), false); err != nil {
		t.Fatal(err)
	}
	var out streams
	cursor := waitOutput(t, c, resp.SessionID, 0, &out, "hello tty\r\nhello tty\r\n") // echo, then cat
	if err := c.WriteStdin(ctx, resp.SessionID, nil, true); err != nil {              // Ctrl-D
		t.Fatal(err)
	}
	final, err := c.Follow(ctx, resp.SessionID, cursor, out.add)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != agentd.StateExited || *final.ExitCode != 0 {
		t.Fatalf("after EOF: state %s code %d", final.State, *final.ExitCode)
	}
	if out.stdout.Len() != 0 || out.stderr.Len() != 0 {
		t.Fatal("tty output must arrive on the pty stream only")
	}
}

func TestTTYResize(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{
		Command: "stty size; read line; stty size", TTY: true, Rows: 30, Cols: 90,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out streams
	cursor := waitOutput(t, c, resp.SessionID, 0, &out, "30 90")
	if err := c.Resize(ctx, resp.SessionID, 41, 132); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, resp.SessionID, []byte("\n"), false); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, c, resp.SessionID, cursor, &out, "41 132")
}

func TestTTYCtrlCInterrupts(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{
		// exec keeps one foreground process, so Ctrl-C cannot land on a
		// shell that defers SIGINT while it waits for a child.
		Command: "exec sh -c 'echo ready; exec sleep 1000'", TTY: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out streams
	cursor := waitOutput(t, c, resp.SessionID, 0, &out, "ready")
	if err := c.WriteStdin(ctx, resp.SessionID, []byte{0x03}, false); err != nil {
		t.Fatal(err)
	}
	final, err := c.Follow(ctx, resp.SessionID, cursor, out.add)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != agentd.StateExited || *final.ExitCode != 128+2 {
		t.Fatalf("state %s code %d; want exited by SIGINT (130)", final.State, *final.ExitCode)
	}
}

func TestTimeoutKillsGrandchildren(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tty  bool
	}{{"pipes", false}, {"tty", true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			pidFile := filepath.Join(t.TempDir(), "pid")
			res, err := c.Run(testCtx(t), agentd.CreateSessionRequest{
				Command:   fmt.Sprintf("sleep 1000 & echo $! > %s; wait", pidFile),
				TTY:       tt.tty,
				TimeoutMS: 1500, // ample time to write the pid file even on a loaded machine
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.State != agentd.StateTimedOut {
				t.Fatalf("state %s; want timed_out", res.State)
			}
			b, err := os.ReadFile(pidFile)
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the background sleep to die", func() bool { return processGone(pid) })
		})
	}
}

func TestDeleteEscalatesToSIGKILL(t *testing.T) {
	t.Parallel()
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.KillGrace = 100 * time.Millisecond }))
	ctx := testCtx(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{
		Command: fmt.Sprintf("trap '' TERM; (trap '' TERM; sleep 1000) & echo $! > %s; echo started; wait", pidFile),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out streams
	waitOutput(t, c, resp.SessionID, 0, &out, "started")
	final, err := c.Kill(ctx, resp.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != agentd.StateKilled || *final.ExitCode != 128+9 {
		t.Fatalf("state %s code %v; want killed by SIGKILL", final.State, final.ExitCode)
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	eventually(t, "the TERM-ignoring child to die", func() bool { return processGone(pid) })
}

func TestStdin(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "cat; echo done", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{"one ", "two"} {
		if err := c.WriteStdin(ctx, resp.SessionID, []byte(part), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WriteStdin(ctx, resp.SessionID, nil, true); err != nil {
		t.Fatal(err)
	}
	var out streams
	final, err := c.Follow(ctx, resp.SessionID, 0, out.add)
	if err != nil {
		t.Fatal(err)
	}
	if out.stdout.String() != "one twodone\n" || final.State != agentd.StateExited {
		t.Fatalf("stdout %q state %s", out.stdout.String(), final.State)
	}
	if err := c.WriteStdin(ctx, resp.SessionID, []byte("late"), false); !errors.Is(err, agentd.ErrNotRunning) {
		t.Fatalf("stdin after exit: %v; want ErrNotRunning", err)
	}

	noStdin, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "cat", WaitMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if noStdin.State != agentd.StateExited {
		t.Fatalf("cat without stdin should read /dev/null and exit, got %s", noStdin.State)
	}
	sleeper, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 30"})
	if err != nil {
		t.Fatal(err)
	}
	err = c.WriteStdin(ctx, sleeper.SessionID, []byte("x"), false)
	var apiErr *agentd.Error
	if !errors.Is(err, agentd.ErrStdinClosed) || !errors.As(err, &apiErr) || apiErr.Status != 409 {
		t.Fatalf("stdin without a pipe: %v; want 409 stdin_closed", err)
	}
	if err := c.Resize(ctx, sleeper.SessionID, 10, 10); !errors.Is(err, agentd.ErrNotATTY) {
		t.Fatalf("resize of a non-tty: %v; want ErrNotATTY", err)
	}
}

func TestSessionCap(t *testing.T) {
	t.Parallel()
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.MaxSessions = 2 }))
	ctx := testCtx(t)
	for range 2 {
		if _, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 30"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 30"})
	var apiErr *agentd.Error
	if !errors.Is(err, agentd.ErrTooManySessions) || !errors.As(err, &apiErr) || apiErr.Status != 429 {
		t.Fatalf("third session: %v; want 429 too_many_sessions", err)
	}
	h, err := c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.ActiveSessions != 2 || h.Status != "ok" {
		t.Fatalf("health %+v", h)
	}
}

func TestEndedSessionsAreReclaimedAfterTTL(t *testing.T) {
	t.Parallel()
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.SessionTTL = 50 * time.Millisecond }))
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "true", WaitMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the session to be reclaimed", func() bool {
		_, err := c.Poll(ctx, resp.SessionID, 0, 0)
		return errors.Is(err, agentd.ErrNotFound)
	})
}

func TestCwdEnvAndRoot(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, agentdtest.WithRoot(root))
	realRoot, _ := filepath.EvalSymlinks(root)
	tests := []struct {
		name    string
		req     agentd.CreateSessionRequest
		want    string
		wantErr error
	}{
		{"default cwd is the root", agentd.CreateSessionRequest{Command: "pwd"}, realRoot + "\n", nil},
		{"relative cwd", agentd.CreateSessionRequest{Command: "pwd", Cwd: "sub"}, filepath.Join(realRoot, "sub") + "\n", nil},
		{"absolute cwd inside", agentd.CreateSessionRequest{Command: "pwd", Cwd: filepath.Join(realRoot, "sub")}, filepath.Join(realRoot, "sub") + "\n", nil},
		{"cwd outside", agentd.CreateSessionRequest{Command: "pwd", Cwd: "/"}, "", agentd.ErrPathOutsideRoot},
		{"cwd dotdot", agentd.CreateSessionRequest{Command: "pwd", Cwd: "sub/../.."}, "", agentd.ErrPathOutsideRoot},
		{"missing cwd", agentd.CreateSessionRequest{Command: "pwd", Cwd: "nope"}, "", agentd.ErrNotFound},
		{"env", agentd.CreateSessionRequest{Command: `echo "$FOO-$BAR"`, Env: map[string]string{"FOO": "a b", "BAR": "c"}}, "a b-c\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.req.WaitMS = 5000
			res, err := c.Run(testCtx(t), tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v; want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tt.want {
				t.Fatalf("stdout %q; want %q", res.Stdout, tt.want)
			}
		})
	}
}

func TestCloseKillsRunningGroups(t *testing.T) {
	t.Parallel()
	srv, err := agentd.NewServer(agentd.Config{Token: "test-token-0123456789", KillGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := newHTTPServer(t, srv)
	c := agentd.NewClient(ts, "test-token-0123456789", nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	resp, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{
		Command: fmt.Sprintf("sleep 1000 & echo $! > %s; echo started; wait", pidFile),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out streams
	waitOutput(t, c, resp.SessionID, 0, &out, "started")
	srv.Close()
	// The session's end is recorded once its shell's exit has been seen
	// (exec records of everything before it are in by then): a moment
	// after Close on a loaded machine.
	var final *agentd.SessionResponse
	eventually(t, "the session to end", func() bool {
		final, err = c.Poll(testCtx(t), resp.SessionID, 0, 0)
		return err != nil || final.State != agentd.StateRunning
	})
	if err != nil {
		t.Fatal(err)
	}
	if final.State != agentd.StateKilled {
		t.Fatalf("state after Close: %s", final.State)
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	eventually(t, "the background sleep to die", func() bool { return processGone(pid) })
	if _, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "true"}); !errors.Is(err, agentd.ErrShuttingDown) {
		t.Fatalf("create after Close: %v; want ErrShuttingDown", err)
	}
}

func TestEndedSessionsBeyondCapAreReclaimedOldestFirst(t *testing.T) {
	t.Parallel()
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.MaxEndedSessions = 2 }))
	ctx := testCtx(t)
	var ids []string
	for range 4 {
		resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "true", WaitMS: 5000})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.SessionID)
	}
	for i, id := range ids {
		_, err := c.Poll(ctx, id, 0, 0)
		// The newest session is not yet counted when it is created, so
		// at most MaxEndedSessions+1 remain.
		if i == 0 && !errors.Is(err, agentd.ErrNotFound) {
			t.Errorf("session %d: %v; want it reclaimed", i, err)
		}
		if i >= 2 && err != nil {
			t.Errorf("session %d: %v; want it kept", i, err)
		}
	}
}

func TestLongPoll(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	quiet, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 30"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Poll(ctx, quiet.SessionID, 0, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Chunks) != 0 || r.State != agentd.StateRunning || r.NextCursor != 0 {
		t.Fatalf("quiet session: %+v", r)
	}

	// A poll that outlives the output returns with it rather than at wait_ms
	// (60 s here, far beyond the test context).
	talky, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 0.2; echo late; sleep 0.2"})
	if err != nil {
		t.Fatal(err)
	}
	r, err = c.Poll(ctx, talky.SessionID, 0, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Chunks) != 1 || string(r.Chunks[0].Data) != "late\n" {
		t.Fatalf("first poll: %+v", r)
	}
	// The next poll returns on the state change, with no chunks.
	r, err = c.Poll(ctx, talky.SessionID, r.NextCursor, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Chunks) != 0 || r.State != agentd.StateExited || r.ExitCode == nil || *r.ExitCode != 0 {
		t.Fatalf("second poll: %+v", r)
	}
}
