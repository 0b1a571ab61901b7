package e2benvd

import (
	"testing"

	"github.com/gatehouse/gatehouse/internal/e2benvd/gen/process"
)

// commandLine is what the command policy and the audit log see: the
// script of a shell's -c (what commands.run sends), else the program and
// its arguments quoted for agentd's shell.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"/bin/bash", []string{"-l", "-c", "echo hi && rm -rf /"}, "echo hi && rm -rf /"},
		{"sh", []string{"-c", "ls"}, "ls"},
		{"/usr/bin/zsh", []string{"-e", "-c", "x"}, "x"},
		// Not a shell's -c: run as given, every word quoted as needed.
		{"/bin/bash", []string{"script.sh", "-c", "x"}, "/bin/bash script.sh -c x"},
		{"python3", []string{"-c", "print('hi')"}, `python3 -c 'print('\''hi'\'')'`},
		{"/usr/bin/env", []string{"A=b c", ""}, `/usr/bin/env 'A=b c' ''`},
		{"ls", nil, "ls"},
	} {
		got := commandLine(&process.ProcessConfig{Cmd: c.cmd, Args: c.args})
		if got != c.want {
			t.Errorf("%s %q: %q, want %q", c.cmd, c.args, got, c.want)
		}
	}
}
