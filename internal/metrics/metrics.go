// Package metrics is the console's Prometheus instrumentation. There is no
// global registry: console builds one Metrics and hands it to the parts
// that report (handlers, audit logs, the health checker, the gateway).
// Every label set is bounded: HTTP routes are echo's route patterns (an
// unknown address is the one not-found pattern), methods are the standard
// ones, org slugs appear only when the operator opts in.
//
// A nil *Metrics is valid and records nothing, so tests and tools that do
// not care need not build one.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "gatehouse"

// Options choose what is exported beyond the defaults.
type Options struct {
	// PerOrgDB labels database pool stats and retention counts with the
	// org slug. Off, the org pools are summed into one series (org="all")
	// and retention is counted as org="all".
	PerOrgDB bool
}

// Metrics holds the registry and the console's collectors.
type Metrics struct {
	Registry *prometheus.Registry
	opts     Options

	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	auditAppends *prometheus.CounterVec
	denials      *prometheus.CounterVec
	probes       *prometheus.CounterVec
	probeLatency *prometheus.HistogramVec
	recorded     *prometheus.HistogramVec
	lifecycle    *prometheus.CounterVec
	retention    *prometheus.CounterVec
	rounds       *prometheus.CounterVec
	checkpoints  *prometheus.CounterVec
	webhooks     *prometheus.CounterVec
}

// New registers the console's collectors (and the Go and process ones) in
// a fresh registry.
func New(opts Options) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{Registry: reg, opts: opts,
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "http_requests_total",
			Help: "HTTP requests by route pattern, method and status."}, []string{"route", "method", "status"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "http_request_duration_seconds",
			Help: "HTTP request latency by route pattern and method.", Buckets: prometheus.DefBuckets}, []string{"route", "method"}),
		auditAppends: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "audit_appends_total",
			Help: "Audit events appended, by log (platform or org) and result (ok or error)."}, []string{"log", "result"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "authz_denials_total",
			Help: "Authorization refusals recorded in an audit log (authz.deny events), by log."}, []string{"log"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "health_probes_total",
			Help: "Environment health probes by environment kind and result status."}, []string{"kind", "status"}),
		probeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "health_probe_duration_seconds",
			Help: "Environment health probe latency by environment kind.", Buckets: prometheus.DefBuckets}, []string{"kind"}),
		recorded: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "gateway_record_duration_seconds",
			Help:    "How long the gateway took to make a terminal operation's record durable (its commit) before forwarding it, by operation (exec, stdin).",
			Buckets: recordBuckets}, []string{"operation"}),
		lifecycle: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "sandbox_lifecycle_total",
			Help: "Session sandbox lifecycle actions recorded (create, start, pause, resume, close, reclaim, lost)."}, []string{"action"}),
		retention: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "retention_removed_total",
			Help: "Audit events and recorded commands removed by retention, by org (\"all\" unless per-org labels are on) and kind."}, []string{"org", "kind"}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "retention_rounds_total",
			Help: "Retention rounds by org (\"all\" unless per-org labels are on) and outcome (removed, nothing, keep_all, busy, error)."}, []string{"org", "outcome"}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "audit_checkpoint_mismatches_total",
			Help: "Checkpoint rounds that found an org's log not holding its newest checkpoint (log) or that checkpoint not verifying (checkpoint), by org (\"all\" unless per-org labels are on) and kind."}, []string{"org", "kind"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "approval_webhooks_total",
			Help: "Approval webhook deliveries by result (ok or error); failures are also logged."}, []string{"result"}),
	}
	reg.MustRegister(m.httpRequests, m.httpDuration, m.auditAppends, m.denials, m.probes, m.probeLatency, m.recorded, m.lifecycle, m.retention, m.rounds, m.checkpoints, m.webhooks,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// recordBuckets span a durable commit's range: a fraction of a millisecond
// on a quiet local database up to the seconds of a struggling one.
var recordBuckets = []float64{.00025, .0005, .001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1, 2.5, 5}

// GatewayRecorded records how long operation's record took to become
// durable before the gateway forwarded it.
func (m *Metrics) GatewayRecorded(operation string, d time.Duration) {
	if m == nil {
		return
	}
	m.recorded.WithLabelValues(operation).Observe(d.Seconds())
}

// ApprovalWebhook counts one approval webhook delivery by result ("ok" or
// "error").
func (m *Metrics) ApprovalWebhook(result string) {
	if m == nil {
		return
	}
	m.webhooks.WithLabelValues(result).Inc()
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// PerOrgDB reports whether pool stats are labelled per org.
func (m *Metrics) PerOrgDB() bool { return m != nil && m.opts.PerOrgDB }

var knownMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true}

// ObserveHTTP records one request. route must be the matched route pattern
// (echo's c.Path()), never the request's path.
func (m *Metrics) ObserveHTTP(route, method string, status int, d time.Duration) {
	if m == nil {
		return
	}
	if !knownMethods[method] {
		method = "other"
	}
	if route == "" {
		route = "unmatched"
	}
	m.httpRequests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.httpDuration.WithLabelValues(route, method).Observe(d.Seconds())
}

// lifecycleActions are the session audit actions counted as sandbox
// lifecycle actions.
var lifecycleActions = map[string]string{"session.create": "create", "session.start": "start", "session.pause": "pause",
	"session.resume": "resume", "session.close": "close", "session.reclaim": "reclaim", "session.lost": "lost"}

// AuditAppended records an append to log ("platform" or "org"). Denials and
// sandbox lifecycle actions are counted from the events themselves, so they
// are counted exactly when their audit record is written.
func (m *Metrics) AuditAppended(log, action string, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.auditAppends.WithLabelValues(log, "error").Inc()
		return
	}
	m.auditAppends.WithLabelValues(log, "ok").Inc()
	if action == "authz.deny" {
		m.denials.WithLabelValues(log).Inc()
	}
	if a, ok := lifecycleActions[action]; ok {
		m.lifecycle.WithLabelValues(a).Inc()
	}
}

