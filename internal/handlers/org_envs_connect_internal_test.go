package handlers

import (
	"testing"

	"github.com/gatehouse/gatehouse/internal/envs"
)

// TestHostListen is where the generated agentd command listens for each
// kind of environment URL (issue 26 item 10): where the URL says, every
// interface only for a host name, loopback behind TLS.
func TestHostListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url, listen string
		all, tls    bool
	}{
		{"http://127.0.0.1:49984", "127.0.0.1:49984", false, false},
		{"http://127.0.0.1:40155", "127.0.0.1:40155", false, false},
		{"http://localhost:8000", "127.0.0.1:8000", false, false},
		{"http://10.1.2.3:49984", "10.1.2.3:49984", false, false},
		{"http://[::1]:49984", "[::1]:49984", false, false},
		{"http://10.1.2.3", "10.1.2.3:80", false, false},
		{"http://build-01:49984", "0.0.0.0:49984", true, false},
		{"https://build-01", "127.0.0.1:49984", false, true},
		{"https://10.1.2.3:8443", "127.0.0.1:49984", false, true},
		{"not a url", "0.0.0.0:49984", true, false},
	} {
		listen, all, tls := hostListen(tc.url)
		if listen != tc.listen || all != tc.all || tls != tc.tls {
			t.Errorf("hostListen(%q) = %q, all interfaces %v, TLS %v; want %q, %v, %v", tc.url, listen, all, tls, tc.listen, tc.all, tc.tls)
		}
	}
}

// TestAgentdRoot is the --root the command gives agentd: the workspace
// root when the environment has one (quoted for the shell when it must
// be), else a directory of its own.
func TestAgentdRoot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ root, unix, windows string }{
		{"", "$HOME/gatehouse-agentd", `$env:USERPROFILE\gatehouse-agentd`},
		{"/srv/gatehouse/work", "/srv/gatehouse/work", "/srv/gatehouse/work"},
		{"/srv/agent work", "'/srv/agent work'", "/srv/agent work"},
		{"/srv/it's", `'/srv/it'\''s'`, "/srv/it's"},
	} {
		unix, windows := agentdRoot(envs.Environment{WorkspaceRoot: tc.root})
		if unix != tc.unix || windows != tc.windows {
			t.Errorf("agentdRoot(%q) = %q, %q; want %q, %q", tc.root, unix, windows, tc.unix, tc.windows)
		}
	}
}
