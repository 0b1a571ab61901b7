// Package chaos is the chaos harness: console replicas run as real
// processes on one Postgres, driven through a balancer by sessions of real
// agentd hosts and the E2B fake while a loop kills, cuts and restarts
// them; afterwards every recording, session and audit invariant is
// checked (`console bench chaos`, TestChaos; docs/operations.md, "Chaos
// run").
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/bench"
	"github.com/gatehouse/gatehouse/internal/netfault"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Options size a chaos run: several console replicas on one Postgres,
// driven through a balancer while a chaos loop kills and cuts things.
type Options struct {
	// ConsoleBin and AgentdBin are the built binaries (cmd/console,
	// cmd/agentd) the run starts as real processes.
	ConsoleBin, AgentdBin string
	// PostgresDSN is a Postgres server's admin DSN: the run creates a
	// catalog database and org databases there and drops them after.
	PostgresDSN string
	// Duration is how long the driver runs and the chaos loop injects.
	Duration time.Duration
	// KillEvery is the mean time between console kills.
	KillEvery time.Duration
	// Replicas is the number of console processes (default 3); Sessions
	// the sessions kept busy (default 20).
	Replicas, Sessions int
	// DBCut is how long Postgres is cut, once (default 5 s).
	DBCut time.Duration
	// DBRefuse is how long the first org's database refuses connections
	// (ALLOW_CONNECTIONS false, its connections ended), once (default
	// 3 s).
	DBRefuse time.Duration
	// Progress receives a line per fault and phase; nil discards.
	Progress io.Writer
}

