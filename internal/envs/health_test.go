package envs_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// startAgentd runs a real agentd that the test can stop before it ends
// (agentdtest.Start only stops at cleanup).
func startAgentd(t *testing.T) (baseURL, tok string, stop func()) {
	t.Helper()
	tok = token("agentd")
	srv, err := agentd.NewServer(agentd.Config{Token: tok, Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	var once sync.Once
	stop = func() {
		once.Do(func() {
			// The network first, as when its host goes away: closing the
			// server first would answer probes "shutting down" (degraded)
			// for a moment, a transition a test may or may not see.
			ts.Close()
			srv.Close()
		})
	}
	t.Cleanup(stop)
	return ts.URL, tok, stop
}

// closedURL is an http URL nothing listens on any more.
func closedURL(t *testing.T) string {
	ts := httptest.NewServer(http.NotFoundHandler())
	ts.Close()
	return ts.URL
}

func healthEvents(t *testing.T, log *audit.Log) []audit.Event {
	t.Helper()
	flt, err := audit.ParseQuery("action:environment.health_change")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := log.Query(context.Background(), flt, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

type statusChange struct {
	Before struct {
		Status string `json:"status"`
	} `json:"before"`
	After struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	} `json:"after"`
}

// wantHealthEvent checks one audited status change.
func wantHealthEvent(t *testing.T, ev audit.Event, e envs.Environment, before, after string, secrets ...string) {
	t.Helper()
	if ev.Actor.Type != audit.ActorSystem || ev.Action != "environment.health_change" ||
		ev.Target.Type != "environment" || ev.Target.ID != itoa(e.ID) || ev.Target.Name != e.Name {
		t.Errorf("event = %+v", ev)
	}
	var d statusChange
	if err := json.Unmarshal(ev.Details, &d); err != nil {
		t.Fatalf("details %s: %v", ev.Details, err)
	}
	if d.Before.Status != before || d.After.Status != after {
		t.Errorf("details = %s, want %s -> %s", ev.Details, before, after)
	}
	for _, s := range secrets {
		if strings.Contains(string(ev.Details), s) {
			t.Errorf("details carry a secret: %s", ev.Details)
		}
	}
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }

func statusOf(t *testing.T, f fixture, id int64) envs.Environment {
	t.Helper()
	e, err := f.envs.Get(context.Background(), sys, id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestHealthHost checks a real agentd: healthy with its version and active
// sessions, unreachable once stopped, and exactly one audit event per
// status change.
func TestHealthHost(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		ctx := context.Background()
		base, tok, stop := startAgentd(t)
		e := f.mustCreate(t, hostInput("build-01", base, tok))
		log := audit.NewLog(f.db, audit.OrgTable, nil)

		h := f.envs.Check(ctx, e, 5*time.Second)
		if h.Status != envs.HealthHealthy || h.Version != agentd.Version || h.ActiveSessions != 0 || h.Error != "" || h.Latency <= 0 {
			t.Fatalf("Check = %+v", h)
		}

		c, err := f.envs.Agentd(e)
		if err != nil {
			t.Fatal(err)
		}
		sess, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "sleep 60"})
		if err != nil {
			t.Fatal(err)
		}
		if h = f.envs.Check(ctx, e, 5*time.Second); h.ActiveSessions != 1 {
			t.Errorf("active sessions = %d with one running", h.ActiveSessions)
		}

		for range 2 { // unknown -> healthy, then healthy -> healthy
			if h, err := f.envs.CheckAndRecord(ctx, e, log, 5*time.Second); err != nil || h.Status != envs.HealthHealthy {
				t.Fatalf("CheckAndRecord = %+v, %v", h, err)
			}
		}
		evs := healthEvents(t, log)
		if len(evs) != 1 {
			t.Fatalf("%d events after one change, want 1: %+v", len(evs), evs)
		}
		wantHealthEvent(t, evs[0], e, envs.HealthUnknown, envs.HealthHealthy, tok)
		row := statusOf(t, f, e.ID)
		if row.HealthStatus != envs.HealthHealthy || row.AgentdVersion != agentd.Version || row.ActiveSessions != 1 ||
			row.HealthCheckedAt == nil || row.HealthChangedAt == nil || row.HealthError != "" {
			t.Errorf("row = %+v", row)
		}
		changedAt := *row.HealthChangedAt
		_, _ = c.Kill(ctx, sess.SessionID)

		stop()
		h = f.envs.Check(ctx, e, 5*time.Second)
		if h.Status != envs.HealthUnreachable || h.Error == "" || strings.Contains(h.Error, tok) {
			t.Fatalf("Check of a stopped agentd = %+v", h)
		}
		for range 2 {
			if h, err := f.envs.CheckAndRecord(ctx, e, log, 5*time.Second); err != nil || h.Status != envs.HealthUnreachable {
				t.Fatalf("CheckAndRecord = %+v, %v", h, err)
			}
		}
		evs = healthEvents(t, log)
		if len(evs) != 2 {
			t.Fatalf("%d events after two changes, want 2", len(evs))
		}
		wantHealthEvent(t, evs[0], e, envs.HealthHealthy, envs.HealthUnreachable, tok) // newest first
		row = statusOf(t, f, e.ID)
		if row.HealthStatus != envs.HealthUnreachable || row.HealthError == "" || row.HealthChangedAt == nil || row.HealthChangedAt.Before(changedAt) {
			t.Errorf("row after stop = %+v", row)
		}
		if res, err := log.Verify(ctx); err != nil || !res.OK {
			t.Errorf("audit chain: %+v, %v", res, err)
		}
	})
}

// TestHealthSandbox checks a sandbox backend (the fake): healthy, template
// status refreshed, degraded when a registered template is missing or the
// key is wrong, unreachable when nothing answers.
func TestHealthSandbox(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		ctx := context.Background()
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{Templates: []e2bfake.Template{
			{ID: "base", Aliases: []string{"base"}, CPU: 2, MemoryMB: 512, DiskSizeMB: 1024},
			{ID: "tpl-gpu", Aliases: []string{"gpu"}, CPU: 8, MemoryMB: 8192, DiskSizeMB: 4096},
		}})
		s := f.mustCreate(t, sandboxInput("cloud", fake.URL(), fake.Domain(), e2bfaketest.Token, e2bfaketest.APIKey))
		log := audit.NewLog(f.db, audit.OrgTable, nil)

		if h := f.envs.Check(ctx, s, 5*time.Second); h.Status != envs.HealthHealthy || h.Error != "" {
			t.Fatalf("Check = %+v", h)
		}

		base, err := f.envs.AddTemplate(ctx, sys, s.ID, envs.TemplateInput{BackendTemplateID: "base", VCPU: 2, MemoryMB: 512})
		if err != nil {
			t.Fatal(err)
		}
		gpu, err := f.envs.AddTemplate(ctx, sys, s.ID, envs.TemplateInput{BackendTemplateID: "gpu", VCPU: 8, MemoryMB: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if base.BackendStatus != "unknown" || base.Ready() {
			t.Fatalf("new template status = %q", base.BackendStatus)
		}
		if h := f.envs.Check(ctx, s, 5*time.Second); h.Status != envs.HealthHealthy {
			t.Fatalf("Check with known templates = %+v", h)
		}
		for _, id := range []int64{base.ID, gpu.ID} { // by id and by alias
			if tpl, _ := f.envs.GetTemplate(ctx, sys, id); tpl.BackendStatus != "ready" || !tpl.Ready() {
				t.Errorf("template %s status = %q, want ready", tpl.BackendTemplateID, tpl.BackendStatus)
			}
		}

		ghost, err := f.envs.AddTemplate(ctx, sys, s.ID, envs.TemplateInput{BackendTemplateID: "ghost-tpl", VCPU: 1, MemoryMB: 256, BackendStatus: "ready"})
		if err != nil {
			t.Fatal(err)
		}
		h, err := f.envs.CheckAndRecord(ctx, s, log, 5*time.Second)
		if err != nil || h.Status != envs.HealthDegraded || !strings.Contains(h.Error, "ghost-tpl") {
			t.Fatalf("CheckAndRecord with a missing template = %+v, %v", h, err)
		}
		if tpl, _ := f.envs.GetTemplate(ctx, sys, ghost.ID); tpl.BackendStatus != "missing" || tpl.Ready() {
			t.Errorf("missing template status = %q", tpl.BackendStatus)
		}
		if tpl, _ := f.envs.GetTemplate(ctx, sys, base.ID); tpl.BackendStatus != "ready" {
			t.Errorf("present template status = %q", tpl.BackendStatus)
		}
		evs := healthEvents(t, log)
		if len(evs) != 1 {
			t.Fatalf("%d events, want 1", len(evs))
		}
		wantHealthEvent(t, evs[0], s, envs.HealthUnknown, envs.HealthDegraded, e2bfaketest.APIKey, e2bfaketest.Token)
		if row := statusOf(t, f, s.ID); row.HealthStatus != envs.HealthDegraded || !strings.Contains(row.HealthError, "ghost-tpl") {
			t.Errorf("row = %+v", row)
		}

		wrongKey := f.mustCreate(t, sandboxInput("wrong-key", fake.URL(), fake.Domain(), e2bfaketest.Token, "not-the-key"))
		if h := f.envs.Check(ctx, wrongKey, 5*time.Second); h.Status != envs.HealthDegraded || !strings.Contains(h.Error, "template list failed") ||
			strings.Contains(h.Error, "not-the-key") {
			t.Errorf("Check with a wrong key = %+v", h)
		}
		gone := f.mustCreate(t, sandboxInput("gone", closedURL(t), "e2b.app", e2bfaketest.Token, e2bfaketest.APIKey))
		if h := f.envs.Check(ctx, gone, 5*time.Second); h.Status != envs.HealthUnreachable || h.Error == "" {
			t.Errorf("Check of a closed backend = %+v", h)
		}
	})
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func orgDeps(f fixture, log *audit.Log, released *atomic.Int64) func(context.Context, string) (envs.OrgDeps, error) {
	return func(_ context.Context, slug string) (envs.OrgDeps, error) {
		if slug != testOrg {
			return envs.OrgDeps{}, io.ErrUnexpectedEOF
		}
		return envs.OrgDeps{Envs: f.envs, Audit: log, Release: func() { released.Add(1) }}, nil
	}
}

// TestCheckerRound runs one round over two slugs, one of which fails to
// open: the other is still checked and its deps released.
func TestCheckerRound(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		base, tok, _ := startAgentd(t)
		e := f.mustCreate(t, hostInput("h", base, tok))
		gone := f.mustCreate(t, hostInput("gone", closedURL(t), tok))
		log := audit.NewLog(f.db, audit.OrgTable, nil)
		var released atomic.Int64
		c := &envs.Checker{
			ListOrgs: func(context.Context) ([]string, error) { return []string{"broken", testOrg}, nil },
			OpenOrg:  orgDeps(f, log, &released),
			Timeout:  5 * time.Second,
			Logger:   discard(),
		}
		c.Round(context.Background())
		if got := statusOf(t, f, e.ID).HealthStatus; got != envs.HealthHealthy {
			t.Errorf("status = %q, want healthy", got)
		}
		if got := statusOf(t, f, gone.ID).HealthStatus; got != envs.HealthUnreachable {
			t.Errorf("status = %q, want unreachable", got)
		}
		if released.Load() != 1 {
			t.Errorf("released %d times, want 1", released.Load())
		}
		if n := len(healthEvents(t, log)); n != 2 {
			t.Errorf("%d events, want 2", n)
		}
	})
}

