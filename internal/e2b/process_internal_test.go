package e2b

import (
	"net/http"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/e2b/gen/process"
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

// keepalive is the interval a quiet stream waits per poll: the client's
// Keepalive-Ping-Interval in seconds, at most pollWait, never a
// near-zero wait that would spin (20211507185753197 s overflows a
// Duration to 512 ns).
func TestKeepalive(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		header string
		want   time.Duration
	}{
		{"", 0},
		{"x", 0},
		{"0", 0},
		{"-5", 0},
		{"1", time.Second},
		{"50", pollWait},
		{"20211507185753197", pollWait},
		{"9223372036854775807", pollWait},
	} {
		if got := keepalive(http.Header{"Keepalive-Ping-Interval": {c.header}}); got != c.want {
			t.Errorf("Keepalive-Ping-Interval %q: %v, want %v", c.header, got, c.want)
		}
	}
}

// The audit log's source address: behind a trusted proxy, a caller cannot
// name its own address by writing X-Forwarded-For before the proxy appends
// the real one.
func TestSourceIP(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		trust bool
		xff   string
		want  string
	}{
		{"direct ignores the header", false, "6.6.6.6", "10.0.0.2"},
		{"proxied takes the proxy's entry", true, "6.6.6.6, 198.51.100.4", "198.51.100.4"},
		{"proxied without header is the peer", true, "", "10.0.0.2"},
	} {
		r, err := http.NewRequest(http.MethodGet, "http://x/health", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.RemoteAddr = "10.0.0.2:5555" // the proxy, on a private network
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := (&Server{TrustProxy: c.trust}).sourceIP(r); got != c.want {
			t.Errorf("%s: sourceIP = %q, want %q", c.name, got, c.want)
		}
	}
}
