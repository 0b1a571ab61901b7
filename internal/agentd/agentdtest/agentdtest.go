// Package agentdtest starts real in-process agentd servers for tests of
// packages that talk to agentd.
package agentdtest

import (
	"crypto/rand"
	"net/http/httptest"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// Option adjusts the server configuration before Start builds it.
type Option func(*agentd.Config)

// WithRoot confines file operations to dir and makes it the default cwd.
func WithRoot(dir string) Option {
	return func(c *agentd.Config) { c.Root = dir }
}

// WithConfig applies arbitrary changes to the configuration.
func WithConfig(fn func(*agentd.Config)) Option { return fn }

// Start runs an agentd server on an httptest server and returns its base URL
// and bearer token. The server, its sessions and their processes are cleaned
// up when the test ends.
func Start(t testing.TB, opts ...Option) (url, token string) {
	t.Helper()
	cfg := agentd.Config{Token: rand.Text()}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := agentd.NewServer(cfg)
	if err != nil {
		t.Fatalf("agentdtest: start server: %v", err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close() // ends long-polls so the httptest server can close
		ts.Close()
	})
	return ts.URL, cfg.Token
}

// Client starts a server like Start and returns a client for it.
func Client(t testing.TB, opts ...Option) *agentd.Client {
	t.Helper()
	url, token := Start(t, opts...)
	return agentd.NewClient(url, token, nil)
}
