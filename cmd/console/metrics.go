package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/gatehouse/gatehouse/internal/console"
)

// serveMetrics serves /metrics on its own address (--metrics-listen), so
// the metrics are never on the public one; a serve failure goes to errc.
func serveMetrics(addr string, c *console.Console, stdout io.Writer, errc chan<- error) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", c.MetricsHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "Prometheus metrics on http://%s/metrics\n", ln.Addr())
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			errc <- fmt.Errorf("metrics server: %w", err)
		}
	}()
	return srv, nil
}
