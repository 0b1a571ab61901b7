package config_test

import (
	"io"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/config"
)

// TestCapSettings: the caps on open sessions and running commands default
// to 20 and 200 sessions, 20 and 100 commands (per user, per agent); flags
// win over the environment, 0 turns a cap off, and nonsense is refused at
// start naming the setting.
func TestCapSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want [4]int
		err  string
	}{
		{name: "defaults", want: [4]int{20, 200, 20, 100}},
		{name: "environment", env: map[string]string{"GATEHOUSE_MAX_OPEN_SESSIONS_PER_USER": "5", "GATEHOUSE_MAX_OPEN_SESSIONS_PER_AGENT": "50",
			"GATEHOUSE_MAX_RUNNING_COMMANDS_PER_USER": "3", "GATEHOUSE_MAX_RUNNING_COMMANDS_PER_AGENT": "0"}, want: [4]int{5, 50, 3, 0}},
		{name: "flags win", args: []string{"--max-open-sessions-per-user", "7", "--max-running-commands-per-agent", "9"},
			env: map[string]string{"GATEHOUSE_MAX_OPEN_SESSIONS_PER_USER": "5"}, want: [4]int{7, 200, 20, 9}},
		{name: "negative", args: []string{"--max-open-sessions-per-agent", "-1"}, err: "--max-open-sessions"},
		{name: "unparsable environment", env: map[string]string{"GATEHOUSE_MAX_RUNNING_COMMANDS_PER_USER": "lots"}, err: "GATEHOUSE_MAX_RUNNING_COMMANDS_PER_USER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := config.Load("console", tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := [4]int{c.MaxOpenSessionsPerUser, c.MaxOpenSessionsPerAgent, c.MaxRunningCommandsPerUser, c.MaxRunningCommandsPerAgent}
			if got != tc.want {
				t.Fatalf("caps %v, want %v", got, tc.want)
			}
		})
	}
}
