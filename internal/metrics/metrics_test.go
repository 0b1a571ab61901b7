package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A nil *Metrics records nothing and does not panic, so parts built
// without one (tools, tests) need no guard.
func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.ObserveHTTP("/x", "GET", 200, time.Millisecond)
	m.AuditAppended("org", "authz.deny", nil)
	m.HealthProbe("agentd", "healthy", time.Millisecond)
	m.RetentionRemoved("acme", "recordings", 3)
	m.RetentionRound("acme", "nothing")
	m.Watch(Gauges{})
	if m.PerOrgDB() {
		t.Fatal("nil metrics opted in")
	}
}

// Label values come from small vocabularies whatever the input.
func TestLabelsBounded(t *testing.T) {
	m := New(Options{})
	for _, tc := range []struct{ method, route string }{
		{"GET", "/api/v1/orgs/:org"}, {"BREW", "/api/v1/orgs/:org"}, {"PROPFIND", ""}, {"get", "/*"},
	} {
		m.ObserveHTTP(tc.route, tc.method, 404, time.Millisecond)
	}
	if got := testutil.ToFloat64(m.httpRequests.WithLabelValues("/api/v1/orgs/:org", "other", "404")); got != 1 {
		t.Errorf("unknown method not folded into other: %v", got)
	}
	if got := testutil.ToFloat64(m.httpRequests.WithLabelValues("unmatched", "other", "404")); got != 1 {
		t.Errorf("empty route not labelled unmatched: %v", got)
	}
	m.HealthProbe("a kind with spaces", strings.Repeat("x", 100), time.Second)
	if got := testutil.ToFloat64(m.probes.WithLabelValues("other", "other")); got != 1 {
		t.Errorf("odd probe labels not bounded: %v", got)
	}
	for _, tc := range []struct {
		action string
		err    error
		ok     float64
		failed float64
		deny   float64
		life   string
	}{
		{"authz.deny", nil, 1, 0, 1, ""},
		{"session.pause", nil, 2, 0, 1, "pause"},
		{"session.lost", errors.New("db down"), 2, 1, 1, ""},
	} {
		m.AuditAppended("org", tc.action, tc.err)
		if got := testutil.ToFloat64(m.auditAppends.WithLabelValues("org", "ok")); got != tc.ok {
			t.Errorf("%s: ok appends %v, want %v", tc.action, got, tc.ok)
		}
		if got := testutil.ToFloat64(m.auditAppends.WithLabelValues("org", "error")); got != tc.failed {
			t.Errorf("%s: failed appends %v, want %v", tc.action, got, tc.failed)
		}
		if got := testutil.ToFloat64(m.denials.WithLabelValues("org")); got != tc.deny {
			t.Errorf("%s: denials %v, want %v", tc.action, got, tc.deny)
		}
		if tc.life != "" {
			if got := testutil.ToFloat64(m.lifecycle.WithLabelValues(tc.life)); got != 1 {
				t.Errorf("%s: lifecycle %v", tc.action, got)
			}
		}
	}
}

// Org pools are summed unless the operator opted in to per-org labels.
func TestPoolsPerOrgOptIn(t *testing.T) {
	for _, perOrg := range []bool{false, true} {
		m := New(Options{PerOrgDB: perOrg})
		m.Watch(Gauges{DBPools: func() map[string]PoolStats {
			return map[string]PoolStats{"catalog": {Open: 2}, "acme": {Open: 3}, "beta": {Open: 4}}
		}})
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		series := map[string]float64{}
		for _, f := range fams {
			if f.GetName() != "gatehouse_db_pool_open_connections" {
				continue
			}
			for _, s := range f.GetMetric() {
				key := ""
				for _, l := range s.GetLabel() {
					key += l.GetName() + "=" + l.GetValue() + ","
				}
				series[key] = s.GetGauge().GetValue()
			}
		}
		want := map[string]float64{"db=catalog,org=,": 2, "db=org,org=all,": 7}
		if perOrg {
			want = map[string]float64{"db=catalog,org=,": 2, "db=org,org=acme,": 3, "db=org,org=beta,": 4}
		}
		if len(series) != len(want) {
			t.Fatalf("perOrg=%v: series %v, want %v", perOrg, series, want)
		}
		for k, v := range want {
			if series[k] != v {
				t.Errorf("perOrg=%v: %s = %v, want %v", perOrg, k, series[k], v)
			}
		}
	}
}

// Every metric the starter Grafana dashboard queries exists.
func TestDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	m := New(Options{})
	m.ObserveHTTP("/", "GET", 200, time.Millisecond)
	m.AuditAppended("org", "authz.deny", nil)
	m.AuditAppended("org", "session.start", nil)
	m.HealthProbe("agentd", "healthy", time.Millisecond)
	m.RetentionRemoved("acme", "recordings", 1)
	m.RetentionRound("acme", "removed")
	m.Watch(Gauges{Followers: func() int { return 0 },
		LiveWindow:      func() (int64, int64, int) { return 0, 0, 0 },
		SessionsByState: func(context.Context) (map[string]int, error) { return map[string]int{"running": 1}, nil },
		RunningCommands: func(context.Context) (int, error) { return 0, nil },
		DBPools:         func() map[string]PoolStats { return map[string]PoolStats{"catalog": {}} }})
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range fams {
		have[f.GetName()] = true
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			have[f.GetName()+suffix] = true
		}
	}
	name := regexp.MustCompile(`\b(gatehouse_[a-z_]+|process_[a-z_]+|go_[a-z_]+)\b`)
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				n++
				if !have[m] {
					t.Errorf("panel %q queries %s, which the console does not export", p.Title, m)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no metric names found in the dashboard")
	}
}
