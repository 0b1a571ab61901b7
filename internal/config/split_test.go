package config_test

import (
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/config"
)

// The console's flags go anywhere on the line (issue 26, item 19): before
// the command, after it, among the command's own flags, as --flag value,
// --flag=value or -flag value; the rest keeps its order for the command.
func TestSplitGlobalFlagsAnywhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		args      []string
		own, rest []string
		err       string
	}{
		{name: "before the command", args: []string{"--data-dir", "D", "audit", "verify", "--org", "x"},
			own: []string{"--data-dir", "D"}, rest: []string{"audit", "verify", "--org", "x"}},
		{name: "after the command", args: []string{"audit", "verify", "--data-dir", "D", "--org", "x"},
			own: []string{"--data-dir", "D"}, rest: []string{"audit", "verify", "--org", "x"}},
		{name: "at the end, with =", args: []string{"admin", "list", "--data-dir=D"},
			own: []string{"--data-dir=D"}, rest: []string{"admin", "list"}},
		{name: "single dash and bools", args: []string{"-listen", ":0", "serve", "--trust-proxy", "--metrics-per-org-db=false"},
			own: []string{"-listen", ":0", "--trust-proxy", "--metrics-per-org-db=false"}, rest: []string{"serve"}},
		{name: "a bool takes no value", args: []string{"--local-sandboxes", "serve"},
			own: []string{"--local-sandboxes"}, rest: []string{"serve"}},
		{name: "command flags and stdin stay", args: []string{"audit", "verify", "--file", "-", "--checkpoint", "cp.json"},
			rest: []string{"audit", "verify", "--file", "-", "--checkpoint", "cp.json"}},
		{name: "after -- nothing is taken", args: []string{"audit", "--", "--data-dir", "D"},
			rest: []string{"audit", "--", "--data-dir", "D"}},
		{name: "missing value", args: []string{"admin", "list", "--data-dir"}, err: "flag needs an argument: --data-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			own, rest, err := config.Split(tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(own, tc.own) || !slices.Equal(rest, tc.rest) {
				t.Fatalf("own %q rest %q; want %q and %q", own, rest, tc.own, tc.rest)
			}
			// Load takes the same flags from the same line.
			c, lrest, err := config.Load("console", tc.args, func(string) string { return "" }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(lrest, tc.rest) {
				t.Fatalf("Load left %q, want %q", lrest, tc.rest)
			}
			if slices.Contains(tc.own, "--data-dir") || slices.Contains(tc.own, "--data-dir=D") {
				// Made absolute once, at load (the local backend starts
				// agentd from another working directory).
				if want, _ := filepath.Abs("D"); c.DataDir != want {
					t.Fatalf("data dir %q, want %q", c.DataDir, want)
				}
			}
		})
	}
}

// The log level comes from --log-level or GATEHOUSE_LOG_LEVEL (info by
// default); debug shows the rounds of the background loops that changed
// nothing, and a level that is not one is refused naming the setting.
func TestLogLevel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want slog.Level
		err  string
	}{
		{name: "default", want: slog.LevelInfo},
		{name: "environment", env: map[string]string{"GATEHOUSE_LOG_LEVEL": "debug"}, want: slog.LevelDebug},
		{name: "flag wins, after the command", args: []string{"serve", "--log-level", "warn"}, env: map[string]string{"GATEHOUSE_LOG_LEVEL": "debug"}, want: slog.LevelWarn},
		{name: "bad environment", env: map[string]string{"GATEHOUSE_LOG_LEVEL": "loud"}, err: "GATEHOUSE_LOG_LEVEL"},
		{name: "bad flag", args: []string{"--log-level=loud"}, err: "log-level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _, err := config.Load("console", tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil || c.LogLevel != tc.want {
				t.Fatalf("level %v (%v), want %v", c.LogLevel, err, tc.want)
			}
		})
	}
}
