package config_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
)

// TestFollowerSettings: the recording follower's lease and sweep interval
// come from flags or the environment (flags win), with the defaults of a
// minute and ten seconds, and nonsense is refused at start.
func TestFollowerSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		args         []string
		env          map[string]string
		lease, sweep time.Duration
		err          string
	}{
		{name: "defaults", lease: time.Minute, sweep: 10 * time.Second},
		{name: "environment", env: map[string]string{"GATEHOUSE_FOLLOWER_LEASE": "2s", "GATEHOUSE_FOLLOWER_SWEEP_INTERVAL": "300ms"},
			lease: 2 * time.Second, sweep: 300 * time.Millisecond},
		{name: "flags win", args: []string{"--follower-lease", "5s", "--follower-sweep-interval", "1s"},
			env: map[string]string{"GATEHOUSE_FOLLOWER_LEASE": "2s"}, lease: 5 * time.Second, sweep: time.Second},
		{name: "lease too short", args: []string{"--follower-lease", "10ms"}, err: "--follower-lease"},
		{name: "sweep not positive", args: []string{"--follower-sweep-interval", "0s"}, err: "--follower-sweep-interval"},
		{name: "unparsable environment", env: map[string]string{"GATEHOUSE_FOLLOWER_LEASE": "soon"}, err: "GATEHOUSE_FOLLOWER_LEASE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := config.Load("console", tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.FollowerLease != tc.lease || c.FollowerSweepInterval != tc.sweep {
				t.Fatalf("lease %s, sweep %s; want %s, %s", c.FollowerLease, c.FollowerSweepInterval, tc.lease, tc.sweep)
			}
		})
	}
}

// TestLiveWindowSetting: the live window's budget comes from a flag or the
// environment in MiB, 256 by default; a budget under 1 MiB is refused.
func TestLiveWindowSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		mib  int
		err  string
	}{
		{name: "default", mib: config.DefaultLiveWindowMiB},
		{name: "environment", env: map[string]string{"GATEHOUSE_LIVE_WINDOW_MIB": "64"}, mib: 64},
		{name: "flag wins", args: []string{"--live-window-mib", "1024"}, env: map[string]string{"GATEHOUSE_LIVE_WINDOW_MIB": "64"}, mib: 1024},
		{name: "none", args: []string{"--live-window-mib", "0"}, err: "--live-window-mib"},
		{name: "not a number", env: map[string]string{"GATEHOUSE_LIVE_WINDOW_MIB": "lots"}, err: "GATEHOUSE_LIVE_WINDOW_MIB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := config.Load("console", tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil || c.LiveWindowMiB != tc.mib {
				t.Fatalf("%d MiB, %v; want %d", c.LiveWindowMiB, err, tc.mib)
			}
		})
	}
}

// Metrics are off unless an address is given; retention runs hourly unless
// told otherwise; bad values are refused naming the setting.
func TestOperationsSettings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		listen   string
		perOrg   bool
		interval time.Duration
		err      string
	}{
		{name: "defaults", interval: time.Hour},
		{name: "environment", env: map[string]string{"GATEHOUSE_METRICS_LISTEN": "127.0.0.1:9090", "GATEHOUSE_METRICS_PER_ORG_DB": "true",
			"GATEHOUSE_RETENTION_INTERVAL": "10m"}, listen: "127.0.0.1:9090", perOrg: true, interval: 10 * time.Minute},
		{name: "flags win", args: []string{"--metrics-listen", ":9100", "--retention-interval", "30s"},
			env: map[string]string{"GATEHOUSE_METRICS_LISTEN": "127.0.0.1:9090"}, listen: ":9100", interval: 30 * time.Second},
		{name: "metrics address without port", args: []string{"--metrics-listen", "localhost"}, err: "--metrics-listen"},
		{name: "retention interval not positive", args: []string{"--retention-interval", "0s"}, err: "--retention-interval"},
		{name: "unparsable retention interval", env: map[string]string{"GATEHOUSE_RETENTION_INTERVAL": "daily"}, err: "GATEHOUSE_RETENTION_INTERVAL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := config.Load("console", tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.MetricsListen != tc.listen || c.MetricsPerOrgDB != tc.perOrg || c.RetentionInterval != tc.interval {
				t.Fatalf("got listen %q per-org %v interval %s", c.MetricsListen, c.MetricsPerOrgDB, c.RetentionInterval)
			}
		})
	}
}

// The E2B endpoint's settings: no domain and no data-plane listener by
// default (the single-host URL is then the console's own), the listener's
// address gives the URL unless one is set, and malformed values are
// refused naming the flag.
func TestE2BSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		args                []string
		env                 map[string]string
		domain, listen, url string
		err                 string
	}{
		{name: "defaults", url: "http://127.0.0.1:8080"},
		{name: "base url", args: []string{"--base-url", "https://console.example/"}, url: "https://console.example"},
		{name: "environment", env: map[string]string{"GATEHOUSE_E2B_DOMAIN": "E2B.Console.Example.", "GATEHOUSE_E2B_LISTEN": "0.0.0.0:49983"},
			domain: "e2b.console.example", listen: "0.0.0.0:49983", url: "http://127.0.0.1:49983"},
		{name: "flags win", args: []string{"--e2b-domain", "sbx.example", "--e2b-listen", "127.0.0.1:7000", "--e2b-public-url", "https://sbx.example"},
			env: map[string]string{"GATEHOUSE_E2B_DOMAIN": "other.example"}, domain: "sbx.example", listen: "127.0.0.1:7000", url: "https://sbx.example"},
		{name: "domain with scheme", args: []string{"--e2b-domain", "https://e2b.example"}, err: "--e2b-domain"},
		{name: "listen without port", args: []string{"--e2b-listen", "localhost"}, err: "--e2b-listen"},
		{name: "public url not http", args: []string{"--e2b-public-url", "e2b.example"}, err: "--e2b-public-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := config.Load("console", tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.E2BDomain != tc.domain || c.E2BListen != tc.listen || c.E2BPublicURL != tc.url {
				t.Fatalf("got domain %q listen %q url %q; want %q %q %q", c.E2BDomain, c.E2BListen, c.E2BPublicURL, tc.domain, tc.listen, tc.url)
			}
		})
	}
}

// TestApprovalWebhookAllow: the operator's allow-list of private networks
// for approval webhooks is parsed from the flag or the environment, and a
// malformed prefix is refused.
func TestApprovalWebhookAllow(t *testing.T) {
	c, _, err := config.Load("console", nil, func(k string) string {
		return map[string]string{"GATEHOUSE_APPROVAL_WEBHOOK_ALLOW": "10.20.0.5/16, fd00:1::/64"}[k]
	}, io.Discard)
	if err != nil || len(c.ApprovalWebhookNets) != 2 || c.ApprovalWebhookNets[0].String() != "10.20.0.0/16" {
		t.Fatalf("%v %v", c.ApprovalWebhookNets, err)
	}
	if c, _, err := config.Load("console", nil, func(string) string { return "" }, io.Discard); err != nil || len(c.ApprovalWebhookNets) != 0 {
		t.Fatalf("default: %v %v", c.ApprovalWebhookNets, err)
	}
	if _, _, err := config.Load("console", []string{"--approval-webhook-allow", "10.0.0.1"}, func(string) string { return "" }, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "--approval-webhook-allow") {
		t.Fatalf("malformed prefix: %v", err)
	}
}
