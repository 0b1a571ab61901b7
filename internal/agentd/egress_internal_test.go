package agentd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/policy"
)

// clientHello is the first flight of a TLS client asking for name.
func clientHello(t *testing.T, name string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		tls.Client(a, &tls.Config{ServerName: name, InsecureSkipVerify: name == ""}).Handshake()
		a.Close()
	}()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1<<16)
	n, _ := b.Read(buf)
	return buf[:n]
}

func TestPeekSNI(t *testing.T) {
	for _, tc := range []struct {
		name string
		data func(t *testing.T) []byte
		want string
	}{
		{"a name", func(t *testing.T) []byte { return clientHello(t, "Allowed.Test") }, "allowed.test"},
		{"no name", func(t *testing.T) []byte { return clientHello(t, "") }, ""},
		{"plain HTTP", func(*testing.T) []byte { return []byte("GET / HTTP/1.1\r\n\r\n") }, ""},
		{"a cut record", func(t *testing.T) []byte { return clientHello(t, "allowed.test")[:40] }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.data(t)
			br := bufio.NewReaderSize(bytes.NewReader(data), egressPeekSize)
			if got := peekSNI(br); got != tc.want {
				t.Fatalf("peekSNI = %q, want %q", got, tc.want)
			}
			if br.Buffered() > 0 { // nothing was consumed
				if b, _ := br.Peek(br.Buffered()); !bytes.HasPrefix(data, b) {
					t.Fatal("peekSNI consumed bytes")
				}
			}
		})
	}
}

func TestRefusedAddr(t *testing.T) {
	np := &NetworkPolicy{Policy: policy.Network{Default: policy.Allow, Rules: []policy.NetRule{
		{Action: policy.Allow, Host: "allowed.test"},
		{Action: policy.Allow, Host: "*.wild.test"},
		{Action: policy.Allow, Host: "10.1.0.0/16"},
		{Action: policy.Deny, Host: "192.0.2.0/24"},
	}}}
	nc := &netConn{pol: np}
	for _, tc := range []struct {
		name, addr string
		refused    bool
	}{
		{"allowed.test", "127.0.0.1", false},      // the rule names the name itself
		{"x.wild.test", "127.0.0.1", true},        // a wildcard does not lead to loopback
		{"anything.test", "10.0.0.5", true},       // the default does not lead to private addresses
		{"anything.test", "10.1.2.3", false},      // a rule names the range
		{"allowed.test", "169.254.169.254", true}, // metadata, named or not
		{"anything.test", "203.0.113.7", false},
		{"anything.test", "192.0.2.7", true},  // a rule denies the address
		{"anything.test", "198.18.0.9", true}, // a synthetic address
	} {
		t.Run(tc.name+" at "+tc.addr, func(t *testing.T) {
			a := netip.MustParseAddr(tc.addr)
			d := np.Policy.DecideConn(policy.Conn{Name: tc.name, Addr: a, Port: 443})
			why := nc.refusedAddr(tc.name, a, 443, "", "", d)
			if (why != "") != tc.refused {
				t.Fatalf("refusedAddr = %q, want refused %v", why, tc.refused)
			}
		})
	}
}