// TestCheckerRunMarksUnreachable drives Checker.Run with a short interval,
// stops the agentd and asserts that by the time two more full rounds have
// run the environment is unreachable. Rounds are counted, not timed.
func TestCheckerRunMarksUnreachable(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		base, tok, stop := startAgentd(t)
		e := f.mustCreate(t, hostInput("h", base, tok))
		log := audit.NewLog(f.db, audit.OrgTable, nil)
		var (
			released atomic.Int64
			mu       sync.Mutex
			atStart  []string // the status when each round began
		)
		c := &envs.Checker{
			ListOrgs: func(ctx context.Context) ([]string, error) {
				var st string
				f.db.WithContext(ctx).Raw("SELECT health_status FROM environments WHERE id = ?", e.ID).Scan(&st)
				mu.Lock()
				atStart = append(atStart, st)
				mu.Unlock()
				return []string{testOrg}, nil
			},
			OpenOrg:  orgDeps(f, log, &released),
			Interval: 100 * time.Millisecond,
			Timeout:  5 * time.Second,
			Logger:   discard(),
		}
		rounds := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(atStart)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); c.Run(ctx) }()
		defer func() { cancel(); <-done }()

		waitFor(t, func() bool { return statusOf(t, f, e.ID).HealthStatus == envs.HealthHealthy }, "healthy")
		stop()
		r0 := rounds() // rounds r0+1 and later begin after the stop
		waitFor(t, func() bool { return statusOf(t, f, e.ID).HealthStatus == envs.HealthUnreachable }, "unreachable")
		waitFor(t, func() bool { return rounds() >= r0+3 }, "two more rounds")
		mu.Lock()
		seen := atStart[r0+2] // when round r0+3 began, r0+1 and r0+2 had finished
		mu.Unlock()
		if seen != envs.HealthUnreachable {
			t.Errorf("status after two full rounds since the stop = %q, want unreachable", seen)
		}
		if evs := healthEvents(t, log); len(evs) != 2 {
			t.Errorf("%d events %+v, want 2 (unknown->healthy, healthy->unreachable)", len(evs), evs)
		}
	})
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCheckerAdvisoryLock runs two checkers on two pools of one Postgres
// database. While the first holds the org's lock (its probe is held open),
// the second skips the org without probing; once the first is done the
// lock is free again.
func TestCheckerAdvisoryLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := storetest.DSN(t, store.Postgres)
	pool := func() fixture {
		db, err := store.Open(ctx, dsn, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close(db) })
		return fixture{db: db}
	}
	p1, p2 := pool(), pool()
	if _, err := store.Migrate(ctx, p1.db, store.OrgSet); err != nil {
		t.Fatal(err)
	}
	box := newBox(t)
	f1, f2 := over(t, p1.db, box), over(t, p2.db, box)

	base, tok, _ := startAgentd(t)
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var probes atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	wrapper := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" && probes.Add(1) == 1 {
			close(started)
			<-release
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(wrapper.Close)
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // runs before wrapper.Close

	e := f1.mustCreate(t, hostInput("h", wrapper.URL, tok))
	log := audit.NewLog(p1.db, audit.OrgTable, nil)
	var released atomic.Int64
	checker := func(f fixture) *envs.Checker {
		return &envs.Checker{ListOrgs: func(context.Context) ([]string, error) { return []string{testOrg}, nil },
			OpenOrg: orgDeps(f, log, &released), Timeout: 30 * time.Second, Logger: discard()}
	}
	a, b := checker(f1), checker(f2)

	errA := make(chan error, 1)
	go func() { errA <- a.CheckOrg(ctx, testOrg) }()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first checker never probed")
	}
	if err := b.CheckOrg(ctx, testOrg); err != nil {
		t.Fatalf("second checker: %v", err)
	}
	if n := probes.Load(); n != 1 {
		t.Fatalf("%d probes while the first checker held the lock, want 1", n)
	}
	free()
	if err := <-errA; err != nil {
		t.Fatalf("first checker: %v", err)
	}
	if n := probes.Load(); n != 1 {
		t.Fatalf("%d probes after one round, want 1", n)
	}
	if got := statusOf(t, f2, e.ID).HealthStatus; got != envs.HealthHealthy {
		t.Errorf("status = %q", got)
	}
	if err := b.CheckOrg(ctx, testOrg); err != nil {
		t.Fatal(err)
	}
	if n := probes.Load(); n != 2 {
		t.Errorf("%d probes after the lock was released and the second checker ran, want 2", n)
	}
	if released.Load() != 3 {
		t.Errorf("org deps released %d times, want 3", released.Load())
	}
}