func (o Options) withDefaults() Options {
	if o.Replicas <= 0 {
		o.Replicas = 3
	}
	if o.Sessions <= 0 {
		o.Sessions = 20
	}
	if o.DBCut <= 0 {
		o.DBCut = 5 * time.Second
	}
	if o.DBRefuse <= 0 {
		o.DBRefuse = 3 * time.Second
	}
	if o.KillEvery <= 0 {
		o.KillEvery = 8 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Settings the replicas run with: short follower leases so a killed
// replica's commands are adopted within seconds, and the caps out of the
// way of a driver that deliberately runs many commands at once.
const (
	chaosLease  = 2 * time.Second
	chaosSweep  = 300 * time.Millisecond
	chaosPasswd = "chaos-admin-password-long-enough"
	chaosAdmin  = "chaos-admin@example.com"
)

// Report is what a chaos run measured and found.
type Report struct {
	Duration time.Duration
	Replicas int
	Sessions int
	Requests int64 // sent by the driver
	Served   int64 // answered 2xx
	Retries  int64 // connection refused, reset or cut by a killed replica: sent again
	// Connections the balancer handed to a replica, and replicas it
	// passed over because they refused (killed, not yet restarted).
	Connections, PassedOver int64
	Ops                     map[string]int
	Commands                int
	Lost                    int // commands that ended lost (their agentd restarted under them)
	Faults                  map[string]int
	Recovery                []Recovery
	Checks                  map[string]int // invariant checks made, by invariant
	Errors                  map[string]int // documented error answers, by reason
	Violation               []string       // what broke an invariant
	Settle                  time.Duration  // from the end of the chaos to every command ended
}

// Recovery is how long the system took to work again after one fault.
type Recovery struct {
	Fault string
	At    time.Duration // since the start of the run
	Took  time.Duration
	What  string // what "works again" meant
}

// OK reports whether every invariant held.
func (r *Report) OK() bool { return len(r.Violation) == 0 }

// Print writes the report's figures.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\nGatehouse chaos run (%s): %d console replicas on one Postgres, %d sessions, %s\n", bench.Machine(), r.Replicas, r.Sessions,
		r.Duration.Round(time.Second))
	fmt.Fprintf(w, "requests: %d sent, %d served (2xx), %d retried after a killed replica dropped them\n", r.Requests, r.Served, r.Retries)
	fmt.Fprintf(w, "balancer: %d connections to replicas, %d times a refusing (killed) replica was passed over\n", r.Connections, r.PassedOver)
	fmt.Fprintf(w, "operations: %s; commands: %d (%d lost to the agentd restart)\n", countsLine(r.Ops), r.Commands, r.Lost)
	fmt.Fprintf(w, "faults injected: %s\n", countsLine(r.Faults))
	byFault := map[string][]time.Duration{}
	for _, rc := range r.Recovery {
		byFault[rc.Fault] = append(byFault[rc.Fault], rc.Took)
	}
	for _, f := range sortedKeys(byFault) {
		ds := byFault[f]
		what := ""
		for _, rc := range r.Recovery {
			if rc.Fault == f {
				what = rc.What
				break
			}
		}
		fmt.Fprintf(w, "recovery after %s (%s): n=%d p50 %s, max %s\n", f, what, len(ds), bench.Percentile(ds, 50).Round(time.Millisecond),
			bench.Percentile(ds, 100).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "settled (every command ended) %s after the chaos stopped\n", r.Settle.Round(time.Millisecond))
	fmt.Fprintf(w, "documented error answers: %s\n", countsLine(r.Errors))
	total := 0
	for _, n := range r.Checks {
		total += n
	}
	fmt.Fprintf(w, "invariants checked: %d (%s)\n", total, countsLine(r.Checks))
	if r.OK() {
		fmt.Fprintf(w, "result: every invariant held\n")
		return
	}
	fmt.Fprintf(w, "result: %d VIOLATIONS\n", len(r.Violation))
	for _, v := range r.Violation {
		fmt.Fprintf(w, "  - %s\n", v)
	}
}

func countsLine(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// chaosRun is one run's state.
type chaosRun struct {
	o       Options
	t0      time.Time
	dir     string
	prefix  string // org database name prefix
	admin   *gorm.DB
	catalog string // catalog database name

	replicas []*replica
	lb       *netfault.Balancer
	dbFwd    *netfault.Forwarder
	hosts    map[string]*host
	fake     *e2bfake.Server
	c        *chaosClient
	probeHC  *http.Client

	orgs     []*chaosOrg
	sessions []*chaosSession
	platform string // the platform admin's token

	mu        sync.Mutex
	windows   []window
	commands  []*cmdRecord
	ops       map[string]int
	faults    map[string]int
	recovery  []Recovery
	violation []string
	orgDBs    map[string]*gorm.DB
}

func (r *chaosRun) logf(format string, args ...any) {
	fmt.Fprintf(r.o.Progress, "chaos t+%5.1fs: %s\n", time.Since(r.t0).Seconds(), fmt.Sprintf(format, args...))
}

func (r *chaosRun) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.violation = append(r.violation, msg)
	r.mu.Unlock()
	r.logf("VIOLATION: %s", msg)
}

func (r *chaosRun) count(m map[string]int, k string) {
	r.mu.Lock()
	m[k]++
	r.mu.Unlock()
}

func (r *chaosRun) addWindow(w window) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.windows = append(r.windows, w)
	return len(r.windows) - 1
}

func (r *chaosRun) endWindow(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.windows[i].end = time.Now()
}

func (r *chaosRun) recovered(fault, what string, at time.Time, took time.Duration) {
	r.mu.Lock()
	r.recovery = append(r.recovery, Recovery{Fault: fault, At: at.Sub(r.t0), Took: took, What: what})
	r.mu.Unlock()
	r.logf("recovered from %s in %s (%s)", fault, took.Round(time.Millisecond), what)
}