// HealthProbe records one environment probe.
func (m *Metrics) HealthProbe(kind, status string, latency time.Duration) {
	if m == nil {
		return
	}
	m.probes.WithLabelValues(boundLabel(kind), boundLabel(status)).Inc()
	m.probeLatency.WithLabelValues(boundLabel(kind)).Observe(latency.Seconds())
}

// RetentionRemoved records what one org's retention round removed.
func (m *Metrics) RetentionRemoved(org, kind string, n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.retention.WithLabelValues(m.orgLabel(org), kind).Add(float64(n))
}

// RetentionRound counts one org's retention round by its outcome, so a
// round that removed nothing is seen to have run.
func (m *Metrics) RetentionRound(org, outcome string) {
	if m == nil {
		return
	}
	m.rounds.WithLabelValues(m.orgLabel(org), boundLabel(outcome)).Inc()
}

// CheckpointMismatch counts one checkpoint round that found org's log
// not holding its newest checkpoint (kind "log") or that checkpoint not
// verifying (kind "checkpoint").
func (m *Metrics) CheckpointMismatch(org, kind string) {
	if m == nil {
		return
	}
	m.checkpoints.WithLabelValues(m.orgLabel(org), boundLabel(kind)).Inc()
}

// orgLabel is the org label's value: the slug when the operator opted in
// to per-org labels (an unbounded set), else "all".
func (m *Metrics) orgLabel(slug string) string {
	if m.opts.PerOrgDB {
		return slug
	}
	return "all"
}

// boundLabel keeps a value from the code's own small vocabulary (kinds,
// statuses) short and free of anything odd.
func boundLabel(s string) string {
	if s == "" {
		return "unknown"
	}
	if len(s) > 32 || strings.ContainsAny(s, " \t\n/") {
		return "other"
	}
	return s
}

// Gauges are read at scrape time from the parts that know them.
type Gauges struct {
	// Followers counts the commands this process records now.
	Followers func() int
	// LiveWindow is what the live output window holds, in bytes, the
	// bytes its budget pushed out since the process started, and the
	// clients' polls waiting on it.
	LiveWindow func() (held, evicted int64, waiting int)
	// SessionsByState counts sessions per state over every org.
	SessionsByState func(ctx context.Context) (map[string]int, error)
	// RunningCommands counts commands in state running over every org.
	RunningCommands func(ctx context.Context) (int, error)
	// DBPools are the pools' stats: the catalog ("catalog") and each org
	// (by slug; summed as "all" unless PerOrgDB).
	DBPools func() map[string]PoolStats
}

// PoolStats is the part of sql.DBStats exported.
type PoolStats struct {
	Open, InUse, Idle int
	WaitCount         int64
	WaitDuration      time.Duration
}

// Watch registers g's gauges. A function that fails leaves its series out
// of that scrape rather than reporting zero.
func (m *Metrics) Watch(g Gauges) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(&gaugeCollector{g: g, perOrg: m.opts.PerOrgDB})
}
