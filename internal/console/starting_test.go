package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// logSink is a goroutine-safe log buffer.
type logSink struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A console started while its catalog database refuses connections
// (ALLOW_CONNECTIONS false: 55000 to every connection) does not give up:
// it logs each attempt at warn and retries, its listener answering
// /healthz 200 and /readyz 503 (anything else 503 database_unavailable
// with Retry-After) meanwhile, and it starts and is ready once the
// database accepts connections again.
func TestStartWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	dsn := storetest.DSN(t, store.Postgres)
	name, err := store.DatabaseName(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{MasterKey: testMasterKey, AdminEmail: "admin@example.com", TokenTTL: time.Hour, HealthInterval: time.Hour,
		DatabaseURL: dsn, OrgDBPrefix: storetest.NewName("gh_test_waits_") + "_", DataDir: t.TempDir()}
	storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
	allow := storetest.RefuseConnections(t, name)

	logs := &logSink{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	gate := &console.Gate{}
	srv := httptest.NewServer(gate)
	t.Cleanup(srv.Close)
	type started struct {
		c   *console.Console
		err error
	}
	done := make(chan started, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		c, err := console.NewWhenReachable(ctx, cfg, logger, console.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond})
		done <- started{c, err}
	}()

	// Two attempts failed and were logged: the console is waiting.
	waitFor(t, "two attempts logged at warn", func() bool {
		return strings.Count(logs.String(), `level=WARN msg="database unavailable at start; retrying"`) >= 2
	})
	if !strings.Contains(logs.String(), "55000") {
		t.Errorf("the attempts do not say why they failed:\n%s", logs)
	}
	select {
	case s := <-done:
		t.Fatalf("the console stopped waiting while the database refused connections: %v", s.err)
	default:
	}
	if st, _ := get(t, srv.URL+"/healthz"); st != http.StatusOK {
		t.Errorf("/healthz while waiting: %d, want 200", st)
	}
	st, body := get(t, srv.URL+"/readyz")
	var ready struct{ Status string }
	if err := json.Unmarshal(body, &ready); st != http.StatusServiceUnavailable || err != nil || ready.Status != "starting" {
		t.Errorf("/readyz while waiting: %d %s, want 503 with status starting", st, body)
	}
	resp, err := http.Get(srv.URL + "/api/v1/orgs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"database_unavailable"`) {
		t.Errorf("API while waiting: %d Retry-After %q %s, want 503 database_unavailable with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	allow()
	var s started
	select {
	case s = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the console did not start within a minute of the database accepting connections")
	}
	if s.err != nil {
		t.Fatalf("start once the database accepts connections: %v", s.err)
	}
	t.Cleanup(s.c.Close)
	gate.Open(s.c.Handler())
	if st, body := get(t, srv.URL+"/readyz"); st != http.StatusOK {
		t.Fatalf("/readyz once started: %d %s, want 200", st, body)
	}
	if st, _ := get(t, srv.URL+"/healthz"); st != http.StatusOK {
		t.Errorf("/healthz once started: %d, want 200", st)
	}
}

// A failure that waiting cannot cure (the catalog database does not
// exist: 3D000) ends the start at once, as does the caller giving up.
func TestStartGivesUpOnOtherFailures(t *testing.T) {
	t.Parallel()
	dsn, err := store.WithDatabase(storetest.AdminDSN(t), storetest.NewName("gh_test_missing_"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{MasterKey: testMasterKey, AdminEmail: "admin@example.com", TokenTTL: time.Hour, HealthInterval: time.Hour,
		DatabaseURL: dsn, OrgDBPrefix: storetest.NewName("gh_test_missing_") + "_", DataDir: t.TempDir()}
	logs := &logSink{}
	if _, err := console.NewWhenReachable(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)), console.Backoff{Initial: time.Hour, Max: time.Hour}); err == nil {
		t.Fatal("started on a database that does not exist")
	}
	if strings.Contains(logs.String(), "retrying") {
		t.Errorf("retried a failure waiting cannot cure:\n%s", logs)
	}

	// Waiting for a refusing database ends with the caller's context.
	refusing := storetest.DSN(t, store.Postgres)
	name, err := store.DatabaseName(refusing)
	if err != nil {
		t.Fatal(err)
	}
	storetest.RefuseConnections(t, name)
	cfg.DatabaseURL = refusing
	ctx, cancel := context.WithCancel(context.Background())
	logs = &logSink{}
	errc := make(chan error, 1)
	go func() {
		_, err := console.NewWhenReachable(ctx, cfg, slog.New(slog.NewTextHandler(logs, nil)), console.Backoff{Initial: time.Hour, Max: time.Hour})
		errc <- err
	}()
	waitFor(t, "an attempt logged", func() bool { return strings.Contains(logs.String(), "retrying") })
	cancel()
	select {
	case err := <-errc:
		if err != context.Canceled {
			t.Fatalf("start after the caller gave up: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the start went on waiting after the caller gave up")
	}
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
