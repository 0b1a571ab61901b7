package terminal_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/gatehouse/gatehouse/internal/terminal"
)

// TestShellCommandQuoting: the integrations travel inside single quotes
// of ShellCommand, so none of them may hold one, and the whole command
// must parse as sh.
func TestShellCommandQuoting(t *testing.T) {
	t.Parallel()
	for name, s := range terminal.ShellParts() {
		if strings.ContainsRune(s, '\'') {
			t.Errorf("%s holds a single quote", name)
		}
	}
	if out, err := exec.Command("sh", "-n", "-c", terminal.ShellCommand).CombinedOutput(); err != nil {
		t.Fatalf("sh cannot parse ShellCommand: %v: %s", err, out)
	}
}

// ptyShell is ShellCommand running in a real pty, its output collected.
type ptyShell struct {
	mu  sync.Mutex
	out bytes.Buffer
	tty *os.File
	cmd *exec.Cmd
	eof chan struct{}
}

func startPTYShell(t *testing.T, env []string) *ptyShell {
	t.Helper()
	cmd := exec.Command("sh", "-c", terminal.ShellCommand)
	cmd.Env = env
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 200})
	if err != nil {
		t.Fatal(err)
	}
	s := &ptyShell{tty: tty, cmd: cmd, eof: make(chan struct{})}
	go func() {
		defer close(s.eof)
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			s.mu.Lock()
			s.out.Write(buf[:n])
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = tty.Close()
	})
	return s
}

func (s *ptyShell) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// waitFor waits until the output holds want n times.
func (s *ptyShell) waitFor(t *testing.T, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for strings.Count(s.output(), want) < n {
		if time.Now().After(deadline) {
			t.Fatalf("no %q (%d) after 15 s; output: %q", want, n, s.output())
		}
		select {
		case <-s.eof:
			if strings.Count(s.output(), want) < n {
				t.Fatalf("the shell ended without %q; output: %q", want, s.output())
			}
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestZshIntegrationStartupFiles: the terminal's zsh reads the user's own
// startup files wherever zsh itself would (HOME, an inherited ZDOTDIR, a
// ZDOTDIR the user's .zshenv sets), leaves ZDOTDIR as the user has it and
// no private directory behind, and still gives the user a working shell
// when a .zshenv turns startup files off or no private directory can be
// made (then without marks).
func TestZshIntegrationStartupFiles(t *testing.T) {
	t.Parallel()
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Fatalf("zsh is required for this test (scripts/test installs it): %v", err)
	}
	const rc = "alias greet=\"echo alias-ran\"\nPS1=\"ready> \"\n"
	for _, tc := range []struct {
		name    string
		files   map[string]string // under HOME
		zdotdir string            // ZDOTDIR in the environment, under HOME ("": unset)
		tmpdir  string            // TMPDIR, under HOME ("": a fresh directory)
		want    []string          // in the probe's output
		marks   bool
		// switchOff: the user removes the hooks with add-zsh-hook -d, and
		// the marks stop.
		switchOff bool
	}{
		{name: "home", files: map[string]string{".zlogin": "export GH_L=login-ran\n",
			// A prompt theme: a precmd of the user's that sets PS1 anew
			// at each prompt. It still runs, and the B mark is still there.
			".zshrc": rc + "precmd() { print -n \"[mine]\"; PS1=\"ready> \" }\n",
			// The private directory is the user's alone while it exists.
			".zshenv": "print -r -- \"private=$(stat -c %a:%u $__gatehouse_dir)\"\n"},
			want: []string{"alias-ran", "probe-42 login-ran zdotdir=unset", "private=700:" + strconv.Itoa(os.Getuid()), "[mine]"}, marks: true,
			switchOff: true},
		{name: "inherited ZDOTDIR", zdotdir: "z", files: map[string]string{"z/.zshenv": "PS1=\"ready> \"\n", "z/.zshrc": rc, ".zshrc": "alias greet=\"echo wrong-rc\"\n"},
			want: []string{"alias-ran", "zdotdir=HOME/z"}, marks: true},
		{name: "ZDOTDIR set by .zshenv", files: map[string]string{".zshenv": "export ZDOTDIR=$HOME/cfg\n", "cfg/.zshrc": rc, "cfg/.zlogin": "export GH_L=login-ran\n"},
			want: []string{"alias-ran", "probe-42 login-ran zdotdir=HOME/cfg"}, marks: true},
		{name: "RCS turned off", files: map[string]string{".zshenv": "PS1=\"ready> \"\nalias greet=\"echo alias-ran\"\nunsetopt rcs\n", ".zshrc": "alias greet=\"echo wrong-rc\"\n"},
			want: []string{"alias-ran", "zdotdir=unset"}},
		{name: "no private directory", tmpdir: "missing/dir", files: map[string]string{".zshrc": rc},
			want: []string{"alias-ran", "zdotdir=unset"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			home := t.TempDir()
			for name, body := range tc.files {
				p := filepath.Join(home, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tmp := t.TempDir()
			if tc.tmpdir != "" {
				tmp = filepath.Join(home, tc.tmpdir)
			}
			env := []string{"SHELL=" + zsh, "HOME=" + home, "TMPDIR=" + tmp, "PATH=" + os.Getenv("PATH"), "TERM=xterm-256color"}
			if tc.zdotdir != "" {
				env = append(env, "ZDOTDIR="+filepath.Join(home, tc.zdotdir))
			}
			s := startPTYShell(t, env)
			s.waitFor(t, "ready> ", 1)
			if _, err := s.tty.WriteString("greet; echo probe-$((6*7)) $GH_L zdotdir=${ZDOTDIR-unset}\n"); err != nil {
				t.Fatal(err)
			}
			s.waitFor(t, "probe-42", 1)
			s.waitFor(t, "ready> ", 2)
			out := strings.ReplaceAll(s.output(), home, "HOME")
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output %q lacks %q", out, w)
				}
			}
			if got := strings.Contains(out, "\x1b]133;D;0\x07"); got != tc.marks {
				t.Errorf("OSC 133 marks: %v, want %v; output %q", got, tc.marks, out)
			}
			if tc.marks && strings.Count(out, "ready> \x1b]133;B\x07") < 2 {
				t.Errorf("prompts without the B mark: %q", out)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("TMPDIR holds %v", left)
			}
			if tc.switchOff {
				if _, err := s.tty.WriteString("add-zsh-hook -d precmd __gatehouse_precmd; add-zsh-hook -d preexec __gatehouse_preexec; echo off-$((1+1))\n"); err != nil {
					t.Fatal(err)
				}
				s.waitFor(t, "off-2", 1)
				s.waitFor(t, "ready> ", 3)
				if _, err := s.tty.WriteString("echo still-$((2+1))\n"); err != nil {
					t.Fatal(err)
				}
				s.waitFor(t, "still-3", 1)
				s.waitFor(t, "ready> ", 4)
				_, after, _ := strings.Cut(s.output(), "off-2")
				// Without C no line is listed (B may stay in a PS1 that
				// no theme resets).
				if strings.Contains(after, "\x1b]133;C") || strings.Contains(after, "\x1b]133;D") {
					t.Errorf("marks after the hooks were removed: %q", after)
				}
			}
			if _, err := s.tty.WriteString("exit\n"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-s.eof:
			case <-time.After(15 * time.Second):
				t.Fatalf("the shell did not exit; output %q", s.output())
			}
		})
	}
}
