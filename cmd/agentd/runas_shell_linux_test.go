//go:build linux

package main_test

import (
	"os"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TestRunAsShell: commands run with --run-as get that user's login shell
// from /etc/passwd as SHELL (the browser terminal starts it when it is
// zsh), not agentd's own; without --run-as they keep agentd's.
func TestRunAsShell(t *testing.T) {
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	nobodyShell := ""
	for line := range strings.SplitSeq(string(passwd), "\n") {
		if f := strings.Split(line, ":"); len(f) == 7 && f[0] == "nobody" {
			nobodyShell = f[6]
		}
	}
	if nobodyShell == "" {
		t.Fatal("no shell for nobody in /etc/passwd")
	}
	const agentdShell = "/opt/agentd-own/zsh"
	t.Setenv("SHELL", agentdShell) // agentd inherits it
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"same user", nil, agentdShell},
		{"run as nobody", []string{"--run-as", "nobody"}, nobodyShell},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, tc.args...)
			res, err := d.client.Run(ctxFor(t), agentd.CreateSessionRequest{Command: `printf "shell=%s" "$SHELL"`, WaitMS: 10000})
			if err != nil {
				t.Fatal(err)
			}
			if got := string(res.Stdout); got != "shell="+tc.want {
				t.Fatalf("command saw %q, want shell=%s (stderr %q)", got, tc.want, res.Stderr)
			}
		})
	}
}
