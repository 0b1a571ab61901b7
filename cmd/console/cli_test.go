package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
)

// lockedBuffer lets the test read what run prints while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serverStarted is what serve prints once it listens.
const serverStarted = "Gatehouse console listening on"

// cliDataDir is a data dir with a platform admin (root@example.com) and
// an org acme whose log holds three events.
func cliDataDir(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	cfg := config.Config{DataDir: dir, AdminEmail: "root@example.com", TokenTTL: time.Hour, BaseURL: "http://console.test"}
	c, err := console.New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Orgs.Create(ctx, orgs.CreateInput{Slug: "acme", Name: "Acme"}); err != nil {
		t.Fatal(err)
	}
	ten, err := c.Tenants.Open(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer ten.Release()
	for range 3 {
		if _, err := ten.Audit.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "alice"}, Action: "thing.do"}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runLine runs the console's command line as main does. Should the line
// start a server, the server is stopped once it says it listens, and the
// output says so.
func runLine(t *testing.T, args []string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out, errOut lockedBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(string) string { return "" }, &out, &errOut) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return out.String(), errOut.String(), err
		case <-tick.C:
			if strings.Contains(out.String(), serverStarted) {
				cancel()
			}
		}
	}
}

// Issue 26, item 19: the console's flags go anywhere on the line and every
// subcommand takes them; an argument serve does not understand is an error
// (never a second server on the same data), and so is an unknown command.
func TestCommandLines(t *testing.T) {
	t.Parallel()
	dir := cliDataDir(t)
	for _, tc := range []struct {
		name string
		args []string
		out  string // in stdout, when the line succeeds
		err  string // in the error, when it must fail
	}{
		{name: "admin list after --data-dir", args: []string{"--data-dir", dir, "admin", "list"}, out: "root@example.com"},
		{name: "admin list before --data-dir", args: []string{"admin", "list", "--data-dir", dir}, out: "root@example.com"},
		{name: "--data-dir between admin and list", args: []string{"admin", "--data-dir=" + dir, "list"}, out: "root@example.com"},
		{name: "audit verify after --data-dir", args: []string{"--data-dir", dir, "audit", "verify", "--org", "acme"}, out: "ok: 3 events verified"},
		{name: "audit verify before --data-dir", args: []string{"audit", "verify", "--data-dir", dir, "--org", "acme"}, out: "ok: 3 events verified"},
		{name: "audit verify, --data-dir last", args: []string{"audit", "verify", "--org", "acme", "-data-dir", dir}, out: "ok: 3 events verified"},
		{name: "retention run after --data-dir", args: []string{"--data-dir", dir, "retention", "run", "--org", "acme"}, out: `Organization "acme" keeps everything`},
		{name: "retention run before --data-dir", args: []string{"retention", "run", "--org", "acme", "--data-dir", dir}, out: `Organization "acme" keeps everything`},
		{name: "migrate", args: []string{"migrate", "--data-dir", dir}, out: "org acme: up to date"},
		{name: "empty command", args: []string{"--data-dir", dir, ""}, err: `unknown command ""`},
		{name: "unknown command after --data-dir", args: []string{"--data-dir", dir, "frobnicate"}, err: `unknown command "frobnicate"`},
		{name: "serve with a stray argument", args: []string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "audit"}, err: `console serve takes no argument "audit"`},
		{name: "serve before another command", args: []string{"serve", "audit", "verify", "--org", "acme", "--data-dir", dir}, err: "did you mean console audit verify --org acme?"},
		{name: "migrate with a stray argument", args: []string{"migrate", "now", "--data-dir", dir}, err: `console migrate takes no argument "now"`},
		{name: "a command's flag without the command", args: []string{"--data-dir", dir, "--org", "acme"}, err: "flag provided but not defined: --org"},
		{name: "a console flag without its value", args: []string{"admin", "list", "--data-dir"}, err: "flag needs an argument: --data-dir"},
		{name: "audit without verify", args: []string{"--data-dir", dir, "audit", "--org", "acme"}, err: "usage: console audit verify"},
		{name: "retention without run", args: []string{"--data-dir", dir, "retention"}, err: "usage: console retention run"},
		{name: "bench with console flags", args: []string{"bench", "--data-dir", dir, "gateway"}, err: "takes none of the console's flags"},
		{name: "help", args: []string{"--data-dir", dir, "-h"}, err: flag.ErrHelp.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runLine(t, tc.args)
			if strings.Contains(out, serverStarted) {
				t.Fatalf("console %s started a server:\n%s", strings.Join(tc.args, " "), out)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q\nstdout:\n%s", err, tc.err, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("console %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(tc.args, " "), err, out, errOut)
			}
			if !strings.Contains(out, tc.out) {
				t.Fatalf("console %s printed:\n%s\nwant %q", strings.Join(tc.args, " "), out, tc.out)
			}
		})
	}
	t.Run("help lists the commands and the flags", func(t *testing.T) {
		_, errOut, err := runLine(t, []string{"help"})
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("help: %v", err)
		}
		for _, want := range []string{"retention run --org", "audit verify", "-data-dir", "-metrics-listen"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("help does not mention %q:\n%s", want, errOut)
			}
		}
	})
}

// The built binary: a subcommand after --data-dir runs and exits 0 (it
// used to start a server and never exit), and a line it does not
// understand exits non-zero saying why.
func TestBinaryCommandLines(t *testing.T) {
	t.Parallel()
	dir := cliDataDir(t)
	bin := filepath.Join(t.TempDir(), "console")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
		want string
	}{
		{name: "admin list after --data-dir", args: []string{"--data-dir", dir, "--listen", "127.0.0.1:0", "admin", "list"}, ok: true, want: "root@example.com"},
		{name: "audit verify before --data-dir", args: []string{"audit", "verify", "--org", "acme", "--data-dir", dir}, ok: true, want: "ok: 3 events verified"},
		{name: "serve with an unknown word", args: []string{"--data-dir", dir, "--listen", "127.0.0.1:0", "serve", "now"}, want: `console serve takes no argument "now"`},
		{name: "unknown command", args: []string{"--data-dir", dir, "adminn", "list"}, want: `unknown command "adminn"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A deadline only so that a regression (a server that never
			// exits) fails instead of hanging the suite.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Env = append(os.Environ(), "DATABASE_URL=", "GATEHOUSE_MASTER_KEY=", "GATEHOUSE_LISTEN=", "GATEHOUSE_METRICS_LISTEN=")
			out, err := cmd.CombinedOutput()
			if strings.Contains(string(out), serverStarted) {
				t.Fatalf("started a server:\n%s", out)
			}
			if tc.ok != (err == nil) {
				t.Fatalf("exit: %v, want success %v\n%s", err, tc.ok, out)
			}
			if !tc.ok {
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 {
					t.Fatalf("exit: %v, want status 1", err)
				}
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("output:\n%s\nwant %q", out, tc.want)
			}
		})
	}
}
