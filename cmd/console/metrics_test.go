package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// --metrics-listen serves /metrics on its own address, and the public
// address does not serve it.
func TestServeMetricsOnItsOwnAddress(t *testing.T) {
	cfg, _, err := config.Load("console", []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir", t.TempDir()},
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
	public := regexp.MustCompile(`listening on (127\.0\.0\.1:\d+)`)
	metrics := regexp.MustCompile(`metrics on http://(127\.0\.0\.1:\d+)/metrics`)
	var pub, met string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m, n := public.FindStringSubmatch(out.String()), metrics.FindStringSubmatch(out.String()); m != nil && n != nil {
			pub, met = m[1], n[1]
			break
		}
	}
	if pub == "" || met == "" || pub == met {
		t.Fatalf("addresses not announced:\n%s", out.String())
	}
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("http://" + pub + "/healthz"); code != http.StatusOK {
		t.Fatalf("public /healthz: %d", code)
	}
	code, body := get("http://" + met + "/metrics")
	if code != http.StatusOK || !strings.Contains(body, `gatehouse_http_requests_total{method="GET",route="/healthz",status="200"} 1`) {
		t.Fatalf("metrics: %d\n%.2000s", code, body)
	}
	if code, _ := get("http://" + pub + "/metrics"); code != http.StatusNotFound {
		t.Fatalf("the public address serves /metrics: %d", code)
	}
}