func TestNetworkPolicyIsDecodedStrictly(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"version":1,"policy":{"default":"deny","rules":[{"action":"allow","host":"a.test"}]}}`, true},
		{`{"version":1,"policy":{"default":"deny","rules":[{"action":"allow","host":"a.test","port":443}]}}`, false},
		{`{"version":1,"policy":{"default":"deny","rules":[]},"extra":1}`, false},
	} {
		var np NetworkPolicy
		if err := np.UnmarshalJSON([]byte(tc.body)); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.body, err)
		}
	}
}

// A rule that inspects and allows only some methods covers the
// connection before any request is seen: otherwise its TLS would never
// be terminated and its methods never checked.
func TestInspectedCoversRulesWithMethodsAndPaths(t *testing.T) {
	np := &NetworkPolicy{Version: 1, Policy: policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
		{Action: policy.Allow, Host: "a.test", Methods: []string{"GET"}, Paths: []string{"/v1/*"}, Inspect: true, Ports: []int{443}},
	}}}
	if !np.inspected(policy.Conn{Name: "a.test", Port: 443}) {
		t.Fatal("a.test:443 is not inspected")
	}
	if np.inspected(policy.Conn{Name: "a.test", Port: 80}) || np.inspected(policy.Conn{Name: "b.test", Port: 443}) {
		t.Fatal("a connection the rule does not name is inspected")
	}
}

// Every plain-HTTP request on a keep-alive connection is decided: a path
// rule denies the second request although the first was allowed, and a
// Host that changes is decided as its own name.
func TestEgressKeepAliveDecidesEveryRequest(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host+r.URL.Path)
		mu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()
	hostport := strings.TrimPrefix(srv.URL, "http://")
	_, port, _ := net.SplitHostPort(hostport)
	for _, tc := range []struct {
		name, second string
		rules        []policy.NetRule
	}{
		{"a denied path", "GET /secret/data HTTP/1.1\r\nHost: " + hostport + "\r\nConnection: close\r\n\r\n", []policy.NetRule{
			{Action: policy.Allow, Host: "127.0.0.1"},
			{Action: policy.Deny, Host: "127.0.0.1", Paths: []string{"/secret*"}},
		}},
		{"a denied method", "DELETE /ok HTTP/1.1\r\nHost: " + hostport + "\r\nConnection: close\r\n\r\n", []policy.NetRule{
			{Action: policy.Allow, Host: "127.0.0.1", Methods: []string{"GET"}},
		}},
		{"another host", "GET /ok HTTP/1.1\r\nHost: 127.0.0.2:" + port + "\r\nConnection: close\r\n\r\n", []policy.NetRule{
			{Action: policy.Allow, Host: "127.0.0.1"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			seen = nil
			mu.Unlock()
			np := &NetworkPolicy{Policy: policy.Network{Default: policy.Deny, Rules: tc.rules}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e := &sessionEgress{svc: &egressService{names: newUpstreamDNS("")}, ctx: ctx}
			a, b := net.Pipe()
			defer a.Close()
			nc := &netConn{e: e, pol: np, client: b, br: bufio.NewReader(b)}
			done := make(chan struct{})
			go func() { nc.serveHTTP(); b.Close(); close(done) }()
			go fmt.Fprintf(a, "GET /ok HTTP/1.1\r\nHost: %s\r\n\r\n%s", hostport, tc.second)
			a.SetReadDeadline(time.Now().Add(10 * time.Second))
			out, _ := io.ReadAll(a)
			<-done
			br := bufio.NewReader(bytes.NewReader(out))
			for i, want := range []int{http.StatusOK, http.StatusForbidden} {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("response %d: %v (client got %q)", i+1, err, out)
				}
				io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != want {
					t.Fatalf("response %d: status %d, want %d", i+1, resp.StatusCode, want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 1 || seen[0] != hostport+"/ok" {
				t.Fatalf("the server saw %q, want only the first request", seen)
			}
		})
	}
}

// A rule reaches a private or local address by naming it only for its
// own ports and only with an address or prefix within the address's
// range: a wildcard rule for another port, or a prefix that merely
// contains loopback (0.0.0.0/0), does not lead a name to the host's
// loopback.
func TestEgressRefusedAddrNeedsRuleWithinRangeAndPort(t *testing.T) {
	var own netip.Addr // one of this host's addresses outside loopback
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, n := range addrs {
			if ipn, ok := n.(*net.IPNet); ok {
				if a, ok := netip.AddrFromSlice(ipn.IP); ok && a.Is4() && !a.IsLoopback() {
					own = a.Unmap()
					break
				}
			}
		}
	}
	wild := policy.NetRule{Action: policy.Allow, Host: "*.example.com", Ports: []int{8080}}
	for _, tc := range []struct {
		name    string
		rule    policy.NetRule
		addr    string
		refused bool
	}{
		{"loopback prefix for another port", policy.NetRule{Action: policy.Allow, Host: "127.0.0.0/8", Ports: []int{9999}}, "127.0.0.1", true},
		{"loopback prefix for the port", policy.NetRule{Action: policy.Allow, Host: "127.0.0.0/8", Ports: []int{8080}}, "127.0.0.1", false},
		{"loopback address for the port", policy.NetRule{Action: policy.Allow, Host: "127.0.0.1", Ports: []int{8080}}, "127.0.0.1", false},
		{"loopback address for any port", policy.NetRule{Action: policy.Allow, Host: "127.0.0.1"}, "127.0.0.1", false},
		{"everything", policy.NetRule{Action: policy.Allow, Host: "0.0.0.0/0"}, "127.0.0.1", true},
		{"everything v6", policy.NetRule{Action: policy.Allow, Host: "::/0"}, "::1", true},
		{"a prefix holding loopback", policy.NetRule{Action: policy.Allow, Host: "64.0.0.0/2"}, "127.0.0.1", true},
		{"everything to a private address", policy.NetRule{Action: policy.Allow, Host: "0.0.0.0/0"}, "10.1.2.3", true},
		{"a private prefix", policy.NetRule{Action: policy.Allow, Host: "10.0.0.0/8"}, "10.1.2.3", false},
		{"link-local prefix", policy.NetRule{Action: policy.Allow, Host: "169.0.0.0/8"}, "169.254.1.1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np := &NetworkPolicy{Policy: policy.Network{Default: policy.Deny, Rules: []policy.NetRule{tc.rule, wild}}}
			nc := &netConn{pol: np}
			a := netip.MustParseAddr(tc.addr)
			d := np.Policy.DecideConn(policy.Conn{Name: "x.example.com", Addr: a, Port: 8080})
			why := nc.refusedAddr("x.example.com", a, 8080, "", "", d)
			if (why != "") != tc.refused {
				t.Fatalf("refusedAddr = %q, want refused %v", why, tc.refused)
			}
		})
	}
	if own.IsValid() {
		t.Run("this host's address", func(t *testing.T) {
			for _, tc := range []struct {
				host    string
				refused bool
			}{
				{netip.PrefixFrom(own, 8).Masked().String(), true},
				{own.String(), false},
			} {
				np := &NetworkPolicy{Policy: policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
					{Action: policy.Allow, Host: tc.host}, wild,
				}}}
				nc := &netConn{pol: np}
				d := np.Policy.DecideConn(policy.Conn{Name: "x.example.com", Addr: own, Port: 8080})
				if why := nc.refusedAddr("x.example.com", own, 8080, "", "", d); (why != "") != tc.refused {
					t.Fatalf("rule %s: refusedAddr = %q, want refused %v", tc.host, why, tc.refused)
				}
			}
		})
	}
}

// A request that expects 100-continue is answered 100 by the proxy once
// it is allowed, and the server's final answer follows; the connection
// then carries the next request.
func TestEgressExpectContinue(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		fmt.Fprintf(w, "%s %s", r.URL.Path, b)
	}))
	defer srv.Close()
	hostport := strings.TrimPrefix(srv.URL, "http://")
	np := &NetworkPolicy{Policy: policy.Network{Default: policy.Deny, Rules: []policy.NetRule{{Action: policy.Allow, Host: "127.0.0.1"}}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &sessionEgress{svc: &egressService{names: newUpstreamDNS("")}, ctx: ctx}
	a, b := net.Pipe()
	defer a.Close()
	nc := &netConn{e: e, pol: np, client: b, br: bufio.NewReader(b)}
	done := make(chan struct{})
	go func() { nc.serveHTTP(); b.Close(); close(done) }()
	go fmt.Fprintf(a, "POST /up HTTP/1.1\r\nHost: %s\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello"+
		"GET /next HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hostport, hostport)
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	out, _ := io.ReadAll(a)
	<-done
	br := bufio.NewReader(bytes.NewReader(out))
	var got []string
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		body, _ := io.ReadAll(resp.Body)
		got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, body))
	}
	want := []string{"100 ", "103 ", "200 /up hello", "103 ", "200 /next "}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the client got %q, want %q", got, want)
	}
}