// TestHealthExplainsFailures: a probe that fails says what to check, not
// just the raw network error.
func TestHealthExplainsFailures(t *testing.T) {
	t.Parallel()
	f := setup(t, store.SQLite)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	e := f.mustCreate(t, hostInput("refused", closed, token("r")))
	h := f.envs.Check(context.Background(), e, 5*time.Second)
	if h.Status != envs.HealthUnreachable || !strings.Contains(h.Error, "Connection refused: is agentd") {
		t.Fatalf("health = %+v, want an unreachable status that says the connection was refused", h)
	}
}

// TestRecordHealthKeepsLongNonASCIIReasons: an error or exec-reporting
// reason over its column's budget, in characters of several bytes, is
// cut on a character, so Postgres stores it.
func TestRecordHealthKeepsLongNonASCIIReasons(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		e := f.mustCreate(t, hostInput("build-01", "http://127.0.0.1:9", "0123456789abcdef0123"))
		long := strings.Repeat("日", 200) // 600 bytes: the 500-byte cut falls inside a character
		if _, err := f.envs.RecordHealth(context.Background(), e.ID, envs.Health{Status: envs.HealthUnreachable, Error: long,
			ExecReporting: "unavailable", ExecReportingReason: long}); err != nil {
			t.Fatalf("RecordHealth: %v", err)
		}
		got := statusOf(t, f, e.ID)
		if !utf8.ValidString(got.HealthError) || !strings.HasPrefix(got.HealthError, "日日") || len(got.HealthError) > 503 {
			t.Errorf("stored health error %q (%d bytes)", got.HealthError, len(got.HealthError))
		}
	})
}