// Run runs the chaos scenario and reports. An error means the run
// itself could not be carried out (a binary would not start, the setup
// failed); what the run found is in the report.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	o = o.withDefaults()
	if o.ConsoleBin == "" || o.AgentdBin == "" || o.PostgresDSN == "" {
		return nil, errors.New("chaos: the console and agentd binaries and a Postgres DSN are required")
	}
	r := &chaosRun{o: o, t0: time.Now(), hosts: map[string]*host{}, ops: map[string]int{}, faults: map[string]int{}}
	defer r.close()
	if err := r.up(ctx); err != nil {
		return nil, err
	}
	if err := r.setup(ctx); err != nil {
		return nil, fmt.Errorf("chaos: set up through the API: %w", err)
	}
	r.logf("set up: %d replicas, %d sessions; chaos for %s, a console kill every ~%s", o.Replicas, len(r.sessions), o.Duration, o.KillEvery)
	// A role change reaches the other replicas within a second (they
	// re-read the policy version at most that often): the members' roles
	// were just assigned.
	time.Sleep(1500 * time.Millisecond)

	runStart := time.Now()
	stopAt := runStart.Add(o.Duration)
	var wg sync.WaitGroup
	drivers, stopDrivers := context.WithCancel(ctx)
	defer stopDrivers()
	for _, s := range r.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(drivers, s, stopAt)
			s.set(0, "done")
		}()
	}
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		r.chaos(ctx, runStart, stopAt)
	}()
	<-chaosDone
	r.logf("chaos over; waiting for the driver's operations to finish")
	r.waitDrivers(ctx, &wg, stopDrivers)
	settleStart := time.Now()
	if err := r.settle(ctx); err != nil {
		r.violate("%v", err)
	}
	settle := time.Since(settleStart)
	checks := r.check(ctx)

	documented, undocumented := judge(r.c.answers(), r.windows)
	for _, a := range undocumented {
		r.violate("undocumented error answer: %s", a.describe(r.t0))
	}
	rep = &Report{Duration: o.Duration, Replicas: o.Replicas, Sessions: len(r.sessions),
		Requests: r.c.requests.Load(), Served: r.c.served.Load(), Retries: r.c.retries.Load(),
		Ops: r.ops, Faults: r.faults, Recovery: r.recovery, Checks: checks, Errors: documented, Violation: r.violation, Settle: settle,
		Commands: len(r.commands), Connections: r.lb.Accepted.Load(), PassedOver: r.lb.Skipped.Load()}
	for _, c := range r.commands {
		if c.state == "lost" {
			rep.Lost++
		}
	}
	return rep, nil
}

// driverGrace bounds the wait for the driver's operations once the chaos
// stopped: each takes seconds, and retries for at most maxOpTime.
const driverGrace = maxOpTime + time.Minute

// waitDrivers waits for the sessions' drivers to finish. Past driverGrace
// each one still busy is a violation that says what it was doing and what
// the database holds for its command; then the drivers are stopped, so the
// run's checks still run.
func (r *chaosRun) waitDrivers(ctx context.Context, wg *sync.WaitGroup, stop context.CancelFunc) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(driverGrace):
	case <-ctx.Done():
	}
	for _, s := range r.sessions {
		a := s.doing.Load()
		if a == nil || a.what == "done" {
			continue
		}
		msg := fmt.Sprintf("session %d (%s, %s) still busy %s after the chaos stopped: %s (since t+%.1fs)", s.id, s.org.slug, s.env,
			driverGrace, a.what, a.since.Sub(r.t0).Seconds())
		if a.command != 0 {
			msg += "; " + r.describeCommand(ctx, s.org, a.command)
		}
		r.violate("%s", msg)
	}
	stop()
	<-done
}

