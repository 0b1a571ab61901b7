//go:build linux

package agentd_test

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// TestRunAsEnvironment: commands run as another user get that user's
// HOME, USER, LOGNAME and SHELL from the credential; agentd's own never
// show, so a user whose login shell is unknown has no SHELL rather than
// agentd's (the browser terminal would start the wrong user's shell).
func TestRunAsEnvironment(t *testing.T) {
	t.Setenv("SHELL", "/opt/agentd-own/zsh") // agentd's own environment
	t.Setenv("HOME", "/root-home")
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"login shell known", []string{"HOME=/", "USER=nobody", "LOGNAME=nobody", "SHELL=/bin/zsh"}, "/ nobody nobody /bin/zsh"},
		{"login shell unknown", []string{"HOME=/", "USER=nobody", "LOGNAME=nobody"}, "/ nobody nobody unset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := agentdtest.Client(t, agentdtest.WithRoot("/"), agentdtest.WithConfig(func(c *agentd.Config) {
				c.RunAs = &agentd.Credential{UID: 65534, GID: 65534, Env: tc.env}
			}))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := c.Run(ctx, agentd.CreateSessionRequest{Command: `printf "%s %s %s %s" "$HOME" "$USER" "$LOGNAME" "${SHELL-unset}"`, WaitMS: 10000})
			if err != nil {
				t.Fatal(err)
			}
			if got := string(res.Stdout); got != tc.want {
				t.Fatalf("command saw %q, want %q (stderr %q)", got, tc.want, res.Stderr)
			}
		})
	}
}
