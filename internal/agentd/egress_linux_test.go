//go:build linux

package agentd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// egressHelperEnv makes the test binary a small network client run inside
// sessions (see TestMain): "dns NAME" asks the resolver of resolv.conf,
// "udp ADDR" sends one datagram.
const egressHelperEnv = "AGENTD_EGRESS_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(egressHelperEnv) != "" {
		os.Exit(egressHelper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func egressHelper(args []string) int {
	if len(args) == 3 && args[0] == "ttfb" {
		return ttfbHelper(args[1], args[2])
	}
	if len(args) != 2 {
		fmt.Println("usage: dns NAME | udp ADDR | ttfb HOST:PORT COUNT")
		return 2
	}
	switch args[0] {
	case "dns":
		cfg, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		m := new(dns.Msg).SetQuestion(dns.Fqdn(args[1]), dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, net.JoinHostPort(cfg.Servers[0], cfg.Port))
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		fmt.Printf("rcode=%s answers=%d\n", dns.RcodeToString[r.Rcode], len(r.Answer))
	case "udp":
		c, err := net.Dial("udp", args[1])
		if err == nil {
			_, err = c.Write([]byte("leak"))
		}
		fmt.Println("udp:", err)
	}
	return 0
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
}

// egressPolicy is the scenario's policy: only allowed.test (and the names
// a step needs) may be reached.
func egressPolicy(version int64, extra ...policy.NetRule) *agentd.NetworkPolicy {
	rules := []policy.NetRule{
		{Action: policy.Allow, Host: "allowed.test"},
		{Action: policy.Deny, Host: "other.test", Reason: "other.test is not for agents"},
		{Action: policy.Allow, Host: "meta.test"},
		{Action: policy.Ask, Host: "ask.test"},
		{Action: policy.Allow, Host: "inspected.test", Methods: []string{"GET"}, Inspect: true},
	}
	return &agentd.NetworkPolicy{Version: version, Policy: policy.Network{Default: policy.Deny, Rules: append(rules, extra...)}}
}

func TestEgressNamespace(t *testing.T) {
	requireRoot(t)
	w := newEgressWorld(t)
	c := newClient(t, agentdtest.WithConfig(func(c *agentd.Config) {
		c.EgressDNS, c.EgressRootCAs = w.dnsAddr, w.roots
	}))
	np := egressPolicy(1)
	// elsewhere is an address a client may aim at that reaches nothing.
	const elsewhere = "198.19.255.254"
	curl := fmt.Sprintf("curl -sS --max-time 10 --cacert %s ", w.caFile)
	helper, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("health", func(t *testing.T) {
		h, err := c.Health(testCtx(t))
		if err != nil || h.EgressEnforcement != agentd.EgressEnforcementNetns {
			t.Fatalf("health: %+v, %v", h, err)
		}
	})
	t.Run("an allowed name is reached", func(t *testing.T) {
		run := runEgress(t, c, np, curl+fmt.Sprintf("https://allowed.test:%d/slow", w.tlsPort))
		if run.exitCode != 0 || !strings.Contains(run.stdout, "slow hello") {
			t.Fatalf("exit %d, stdout %q, stderr %q", run.exitCode, run.stdout, run.stderr)
		}
		rec, ok := run.find(agentd.NetRecordConnect, "allowed.test")
		if !ok || rec.Decision != agentd.NetAllow || rec.Rule != 0 || rec.PolicyVersion != 1 || rec.SNI != "allowed.test" ||
			rec.BytesIn == 0 || rec.BytesOut == 0 || rec.Port != w.tlsPort || rec.Addr != w.serverIP.String() {
			t.Fatalf("record %+v (found %v) in %+v", rec, ok, run.records)
		}
		// The connection lasted long enough for agentd to find its
		// process.
		if rec.PID == 0 || !strings.HasSuffix(rec.Program, "curl") {
			t.Errorf("the record names no process: pid %d, program %q", rec.PID, rec.Program)
		}
	})
	t.Run("a denied name is refused, with the rule in its record", func(t *testing.T) {
		run := runEgress(t, c, np, curl+fmt.Sprintf("--resolve other.test:%d:%s https://other.test:%d/", w.tlsPort, elsewhere, w.tlsPort))
		rec, ok := run.find(agentd.NetRecordConnect, "other.test")
		if run.exitCode == 0 || !ok || rec.Decision != agentd.NetDeny || rec.Rule != 1 || !strings.Contains(rec.Reason, "not for agents") {
			t.Fatalf("exit %d, record %+v (found %v)", run.exitCode, rec, ok)
		}
		run = runEgress(t, c, np, curl+fmt.Sprintf("https://other.test:%d/", w.tlsPort))
		if rec, ok := run.find(agentd.NetRecordDNS, "other.test"); run.exitCode == 0 || !ok || rec.Decision != agentd.NetDeny {
			t.Fatalf("resolving other.test: exit %d, record %+v (found %v)", run.exitCode, rec, ok)
		}
	})
	t.Run("the proxy dials the name, not the address the client chose", func(t *testing.T) {
		// A rule lets the trap's address through: only dialling the
		// name keeps the connection from it.
		np := egressPolicy(1, policy.NetRule{Action: policy.Allow, Host: w.trapIP.String()})
		run := runEgress(t, c, np, curl+fmt.Sprintf("--resolve allowed.test:%d:%s https://allowed.test:%d/", w.tlsPort, w.trapIP, w.tlsPort))
		if run.exitCode != 0 || w.trapConns.Load() != 0 {
			t.Fatalf("exit %d (%s), trap saw %d connections", run.exitCode, run.stderr, w.trapConns.Load())
		}
	})
	t.Run("a name resolving to the metadata address is refused", func(t *testing.T) {
		run := runEgress(t, c, np, curl+fmt.Sprintf("https://meta.test:%d/", w.tlsPort))
		rec, ok := run.find(agentd.NetRecordConnect, "meta.test")
		if run.exitCode == 0 || !ok || rec.Decision != agentd.NetDeny || !strings.Contains(rec.Reason, "169.254.169.254") {
			t.Fatalf("exit %d, record %+v (found %v)", run.exitCode, rec, ok)
		}
	})
	t.Run("DNS reaches no resolver for names no rule allows", func(t *testing.T) {
		run := runEgress(t, c, np, "AGENTD_EGRESS_HELPER=1 "+helper+" dns x.other.test")
		if !strings.Contains(run.stdout, "rcode=REFUSED") || w.queriesFor("x.other.test") != 0 {
			t.Fatalf("stdout %q; the test's server saw %d queries", run.stdout, w.queriesFor("x.other.test"))
		}
		if _, ok := run.find(agentd.NetRecordDNS, "x.other.test"); !ok {
			t.Fatalf("no record of the refused name in %+v", run.records)
		}
	})
	t.Run("UDP delivers nothing", func(t *testing.T) {
		runEgress(t, c, np, "AGENTD_EGRESS_HELPER=1 "+helper+" udp "+w.udpAddr)
		time.Sleep(100 * time.Millisecond)
		if n := w.udpGot.Load(); n != 0 {
			t.Fatalf("the test's UDP listener got %d datagrams", n)
		}
	})
	t.Run("no proxy variables grant anything", func(t *testing.T) {
		run := runEgress(t, c, np, "unset HTTPS_PROXY https_proxy ALL_PROXY all_proxy; "+curl+
			fmt.Sprintf("--noproxy '*' --resolve other.test:%d:%s https://other.test:%d/", w.tlsPort, elsewhere, w.tlsPort))
		if run.exitCode == 0 {
			t.Fatalf("other.test was reached: %q", run.stdout)
		}
	})
	t.Run("plain HTTP is answered 403 naming the rule", func(t *testing.T) {
		run := runEgress(t, c, np, fmt.Sprintf("curl -s --max-time 10 -w '%%{http_code}' --resolve other.test:%d:%s http://other.test:%d/", w.httpPort, elsewhere, w.httpPort))
		if !strings.Contains(run.stdout, "rule 2") || !strings.Contains(run.stdout, "not for agents") || !strings.HasSuffix(run.stdout, "403") {
			t.Fatalf("stdout %q", run.stdout)
		}
	})
	t.Run("ask is reported and denied without a hold mechanism", func(t *testing.T) {
		run := runEgress(t, c, np, curl+fmt.Sprintf("https://ask.test:%d/", w.tlsPort))
		rec, ok := run.find(agentd.NetRecordConnect, "ask.test")
		if run.exitCode == 0 || !ok || rec.Action != string(policy.Ask) || rec.Decision != agentd.NetDeny {
			t.Fatalf("exit %d, record %+v", run.exitCode, rec)
		}
	})
	t.Run("inspected HTTPS is decided by method", func(t *testing.T) {
		get := runEgress(t, c, np, fmt.Sprintf("curl -sS --max-time 10 https://inspected.test:%d/get", w.tlsPort))
		post := runEgress(t, c, np, fmt.Sprintf("curl -sS --max-time 10 -w '%%{http_code}' -d x https://inspected.test:%d/post", w.tlsPort))
		if !strings.Contains(get.stdout, "hello from inspected.test") || !strings.HasSuffix(post.stdout, "403") {
			t.Fatalf("GET: %q %q; POST: %q %q", get.stdout, get.stderr, post.stdout, post.stderr)
		}
		rec, _ := post.find(agentd.NetRecordConnect, "inspected.test")
		if !rec.Inspected || rec.Method != "POST" || rec.Path != "/post" || rec.Decision != agentd.NetDeny {
			t.Fatalf("POST record %+v", rec)
		}
	})
	t.Run("a policy update applies to new connections at once", func(t *testing.T) {
		egressPolicyUpdate(t, c, w, curl)
	})
}

// egressPolicyUpdate runs curl on demand in one session, denied under
// version 1 and allowed under version 2 sent while it runs.
func egressPolicyUpdate(t *testing.T, c *agentd.Client, w *egressWorld, curl string) {
	ctx := testCtx(t)
	loop := fmt.Sprintf("while read x; do %s https://other.test:%d/ >/dev/null 2>&1; echo rc=$?; done", curl, w.tlsPort)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: loop, Stdin: true, NetworkPolicy: egressPolicy(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, resp.SessionID)
	var out streams
	cursor := resp.NextCursor
	c.WriteStdin(ctx, resp.SessionID, []byte("1\n"), false)
	cursor = waitOutput(t, c, resp.SessionID, cursor, &out, "rc=")
	if !strings.Contains(out.stdout.String(), "rc=6") && !strings.Contains(out.stdout.String(), "rc=35") {
		t.Fatalf("under version 1: %q", out.stdout.String())
	}
	v2 := &agentd.NetworkPolicy{Version: 2, Policy: policy.Network{Default: policy.Deny, Rules: []policy.NetRule{{Action: policy.Allow, Host: "other.test"}}}}
	got, err := c.SetNetworkPolicy(ctx, resp.SessionID, v2)
	if err != nil || got != 2 {
		t.Fatalf("set policy: %d, %v", got, err)
	}
	updated := time.Now()
	if got, err := c.SetNetworkPolicy(ctx, resp.SessionID, egressPolicy(1)); err != nil || got != 2 {
		t.Fatalf("an older version replaced the newer: %d, %v", got, err)
	}
	out.stdout.Reset()
	c.WriteStdin(ctx, resp.SessionID, []byte("2\n"), false)
	waitOutput(t, c, resp.SessionID, cursor, &out, "rc=")
	if !strings.Contains(out.stdout.String(), "rc=0") || time.Since(updated) > time.Second {
		t.Fatalf("under version 2 after %s: %q", time.Since(updated), out.stdout.String())
	}
	if _, err := c.SetNetworkPolicy(ctx, "no-such-session", v2); !errors.Is(err, agentd.ErrNotFound) {
		t.Fatalf("unknown session: %v", err)
	}
}

func TestEgressRequireEnforcement(t *testing.T) {
	c := newClient(t, agentdtest.WithConfig(func(c *agentd.Config) { c.Egress = agentd.EgressOff }))
	np := egressPolicy(1)
	np.Policy.RequireEnforcement = true
	_, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "true", NetworkPolicy: np})
	if !errors.Is(err, agentd.ErrEgressUnenforceable) {
		t.Fatalf("create: %v", err)
	}
	h, _ := c.Health(testCtx(t))
	if h.EgressEnforcement != agentd.EgressEnforcementUnavailable || h.EgressEnforcementReason == "" {
		t.Fatalf("health %+v", h)
	}
	// Without the requirement the session runs, through the proxy its
	// variables name.
	resp, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "echo $HTTPS_PROXY", NetworkPolicy: egressPolicy(1), WaitMS: 5000})
	if err != nil || len(resp.Chunks) == 0 || !strings.HasPrefix(string(resp.Chunks[0].Data), "http://127.0.0.1:") {
		t.Fatalf("create without the requirement: %+v, %v", resp, err)
	}
	// A session without a policy has no policy to replace.
	plain, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "sleep 5"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), plain.SessionID)
	if _, err := c.SetNetworkPolicy(testCtx(t), plain.SessionID, egressPolicy(2)); !errors.Is(err, agentd.ErrNoNetworkPolicy) {
		t.Fatalf("update of a session without a policy: %v", err)
	}
}