// describeCommand is what the org's database holds for command id.
func (r *chaosRun) describeCommand(ctx context.Context, o *chaosOrg, id int64) string {
	db, err := r.orgDB(ctx, o)
	if err != nil {
		return "its row: " + err.Error()
	}
	var row struct {
		State, Reason, LeaseOwner string
		LeaseUntil                *time.Time
		Acked                     bool `gorm:"column:agentd_acked"`
		LastChunk                 int64
		AgentdID                  string `gorm:"column:agentd_id"`
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := db.WithContext(qctx).Raw("SELECT state, reason, lease_owner, lease_until, agentd_acked, last_chunk, agentd_id FROM commands WHERE id = ?", id).
		Scan(&row).Error; err != nil {
		return "its row: " + err.Error()
	}
	lease := "none"
	if row.LeaseUntil != nil {
		lease = fmt.Sprintf("%s until t+%.1fs", row.LeaseOwner, row.LeaseUntil.Sub(r.t0).Seconds())
	}
	return fmt.Sprintf("its row: state %s (%q), agentd id %s, acked %t, last chunk %d, follower lease %s", row.State, row.Reason,
		row.AgentdID, row.Acked, row.LastChunk, lease)
}

// up starts Postgres databases, the forwarders, agentd hosts, the E2B fake
// and the replicas.
func (r *chaosRun) up(ctx context.Context) error {
	var err error
	if r.dir, err = os.MkdirTemp("", "gatehouse-chaos-"); err != nil {
		return err
	}
	r.prefix = "gh_chaos_" + auth.RandomHex(4) + "_org_"
	if r.admin, err = store.Open(ctx, r.o.PostgresDSN, store.Options{MaxOpenConns: 4}); err != nil {
		return fmt.Errorf("chaos: postgres: %w", err)
	}
	r.catalog = "gh_chaos_" + auth.RandomHex(6)
	if err := r.admin.WithContext(ctx).Exec("CREATE DATABASE " + store.QuoteIdent(r.catalog)).Error; err != nil {
		return fmt.Errorf("chaos: create the catalog database: %w", err)
	}
	catalogDSN, err := store.WithDatabase(r.o.PostgresDSN, r.catalog)
	if err != nil {
		return err
	}
	fwd, viaFwd, err := netfault.Reroute(catalogDSN)
	if err != nil {
		return err
	}
	r.dbFwd = fwd

	token := "chaos-agentd-" + auth.RandomHex(12)
	for _, name := range []string{"host-a", "host-b"} {
		h, err := startHost(ctx, name, r.o.AgentdBin, token, filepath.Join(r.dir, name))
		if err != nil {
			return err
		}
		r.hosts[name] = h
	}
	if r.fake, err = e2bfake.New(e2bfake.Config{AgentdBinary: r.o.AgentdBin, AgentdToken: chaosTemplateToken, APIKey: chaosAPIKey,
		WorkDir: filepath.Join(r.dir, "e2b")}); err != nil {
		return fmt.Errorf("chaos: start the E2B fake: %w", err)
	}

	env := []string{"DATABASE_URL=" + viaFwd, "GATEHOUSE_MASTER_KEY=" + auth.RandomHex(32), "GATEHOUSE_ORG_DB_PREFIX=" + r.prefix,
		"GATEHOUSE_ADMIN_EMAIL=" + chaosAdmin, "GATEHOUSE_ADMIN_PASSWORD=" + chaosPasswd,
		"GATEHOUSE_FOLLOWER_LEASE=" + chaosLease.String(), "GATEHOUSE_FOLLOWER_SWEEP_INTERVAL=" + chaosSweep.String(),
		"GATEHOUSE_RECLAIM_INTERVAL=5s", "GATEHOUSE_HEALTH_INTERVAL=5s",
		"GATEHOUSE_MAX_RUNNING_COMMANDS_PER_USER=0", "GATEHOUSE_MAX_RUNNING_COMMANDS_PER_AGENT=0"}
	var backends []string
	for i := range r.o.Replicas {
		addr, err := freeServicePort()
		if err != nil {
			return err
		}
		rp := &replica{idx: i, addr: addr, bin: r.o.ConsoleBin, logPath: filepath.Join(r.dir, fmt.Sprintf("console-%d.log", i)),
			env: append(append([]string(nil), env...), "GATEHOUSE_DATA_DIR="+filepath.Join(r.dir, fmt.Sprintf("data-%d", i)))}
		r.replicas = append(r.replicas, rp)
		backends = append(backends, addr)
	}
	// The first replica creates the platform admin; the others start
	// against a catalog that has one.
	if err := r.replicas[0].start(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(r.replicas))
	for i, rp := range r.replicas[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i+1] = rp.start(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if r.lb, err = netfault.NewBalancer(backends); err != nil {
		return err
	}
	r.c = &chaosClient{base: "http://" + r.lb.Addr(), hc: &http.Client{Transport: &http.Transport{
		Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 5 * time.Second}}}
	r.probeHC = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	return nil
}

// close stops everything the run started and drops its databases.
func (r *chaosRun) close() {
	for _, rp := range r.replicas {
		_ = rp.signal(syscall.SIGKILL)
	}
	if r.lb != nil {
		_ = r.lb.Close()
	}
	for _, h := range r.hosts {
		h.close()
	}
	if r.fake != nil {
		_ = r.fake.Close()
	}
	for _, db := range r.orgDBs {
		_ = store.Close(db)
	}
	if r.dbFwd != nil {
		_ = r.dbFwd.Close()
	}
	if r.admin != nil {
		var names []string
		r.admin.Raw("SELECT datname FROM pg_database WHERE datname LIKE ?", strings.ReplaceAll(r.prefix, "_", `\_`)+"%").Scan(&names)
		if r.catalog != "" {
			names = append(names, r.catalog)
		}
		for _, n := range names {
			if err := r.admin.Exec("DROP DATABASE IF EXISTS " + store.QuoteIdent(n) + " WITH (FORCE)").Error; err != nil {
				fmt.Fprintf(os.Stderr, "chaos: drop database %s: %v\n", n, err)
			}
		}
		_ = store.Close(r.admin)
	}
	if r.dir != "" && os.Getenv("GATEHOUSE_CHAOS_KEEP") == "" {
		_ = os.RemoveAll(r.dir)
	}
}

// chaos injects the faults until stopAt: a console kill (and restart)
// every KillEvery (±40%), the first org's database refusing connections
// at 15% of the run, one agentd restart at 35%, one Postgres cut at 60%,
// and an org suspended and resumed every few seconds.
func (r *chaosRun) chaos(ctx context.Context, start, stopAt time.Time) {
	d := stopAt.Sub(start)
	restartAt, cutAt, refuseAt := start.Add(d*35/100), start.Add(d*60/100), start.Add(d*15/100)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		if sleepUntil(ctx, refuseAt) {
			r.refuseDatabase(ctx, r.orgs[0])
		}
	}()
	go func() {
		defer wg.Done()
		if sleepUntil(ctx, restartAt) {
			r.restartAgentd(ctx, "host-a")
		}
	}()
	go func() {
		defer wg.Done()
		if sleepUntil(ctx, cutAt) {
			r.cutDatabase(ctx)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.suspendLoop(ctx, stopAt)
	}()
	next := time.Now().Add(jitter(r.o.KillEvery))
	for next.Before(stopAt) && sleepUntil(ctx, next) {
		r.killConsole(ctx, r.replicas[rand.IntN(len(r.replicas))])
		next = time.Now().Add(jitter(r.o.KillEvery))
	}
	wg.Wait()
}

func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.6 + 0.8*rand.Float64()))
}

