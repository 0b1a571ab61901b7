// Package bench measures the terminal gateway against agentd itself:
// it stands up a real console (in this process, so its memory can be read)
// on SQLite or Postgres, sets up an org, a host environment on a real
// agentd, an agent, a member with a personal API key and a session, all
// through the JSON API, and then times the same operations direct to
// agentd and through the gateway. `console bench gateway` prints the
// figures; this package's go test benchmarks reuse the stack.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Agentd is the agentd the benchmark's host environment points at.
type Agentd struct {
	URL, Token string
	// Close stops it (nil when the caller owns it).
	Close func()
}

// StartAgentd serves a real agentd (running real processes) on a loopback
// port of this process. own says agentd has the process to itself (the
// benchmark's agentd child): it is then set up as cmd/agentd sets it up,
// a subreaper starting commands through its spawner; beside a console or
// tests it is neither (a subreaper would reap their children).
func StartAgentd(root string, own bool) (*Agentd, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for agentd: %w", err)
	}
	token := auth.RandomHex(16)
	srv, err := agentd.NewServer(agentd.Config{Token: token, Root: root, MaxSessions: 4096, Subreaper: own, Spawner: own})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("start agentd: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return &Agentd{URL: "http://" + ln.Addr().String(), Token: token, Close: func() {
		_ = hs.Close()
		srv.Close()
	}}, nil
}

// Options choose the console's database and the agentd it uses.
type Options struct {
	// PostgresDSN, when set, runs the console on Postgres: a throwaway
	// catalog database and org databases are created through this server
	// and dropped at Close. Empty: SQLite in DataDir.
	PostgresDSN string
	// DataDir holds the SQLite databases and the master key file.
	DataDir string
	Agentd  *Agentd
	// Logger receives the console's logs (default: warnings to stderr).
	Logger *slog.Logger
}

// Stack is a running console with a ready session, seen through its API.
type Stack struct {
	Console *console.Console
	// URL is the console's base URL.
	URL string
	Org string
	// Runtime is the member's API key and session.
	Runtime
	// Load is a second member's key and session, of a second agent: the
	// followed commands run there, so the execs timed meanwhile are a
	// user's below their caps (whose count reads only their own running
	// commands), not those of the user running the 2,000.
	Load Runtime
	// Direct is agentd without the console, for comparison.
	Direct *agentd.Client
	// HTTP is the benchmark's client of the console.
	HTTP *http.Client
	// Dialect is the console's database engine.
	Dialect store.Dialect

	// Profile counts database round trips once Instrument was called.
	Profile *Profile
	// HeapProfile, when set, is where IdlePolls writes a heap profile
	// while its polls wait.
	HeapProfile string
	// CPUProfile, when set, is where Run writes a CPU profile of the
	// gateway's timed execs.
	CPUProfile string

	srv     *http.Server
	dropDBs func()
	// records keeps how long the gateway's records took to commit.
	records *recordTimes
}

// recordTimes collects the durations the gateway reports through
// Gateway.Recorded, by operation, between two takes.
type recordTimes struct {
	mu sync.Mutex
	by map[string][]time.Duration
}

func (r *recordTimes) add(op string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string][]time.Duration{}
	}
	r.by[op] = append(r.by[op], d)
}

// take returns what op collected since the last take, and forgets it.
func (r *recordTimes) take(op string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.by[op]
	delete(r.by, op)
	return d
}

// Start builds the console, serves it on a loopback port and sets up the
// org, environment, agent, member, key and session through the JSON API,
// and a second agent, member, key and session (Load).
func Start(ctx context.Context, o Options) (*Stack, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	cfg := config.Config{DataDir: o.DataDir, AdminEmail: "bench-admin@example.com", AdminPassword: "bench-admin-password-" + auth.RandomHex(8),
		TokenTTL: time.Hour, HealthInterval: time.Hour, ReclaimInterval: time.Hour, OrgDBPrefix: "gh_bench_" + auth.RandomHex(4) + "_org_",
		// The caps are counted in every exec's commit, as in production,
		// and set high enough for the followed-commands run.
		MaxRunningCommandsPerUser: 10000, MaxRunningCommandsPerAgent: 10000}
	s := &Stack{Org: "bench", Dialect: store.SQLite, dropDBs: func() {}, Profile: newProfile()}
	if o.PostgresDSN != "" {
		s.Dialect = store.Postgres
		dsn, drop, err := throwawayPostgres(ctx, o.PostgresDSN, cfg.OrgDBPrefix)
		if err != nil {
			return nil, err
		}
		s.dropDBs = drop
		cfg.DatabaseURL, cfg.MasterKey = dsn, auth.RandomHex(32)
	}
	c, err := console.New(ctx, cfg, logger)
	if err != nil {
		s.dropDBs()
		return nil, fmt.Errorf("start console: %w", err)
	}
	s.records = &recordTimes{}
	metric := c.Gateway.Recorded // the console's: its metrics
	c.Gateway.Recorded = func(op string, d time.Duration) {
		metric(op, d)
		s.records.add(op, d)
	}
	c.Start()
	s.Console = c
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("listen for the console: %w", err)
	}
	s.srv = &http.Server{Handler: withOpCounter(s.Profile, c.Handler()), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	s.URL = "http://" + ln.Addr().String()
	s.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}}
	s.Direct = agentd.NewClient(o.Agentd.URL, o.Agentd.Token, &http.Client{Transport: &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}})
	if err := s.setup(ctx, cfg, o.Agentd); err != nil {
		s.Close()
		return nil, fmt.Errorf("set up through the API: %w", err)
	}
	return s, nil
}

