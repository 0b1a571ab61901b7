//go:build linux

package main_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// egressServers starts an HTTP server on a loopback address of its own
// and a DNS server answering every name with that address; both stop with
// the test.
func egressServers(t *testing.T) (dnsAddr, server string, port int) {
	t.Helper()
	ip := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 2+rand.IntN(250))
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", r.Host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ds := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip)}}
		}
		w.WriteMsg(m)
	})}
	go ds.ActivateAndServe()
	t.Cleanup(func() { ds.Shutdown() })
	return pc.LocalAddr().String(), ip, ln.Addr().(*net.TCPAddr).Port
}

// TestEgressModes runs the agentd binary (whose spawner starts commands,
// so a session's namespace or Landlock rule travels with the spawn
// request) in each egress mode: an allowed name is reached, a denied one
// is not, and a direct connection around the proxy fails.
func TestEgressModes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the namespace mode needs root; the Landlock mode is tested beside it")
	}
	dnsAddr, server, port := egressServers(t)
	np := &agentd.NetworkPolicy{Version: 7, Policy: policy.Network{Default: policy.Deny,
		Rules: []policy.NetRule{{Action: policy.Allow, Host: "allowed.test"}}}}
	for _, mode := range []struct{ flag, health string }{
		{"netns", agentd.EgressEnforcementNetns},
		{"landlock", agentd.EgressEnforcementLandlock},
	} {
		t.Run(mode.flag, func(t *testing.T) {
			d := startDaemon(t, "--egress", mode.flag, "--egress-dns", dnsAddr)
			defer d.terminate(false)
			h, err := d.client.Health(ctxFor(t))
			if err != nil || h.EgressEnforcement != mode.health {
				t.Fatalf("health %+v, %v", h, err)
			}
			if spawnerOf(t, d.cmd.Process.Pid) == 0 {
				t.Fatal("agentd runs no spawner")
			}
			for _, step := range []struct {
				command string
				want    string // in stdout; "" means the command must fail
			}{
				{fmt.Sprintf("curl -sS --max-time 10 http://allowed.test:%d/", port), "hello from allowed.test"},
				{fmt.Sprintf("curl -sS --max-time 10 -f http://denied.test:%d/", port), ""},
				{fmt.Sprintf("curl -sS --max-time 5 --noproxy '*' http://%s:%d/", server, port), ""},
			} {
				resp, err := d.client.CreateSession(ctxFor(t), agentd.CreateSessionRequest{Command: step.command, NetworkPolicy: np})
				if err != nil {
					t.Fatal(err)
				}
				end := waitEnd(t, d, resp.SessionID)
				out := stdout(end)
				switch {
				case step.want != "" && !strings.Contains(out, step.want):
					t.Errorf("%s: exit %d, stdout %q", step.command, *end.ExitCode, out)
				case step.want == "" && *end.ExitCode == 0:
					t.Errorf("%s: reached around the proxy: %q", step.command, out)
				}
			}
		})
	}
}
