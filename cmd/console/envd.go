package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/gatehouse/gatehouse/internal/console"
)

// serveEnvd serves the E2B data plane (envd's API) alone on its own
// address (--e2b-listen): sandboxes are named by Host 49983-<id>.<domain>
// or the E2b-Sandbox-Id header; a serve failure goes to errc. No write
// timeout: a command's output stream lasts as long as the command.
func serveEnvd(addr string, c *console.Console, stdout io.Writer, errc chan<- error) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("e2b listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: c.EnvdHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	fmt.Fprintf(stdout, "E2B data plane (envd's API) on %s\n", ln.Addr())
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			errc <- fmt.Errorf("e2b data plane server: %w", err)
		}
	}()
	return srv, nil
}