// Close stops the console and drops the throwaway databases.
func (s *Stack) Close() {
	if s.srv != nil {
		_ = s.srv.Close()
	}
	if s.Console != nil {
		s.Console.Close()
	}
	s.dropDBs()
}

// throwawayPostgres creates a catalog database next to dsn's and returns
// its DSN and a function dropping it and every org database with prefix.
func throwawayPostgres(ctx context.Context, dsn, orgPrefix string) (string, func(), error) {
	admin, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		return "", nil, fmt.Errorf("postgres: %w", err)
	}
	name := "gh_bench_" + auth.RandomHex(6)
	if err := admin.WithContext(ctx).Exec("CREATE DATABASE " + store.QuoteIdent(name)).Error; err != nil {
		_ = store.Close(admin)
		return "", nil, fmt.Errorf("create benchmark database: %w", err)
	}
	drop := func() {
		var names []string
		admin.Raw("SELECT datname FROM pg_database WHERE datname LIKE ?", strings.ReplaceAll(orgPrefix, "_", `\_`)+"%").Scan(&names)
		for _, n := range append(names, name) {
			if err := admin.Exec("DROP DATABASE IF EXISTS " + store.QuoteIdent(n) + " WITH (FORCE)").Error; err != nil {
				fmt.Fprintf(os.Stderr, "bench: drop database %s: %v\n", n, err)
			}
		}
		_ = store.Close(admin)
	}
	out, err := store.WithDatabase(dsn, name)
	if err != nil {
		drop()
		return "", nil, err
	}
	return out, drop, nil
}

// Instrument wraps the catalog's and the org's connection pools so
// Profile counts their round trips. It cannot be undone: profile last.
func (s *Stack) Instrument(ctx context.Context) error {
	db, release, err := s.OrgDB(ctx)
	if err != nil {
		return err
	}
	defer release()
	if err := instrument(db, s.Profile); err != nil {
		return err
	}
	return instrument(s.Console.Catalog, s.Profile)
}

// OrgDB is the org's database, for reading what the gateway stored.
func (s *Stack) OrgDB(ctx context.Context) (*gorm.DB, func(), error) {
	t, err := s.Console.Tenants.Open(ctx, s.Org)
	if err != nil {
		return nil, nil, err
	}
	return t.DB, t.Release, nil
}

// setup creates, through the JSON API: the org (as the platform admin),
// a department, a host environment on agentd, an agent, a member of the
// department with a personal API key, and the member's session.
func (s *Stack) setup(ctx context.Context, cfg config.Config, ad *Agentd) error {
	var login struct{ Token string }
	if err := s.call(ctx, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": cfg.AdminEmail, "password": cfg.AdminPassword}, &login); err != nil {
		return err
	}
	if err := s.call(ctx, http.MethodPost, "/api/v1/orgs", login.Token, map[string]string{"slug": s.Org, "name": "Benchmark"}, nil); err != nil {
		return err
	}
	var entered struct{ Token string }
	if err := s.call(ctx, http.MethodPost, "/api/v1/orgs/"+s.Org+"/enter", login.Token, nil, &entered); err != nil {
		return err
	}
	root := entered.Token
	var dept, env struct{ ID int64 }
	if err := s.orgCall(ctx, http.MethodPost, "/departments", root, map[string]string{"name": "Bench"}, &dept); err != nil {
		return err
	}
	if err := s.orgCall(ctx, http.MethodPost, "/environments", root, map[string]any{"name": "bench-host", "kind": "host", "department_id": dept.ID,
		"url": ad.URL, "os": "linux", "deployment": "bare-metal", "agentd_token": ad.Token}, &env); err != nil {
		return err
	}
	main, err := s.newRuntime(ctx, root, dept.ID, env.ID, "bench-agent", "member@bench.test")
	if err != nil {
		return err
	}
	if s.Load, err = s.newRuntime(ctx, root, dept.ID, env.ID, "bench-load-agent", "load@bench.test"); err != nil {
		return err
	}
	s.Runtime = main
	// The first command brings each session up (its host workspace).
	if _, err := s.ExecGateway(ctx); err != nil {
		return err
	}
	_, err = ExecTrue(ctx, GatewayPath{S: s, As: &s.Load})
	return err
}

