//go:build linux

package agentd_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// egressBench is a server with egress and the world its sessions reach.
func egressBench(b *testing.B) (*agentd.Client, *egressWorld, *agentd.NetworkPolicy) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("network namespaces need root")
	}
	w := newEgressWorldTB(b)
	c := agentdtest.Client(b, agentdtest.WithConfig(func(c *agentd.Config) {
		c.EgressDNS, c.EgressRootCAs = w.dnsAddr, w.roots
	}))
	np := &agentd.NetworkPolicy{Version: 1, Policy: policy.Network{Default: policy.Deny,
		Rules: []policy.NetRule{{Action: policy.Allow, Host: "allowed.test"}}}}
	return c, w, np
}

// BenchmarkEgressDownload downloads 256 MiB over plain HTTP from a
// loopback server, directly (a session without a policy) and through the
// proxy (a session in its namespace), timed by curl itself.
func BenchmarkEgressDownload(b *testing.B) {
	c, w, np := egressBench(b)
	for _, bc := range []struct {
		name string
		np   *agentd.NetworkPolicy
		url  string
	}{
		{"direct", nil, fmt.Sprintf("http://%s:%d/big", w.serverIP, w.httpPort)},
		{"proxy", np, fmt.Sprintf("http://allowed.test:%d/big", w.httpPort)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var total float64
			for b.Loop() {
				out := benchRun(b, c, bc.np, "curl -sS -o /dev/null -w '%{time_total} %{size_download}' "+bc.url)
				var secs float64
				var size int64
				if _, err := fmt.Sscan(out, &secs, &size); err != nil || size != bigSize {
					b.Fatalf("curl: %q", out)
				}
				total += secs
			}
			b.ReportMetric(float64(bigSize)/(1<<20)/(total/float64(b.N)), "MiB/s")
		})
	}
}

// BenchmarkEgressConnect times new connections to the first byte of an
// HTTP answer, 200 of them per session, directly and through the proxy,
// and reports their p50.
func BenchmarkEgressConnect(b *testing.B) {
	c, w, np := egressBench(b)
	helper, _ := os.Executable()
	for _, bc := range []struct {
		name   string
		np     *agentd.NetworkPolicy
		target string
	}{
		{"direct", nil, fmt.Sprintf("%s:%d", w.serverIP, w.httpPort)},
		{"proxy", np, fmt.Sprintf("allowed.test:%d", w.httpPort)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var p50s []float64
			for b.Loop() {
				out := benchRun(b, c, bc.np, "AGENTD_EGRESS_HELPER=1 "+helper+" ttfb "+bc.target+" 200")
				us, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
				if err != nil {
					b.Fatalf("helper: %q", out)
				}
				p50s = append(p50s, us)
			}
			slices.Sort(p50s)
			b.ReportMetric(p50s[len(p50s)/2], "p50-µs/conn")
		})
	}
}

// BenchmarkEgressStart times a create of `true` to its end, without a
// policy and with one (a namespace, its rules and its listeners each).
func BenchmarkEgressStart(b *testing.B) {
	c, _, np := egressBench(b)
	for _, bc := range []struct {
		name string
		np   *agentd.NetworkPolicy
	}{{"no-policy", nil}, {"netns", np}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				benchRun(b, c, bc.np, "true")
			}
		})
	}
}

func benchRun(b *testing.B, c *agentd.Client, np *agentd.NetworkPolicy, command string) string {
	b.Helper()
	res, err := c.Run(b.Context(), agentd.CreateSessionRequest{Command: command, NetworkPolicy: np, WaitMS: 60000})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("%s: %v %+v", command, err, res)
	}
	var out strings.Builder
	for line := range strings.SplitSeq(string(res.Stdout), "\n") {
		if !strings.HasPrefix(line, "{") { // net records share Stdout in Run
			out.WriteString(line)
		}
	}
	return out.String()
}

// ttfbHelper resolves target's host once, then opens count connections
// one after another, each timed from the dial to the first byte of the
// answer to a GET, and prints their p50 in microseconds.
func ttfbHelper(target, count string) int {
	n, _ := strconv.Atoi(count)
	host, port, _ := net.SplitHostPort(target)
	addrs, err := net.LookupHost(host)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	addr := net.JoinHostPort(addrs[0], port)
	req := "GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
	var times []float64
	for range n {
		start := time.Now()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		conn.Write([]byte(req))
		if _, err := bufio.NewReader(conn).ReadByte(); err != nil {
			fmt.Println("error:", err)
			return 1
		}
		times = append(times, float64(time.Since(start).Microseconds()))
		conn.Close()
	}
	slices.Sort(times)
	fmt.Println(times[len(times)/2])
	return 0
}
