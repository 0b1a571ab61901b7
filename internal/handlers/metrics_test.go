package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// scrape reads the metrics listener like Prometheus does.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape: parse: %v", err)
	}
	return fams
}

// value sums the samples of family whose labels include want.
func value(fams map[string]*dto.MetricFamily, family string, want map[string]string) float64 {
	f := fams[family]
	if f == nil {
		return 0
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// has reports whether family has a sample whose labels include want.
func has(fams map[string]*dto.MetricFamily, family string, want map[string]string) bool {
next:
	for _, m := range fams[family].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return true
	}
	return false
}

// A scripted run, then a scrape of the separate metrics listener: the
// request counters by route pattern, the audit append counters (equal to
// the events in the logs) and the denial counter have exactly the expected
// values; 10,000 distinct unknown URLs collapse into one route label.
func TestMetricsAfterScriptedRun(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		e := newEnv(t, d)
		metricsSrv := httptest.NewServer(e.c.MetricsHandler())
		t.Cleanup(metricsSrv.Close)

		tok := e.adminToken()
		slug := storetest.NewName("m-")
		e.createOrg(tok, slug, "Metrics")
		// Provisioning writes the org's first events through a log of its
		// own (before any console holds the org): not counted.
		provisioned := orgEventCount(t, e, slug)
		adminTok := e.enterOrg(tok, slug)
		_, userTok := e.newOrgUser(adminTok, slug, "plain@example.com")
		const denied = 3
		for range denied {
			r := e.json(http.MethodGet, "/api/v1/orgs/"+slug+"/users", userTok, nil)
			if r.status != http.StatusForbidden && r.status != http.StatusNotFound {
				t.Fatalf("member lists users: %d %s", r.status, r.body)
			}
		}
		const unknown = 10000
		for i := range unknown {
			r := e.do(request{method: http.MethodGet, path: fmt.Sprintf("/api/v1/nothing-%d/x%d", i, i)})
			if r.status != http.StatusNotFound {
				t.Fatalf("unknown url: %d", r.status)
			}
		}

		// The session and command gauges count the orgs whose database is
		// open: a call into the org right before the scrape keeps it open.
		if r := e.json(http.MethodGet, "/api/v1/orgs/"+slug+"/me", adminTok, nil); r.status != http.StatusOK {
			t.Fatalf("org me: %d %s", r.status, r.body)
		}
		fams := scrape(t, metricsSrv.URL)
		const reqs = "gatehouse_http_requests_total"
		if got := value(fams, reqs, map[string]string{"route": "/api/v1/orgs/:org/users", "method": "GET"}); got != denied {
			t.Errorf("GET users requests = %v, want %d", got, denied)
		}
		if got := value(fams, reqs, map[string]string{"route": "/api/v1/auth/login", "method": "POST", "status": "200"}); got != 1 {
			t.Errorf("platform logins = %v, want 1", got)
		}
		if got := value(fams, reqs, map[string]string{"route": "/*", "status": "404"}); got != unknown {
			t.Errorf("unknown-route 404s = %v, want %d", got, unknown)
		}
		// Bounded: one series per route pattern, however many URLs.
		if n := len(fams[reqs].GetMetric()); n > 20 {
			t.Errorf("%d request series after %d distinct URLs", n, unknown)
		}
		for _, m := range fams[reqs].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" && strings.Contains(l.GetValue(), "nothing-") {
					t.Fatalf("raw path as a route label: %s", l.GetValue())
				}
			}
		}
		if got := value(fams, "gatehouse_authz_denials_total", map[string]string{"log": "org"}); got != denied {
			t.Errorf("denials = %v, want %d", got, denied)
		}
		// Every event in the logs was counted once, and nothing failed.
		var platformEvents int64
		if err := e.c.Catalog.Table(audit.PlatformTable).Count(&platformEvents).Error; err != nil {
			t.Fatal(err)
		}
		orgEvents := orgEventCount(t, e, slug) - provisioned
		if got := value(fams, "gatehouse_audit_appends_total", map[string]string{"log": "platform", "result": "ok"}); got != float64(platformEvents) {
			t.Errorf("platform audit appends = %v, want %d (the events in the log)", got, platformEvents)
		}
		if got := value(fams, "gatehouse_audit_appends_total", map[string]string{"log": "org", "result": "ok"}); got != float64(orgEvents) {
			t.Errorf("org audit appends = %v, want %d (the events in the log)", got, orgEvents)
		}
		if got := value(fams, "gatehouse_audit_appends_total", map[string]string{"result": "error"}); got != 0 {
			t.Errorf("audit append failures = %v, want 0", got)
		}
		// Pool stats are summed over orgs by default: no slug in a label.
		if got := value(fams, "gatehouse_db_pool_open_connections", map[string]string{"db": "org", "org": slug}); got != 0 {
			t.Errorf("org pool labelled by slug without opting in")
		}
		// Each gauge on its own; the org pool series shows an org was open,
		// so the command gauge below was read from its database.
		if !has(fams, "gatehouse_db_pool_open_connections", map[string]string{"db": "catalog"}) {
			t.Errorf("catalog pool gauge missing")
		}
		if !has(fams, "gatehouse_db_pool_open_connections", map[string]string{"db": "org"}) {
			t.Errorf("org pool gauge missing (no org database open at the scrape)")
		}
		if !has(fams, "gatehouse_terminal_followers_active", nil) {
			t.Errorf("follower gauge missing")
		}
		if !has(fams, "gatehouse_terminal_commands_running", nil) {
			t.Errorf("running-commands gauge missing (its read of the open org databases failed)")
		}
		for _, name := range []string{"gatehouse_live_window_bytes", "gatehouse_live_window_evicted_bytes_total", "gatehouse_live_window_waiting_polls"} {
			if !has(fams, name, nil) {
				t.Errorf("live window metric %s missing", name)
			}
		}
	})
}

func orgEventCount(t *testing.T, e *testEnv, slug string) int64 {
	t.Helper()
	ten, err := e.c.Tenants.Open(context.Background(), slug)
	if err != nil {
		t.Fatal(err)
	}
	defer ten.Release()
	var n int64
	if err := ten.DB.Table(audit.OrgTable).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}