// Runtime is an agent runtime's view of the console: a member's API key
// and a session of its own.
type Runtime struct {
	Key     string
	Session int64
}

// newRuntime creates an agent on environment env, a member of the
// department with an API key, and a session of the agent as that member.
func (s *Stack) newRuntime(ctx context.Context, root string, dept, env int64, agentName, email string) (Runtime, error) {
	var agent struct{ ID int64 }
	if err := s.orgCall(ctx, http.MethodPost, "/agents", root, map[string]any{"name": agentName, "department_id": dept,
		"config": map[string]string{"model": "m"}, "environment_ids": []int64{env}}, &agent); err != nil {
		return Runtime{}, err
	}
	var user struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	if err := s.orgCall(ctx, http.MethodPost, "/users", root, map[string]string{"email": email, "name": "Bench " + agentName}, &user); err != nil {
		return Runtime{}, err
	}
	if err := s.orgCall(ctx, http.MethodPost, "/roles", root, map[string]string{"subject": fmt.Sprintf("user:%d", user.User.ID), "role": "member",
		"domain": fmt.Sprintf("dept:%d", dept)}, nil); err != nil {
		return Runtime{}, err
	}
	var ml struct{ Token string }
	if err := s.orgCall(ctx, http.MethodPost, "/auth/login", "", map[string]string{"email": email, "password": user.OneTimePassword}, &ml); err != nil {
		return Runtime{}, err
	}
	if err := s.orgCall(ctx, http.MethodPost, "/auth/password", ml.Token, map[string]string{"current_password": user.OneTimePassword,
		"new_password": "a-long-bench-password"}, nil); err != nil {
		return Runtime{}, err
	}
	var key struct{ Secret string }
	if err := s.orgCall(ctx, http.MethodPost, "/api-keys", ml.Token, map[string]string{"name": "bench runtime"}, &key); err != nil {
		return Runtime{}, err
	}
	var sess struct{ ID int64 }
	if err := s.orgCall(ctx, http.MethodPost, "/sessions", key.Secret, map[string]any{"agent_id": agent.ID}, &sess); err != nil {
		return Runtime{}, err
	}
	return Runtime{Key: key.Secret, Session: sess.ID}, nil
}

func (s *Stack) orgCall(ctx context.Context, method, path, token string, in, out any) error {
	return s.call(ctx, method, "/api/v1/orgs/"+s.Org+path, token, in, out)
}

// sessionPath is a path below the session in the org API.
func (s *Stack) sessionPath(format string, args ...any) string {
	return s.sessionPathOf(s.Session, format, args...)
}

func (s *Stack) sessionPathOf(session int64, format string, args ...any) string {
	return fmt.Sprintf("/api/v1/orgs/%s/sessions/%d", s.Org, session) + fmt.Sprintf(format, args...)
}

// call sends one JSON request and decodes a 2xx answer into out.
func (s *Stack) call(ctx context.Context, method, path, token string, in, out any) error {
	resp, err := s.send(ctx, method, path, token, in, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode: %w", method, path, err)
	}
	return nil
}

// pollChunks long-polls a gateway output path in agentd's binary framing,
// as a client that moves bulk output would.
func (s *Stack) pollChunks(ctx context.Context, path, key string) (output, error) {
	var out output
	resp, err := s.send(ctx, http.MethodGet, path, key, nil, agentd.ChunksMediaType)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != agentd.ChunksMediaType {
		return out, fmt.Errorf("GET %s: answered %q, not %s", path, ct, agentd.ChunksMediaType)
	}
	out.Chunks, err = agentd.ReadChunks(resp.Body, resp.ContentLength, &out)
	return out, err
}

// send makes one request of the console and returns its 2xx answer.
func (s *Stack) send(ctx context.Context, method, path, token string, in any, accept string) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", accept)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, &StatusError{Method: method, Path: path, Status: resp.StatusCode, Body: string(b)}
	}
	return resp, nil
}

// StatusError is a non-2xx answer of the console.
type StatusError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: status %d: %s", e.Method, e.Path, e.Status, e.Body)
}

var errNotExited = errors.New("command did not exit within its wait")
