package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
)

// --e2b-listen serves the E2B data plane alone: envd's health and RPCs
// (refused without a sandbox's token), none of the console's routes.
func TestServeEnvdOnItsOwnAddress(t *testing.T) {
	cfg, _, err := config.Load("console", []string{"--listen", "127.0.0.1:0", "--e2b-listen", "127.0.0.1:0", "--data-dir", t.TempDir()},
		func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	re := regexp.MustCompile(`E2B data plane \(envd's API\) on (127\.0\.0\.1:\d+)`)
	var addr string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && addr == ""; time.Sleep(50 * time.Millisecond) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("the data plane's address is not announced:\n%s", out.String())
	}
	do := func(method, path string, h map[string]string, body string) int {
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := do(http.MethodGet, "/health", nil, ""); code != http.StatusNoContent {
		t.Fatalf("envd /health: %d", code)
	}
	rpc := map[string]string{"Content-Type": "application/json", "E2b-Sandbox-Id": "acme-0123456789abcdef", "X-Access-Token": "nope"}
	if code := do(http.MethodPost, "/process.Process/List", rpc, "{}"); code != http.StatusUnauthorized {
		t.Fatalf("List with a wrong token: %d", code)
	}
	if code := do(http.MethodGet, "/healthz", nil, ""); code != http.StatusNotFound {
		t.Fatalf("the console's /healthz on the data plane's address: %d", code)
	}
}