// sleepUntil waits for at; false when ctx ended first.
func sleepUntil(ctx context.Context, at time.Time) bool {
	select {
	case <-time.After(time.Until(at)):
		return true
	case <-ctx.Done():
		return false
	}
}

// killConsole SIGKILLs a replica and starts it again at once; recovery is
// until it answers /readyz again.
func (r *chaosRun) killConsole(ctx context.Context, rp *replica) {
	at := time.Now()
	w := r.addWindow(window{kind: "console_kill", target: fmt.Sprint(rp.idx), start: at})
	if err := rp.signal(syscall.SIGKILL); err != nil {
		r.violate("%v", err)
	}
	r.count(r.faults, "console SIGKILL")
	r.logf("killed console %d", rp.idx)
	if err := rp.start(ctx); err != nil {
		if ctx.Err() == nil {
			r.violate("console %d did not restart: %v", rp.idx, err)
		}
		return
	}
	for !rp.ready(ctx, r.probeHC) {
		if ctx.Err() != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.endWindow(w)
	r.recovered("console SIGKILL", "restarted and /readyz 200", at, time.Since(at))
}

// restartAgentd kills a host's agentd (and its commands) and starts it
// again after two seconds; recovery is until a command on that host runs
// to its end through the balancer.
func (r *chaosRun) restartAgentd(ctx context.Context, name string) {
	at := time.Now()
	w := r.addWindow(window{kind: "agentd_restart", target: name, start: at})
	r.logf("restarting agentd %s", name)
	if err := r.hosts[name].restart(ctx, 2*time.Second); err != nil {
		r.violate("%v", err)
		return
	}
	r.count(r.faults, "agentd restart")
	if r.probe(ctx, name) {
		r.recovered("agentd restart", "a command on that host ran to its end", at, time.Since(at))
	}
	r.endWindow(w)
}

// cutDatabase cuts every replica's Postgres connections for DBCut;
// recovery is from the restore until every replica is ready and a
// command runs to its end.
func (r *chaosRun) cutDatabase(ctx context.Context) {
	at := time.Now()
	w := r.addWindow(window{kind: "db_cut", start: at})
	r.logf("cutting Postgres for %s", r.o.DBCut)
	r.dbFwd.Cut()
	r.count(r.faults, "Postgres cut")
	select {
	case <-time.After(r.o.DBCut):
	case <-ctx.Done():
	}
	r.dbFwd.Restore()
	restored := time.Now()
	r.logf("Postgres restored")
	for _, rp := range r.replicas {
		for !rp.ready(ctx, r.probeHC) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if r.probe(ctx, "host-b") {
		r.recovered("Postgres cut", "every replica ready and a command ran to its end, from the restore", restored, time.Since(restored))
	}
	r.endWindow(w)
}

// refuseDatabase makes org's database refuse connections for DBRefuse,
// as a database taken out of service does: ALLOW_CONNECTIONS false
// (SQLSTATE 55000 to whoever connects) and its connections ended (57P01
// to their users), then allowed again. Recovery is from then until a
// command in that org runs to its end.
func (r *chaosRun) refuseDatabase(ctx context.Context, org *chaosOrg) {
	name := store.QuoteIdent(r.prefix + org.slug)
	at := time.Now()
	w := r.addWindow(window{kind: "db_refuse", target: org.slug, start: at})
	r.logf("the database of %s refuses connections for %s", org.slug, r.o.DBRefuse)
	admin := r.admin.WithContext(context.WithoutCancel(ctx))
	if err := admin.Exec("ALTER DATABASE " + name + " ALLOW_CONNECTIONS false").Error; err != nil {
		r.violate("refuse connections to %s: %v", name, err)
		r.endWindow(w)
		return
	}
	if err := admin.Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ? AND pid <> pg_backend_pid()",
		r.prefix+org.slug).Error; err != nil {
		r.violate("end the connections to %s: %v", name, err)
	}
	r.count(r.faults, "database refuses connections")
	select {
	case <-time.After(r.o.DBRefuse):
	case <-ctx.Done():
	}
	if err := admin.Exec("ALTER DATABASE " + name + " ALLOW_CONNECTIONS true").Error; err != nil {
		r.violate("allow connections to %s: %v", name, err)
	}
	allowed := time.Now()
	r.logf("the database of %s accepts connections again", org.slug)
	if r.probe(ctx, "host-b") {
		r.recovered("database refuses connections", "a command in that org ran to its end, from the allow", allowed, time.Since(allowed))
	}
	r.endWindow(w)
}

// suspendLoop suspends the second org for three seconds and resumes it,
// over and over, as the platform admin.
func (r *chaosRun) suspendLoop(ctx context.Context, stopAt time.Time) {
	org := r.orgs[len(r.orgs)-1]
	every := max(r.o.Duration/6, 8*time.Second)
	for {
		next := time.Now().Add(jitter(every))
		if next.Add(3*time.Second).After(stopAt) || !sleepUntil(ctx, next) {
			return
		}
		w := r.addWindow(window{kind: "org_suspended", target: org.slug, start: time.Now()})
		if _, err := r.c.do(ctx, request{method: http.MethodPost, path: "/api/v1/orgs/" + org.slug + "/suspend", token: r.platform,
			retryOn: []int{http.StatusServiceUnavailable}}, nil); err != nil {
			r.violate("suspend %s: %v", org.slug, err)
		}
		r.count(r.faults, "org suspend+resume")
		r.logf("suspended %s", org.slug)
		sleepUntil(ctx, time.Now().Add(3*time.Second))
		if _, err := r.c.do(context.WithoutCancel(ctx), request{method: http.MethodPost, path: "/api/v1/orgs/" + org.slug + "/resume",
			token: r.platform, retryOn: []int{http.StatusServiceUnavailable}}, nil); err != nil {
			r.violate("resume %s: %v", org.slug, err)
		}
		r.logf("resumed %s", org.slug)
		r.endWindow(w)
	}
}
