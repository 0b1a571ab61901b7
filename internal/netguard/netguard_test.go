package netguard_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/netguard/netguardtest"
)

func TestBlocked(t *testing.T) {
	t.Parallel()
	cases := []struct {
		addr    string
		blocked bool
	}{
		{"127.0.0.1", true},
		{"127.8.9.10", true},
		{"::1", true},
		{"::ffff:127.0.0.1", true},
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"::", true},
		{"169.254.169.254", true},
		{"169.254.1.1", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fd00:ec2::254", true},
		{"100.100.100.200", true},
		{"192.0.0.192", true},
		{"224.0.0.1", true},
		{"ff02::1", true},
		{"255.255.255.255", true},
		{"64:ff9b::7f00:1", true},
		{"64:ff9b::a9fe:a9fe", true},
		{"10.0.0.5", false},
		{"192.168.1.20", false},
		{"172.16.0.9", false},
		{"fd12:3456::1", false},
		{"93.184.216.34", false},
		{"2606:4700::1111", false},
		{"64:ff9b::5db8:d822", false},
	}
	for _, tc := range cases {
		a := netip.MustParseAddr(tc.addr)
		reason := netguard.Blocked(a)
		if (reason != "") != tc.blocked {
			t.Errorf("Blocked(%s) = %q, want blocked=%v", tc.addr, reason, tc.blocked)
		}
		err := netguard.Control("tcp", netip.AddrPortFrom(a, 80).String(), nil)
		if tc.blocked != errors.Is(err, netguard.ErrBlocked) {
			t.Errorf("Control(%s) = %v, want blocked=%v", tc.addr, err, tc.blocked)
		}
	}
	if err := netguard.Control("tcp", "not-an-address", nil); !errors.Is(err, netguard.ErrBlocked) {
		t.Errorf("Control of an unparsable address: %v", err)
	}
}

// TestTransportChecksTheDialledAddress aims a guarded client at a real
// server on loopback by literal address and by a name that resolves there:
// both are refused before any request is sent.
func TestTransportChecksTheDialledAddress(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	port := srv.URL[strings.LastIndex(srv.URL, ":"):]
	guarded := &http.Client{Transport: netguard.Transport(nil)}
	for _, u := range []string{srv.URL, "http://localhost" + port, "http://[::ffff:127.0.0.1]" + port} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
		resp, err := guarded.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: guarded client reached the server (%d)", u, resp.StatusCode)
		}
		if !errors.Is(err, netguard.ErrBlocked) {
			t.Fatalf("%s: error %v does not say the address is blocked", u, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Fatalf("the server saw %d requests", hits)
	}
}

func TestWatchedReportsDialledAddresses(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	var mu sync.Mutex
	var seen []netip.Addr
	c := &http.Client{Transport: netguard.Watched(nil, nil, func(a netip.Addr) {
		mu.Lock()
		seen = append(seen, a)
		mu.Unlock()
	})}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || !seen[0].IsLoopback() {
		t.Fatalf("seen %v, want the loopback address dialled", seen)
	}
}

// TestTransportChecksCustomDialers: a transport with its own dialer (here
// one that maps a made-up name to the server, as a DNS answer would) is
// checked on where the connection landed, before anything is sent.
func TestTransportChecksCustomDialers(t *testing.T) {
	t.Parallel()
	hits := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits <- struct{}{} }))
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://")
	base := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, target)
	}}
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{{"plain", base}, {"guarded", netguard.Transport(base)}} {
		name := tc.name
		resp, err := (&http.Client{Transport: tc.rt}).Get("http://workstation.test/")
		if name == "plain" {
			if err != nil {
				t.Fatalf("the mapping itself does not work: %v", err)
			}
			resp.Body.Close()
			<-hits
			continue
		}
		if err == nil {
			resp.Body.Close()
			t.Fatal("guarded transport reached loopback through a custom dialer")
		}
		if !errors.Is(err, netguard.ErrBlocked) {
			t.Fatalf("error %v does not say the address is blocked", err)
		}
	}
	select {
	case <-hits:
		t.Fatal("the server saw the guarded request")
	default:
	}
}

// TestMetadata is the rule for every environment, shared ones included:
// link-local and metadata addresses in every form are refused, the
// console's own machine and private networks are not (an admin's dev
// agentd on loopback is a shared environment).
func TestMetadata(t *testing.T) {
	t.Parallel()
	cases := []struct {
		addr    string
		refused bool
	}{
		{"169.254.169.254", true},
		{"169.254.0.1", true},
		{"::ffff:169.254.169.254", true},
		{"64:ff9b::a9fe:a9fe", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fd00:ec2::254", true},
		{"100.100.100.200", true},
		{"192.0.0.192", true},
		{"127.0.0.1", false},
		{"::1", false},
		{"10.0.0.5", false},
		{"fd12:3456::1", false},
		{"93.184.216.34", false},
	}
	for _, tc := range cases {
		a := netip.MustParseAddr(tc.addr)
		if got := netguard.Metadata(a); (got != "") != tc.refused {
			t.Errorf("Metadata(%s) = %q, want refused=%v", tc.addr, got, tc.refused)
		}
		err := netguard.ControlFor(netguard.Metadata)("tcp", netip.AddrPortFrom(a, 80).String(), nil)
		if errors.Is(err, netguard.ErrBlocked) != tc.refused {
			t.Errorf("ControlFor(Metadata)(%s) = %v, want refused=%v", tc.addr, err, tc.refused)
		}
		// Whatever every environment is refused, a private one is too.
		if tc.refused && netguard.Blocked(a) == "" {
			t.Errorf("Blocked(%s) allows what Metadata refuses", tc.addr)
		}
	}
}

// TestMetadataTransportRefusesBeforeConnecting dials the metadata and
// link-local addresses through a transport guarded by the Metadata rule,
// by literal and by a dialer of its own that lands there (as a name
// resolving there would): each is refused as not allowed, while a server
// on loopback, which shared environments may use, is reached.
func TestMetadataTransportRefusesBeforeConnecting(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	get := func(rt http.RoundTripper, url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := (&http.Client{Transport: rt}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	guarded := netguard.Guarded(nil, netguard.Metadata)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://169.254.10.20:49984/",
		"http://[fd00:ec2::254]/", "http://100.100.100.200/", "http://[fe80::1%25lo]:49984/", "http://[::ffff:169.254.169.254]/"} {
		if err := get(guarded, u); !errors.Is(err, netguard.ErrBlocked) {
			t.Errorf("%s: %v, want the address refused", u, err)
		}
	}
	landing := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
		if err != nil {
			return nil, err
		}
		return landedConn{conn, &net.TCPAddr{IP: net.ParseIP("169.254.169.254"), Port: 80}}, nil
	}}
	if err := get(netguard.Guarded(landing, netguard.Metadata), "http://metadata.test/"); !errors.Is(err, netguard.ErrBlocked) {
		t.Errorf("a connection that landed on the metadata address: %v, want it refused", err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the server behind the metadata address saw %d requests", n)
	}
	if err := get(guarded, srv.URL); err != nil {
		t.Fatalf("loopback through the Metadata rule: %v, want it reached", err)
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("the loopback server saw %d requests, want 1", n)
	}
}

// landedConn is a connection that reports landing at another address, as
// one to a name resolved elsewhere would.
type landedConn struct {
	net.Conn
	remote net.Addr
}

func (c landedConn) RemoteAddr() net.Addr { return c.remote }

// TestOwnAddressesAreBlocked: a server on this machine's non-loopback
// address (its LAN address) is this machine as much as 127.0.0.1 is. A
// guarded transport never sends it a request; the Metadata rule, which is
// all shared environments get, lets it through.
func TestOwnAddressesAreBlocked(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := netguardtest.Server(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	own := netip.MustParseAddrPort(srv.Listener.Addr().String()).Addr()
	if r := netguard.Blocked(own); !strings.Contains(r, "console's own machine") {
		t.Fatalf("Blocked(%s) = %q, want it refused as the console's own machine", own, r)
	}
	if err := netguard.Check(own); !errors.Is(err, netguard.ErrBlocked) || !strings.Contains(err.Error(), own.String()) {
		t.Fatalf("Check(%s) = %v, want a refusal naming the address", own, err)
	}
	mapped := netip.AddrFrom16(own.As16())
	if own.Is4() && netguard.Blocked(mapped) == "" {
		t.Fatalf("the IPv4-mapped form %s of the own address is allowed", mapped)
	}
	resp, err := (&http.Client{Transport: netguard.Transport(nil)}).Get(srv.URL)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("the guarded transport reached %s (%d)", srv.URL, resp.StatusCode)
	}
	if !errors.Is(err, netguard.ErrBlocked) {
		t.Fatalf("%s: %v, want the address refused", srv.URL, err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the server on the own address saw %d requests", n)
	}
	resp, err = (&http.Client{Transport: netguard.Guarded(nil, netguard.Metadata)}).Get(srv.URL)
	if err != nil {
		t.Fatalf("the Metadata rule refused the own address: %v", err)
	}
	resp.Body.Close()
	if n := hits.Load(); n != 1 {
		t.Fatalf("the server saw %d requests through the Metadata rule, want 1", n)
	}
}

// TestHostReadsInterfacesOncePerTTL: the own addresses are read once and
// kept for the TTL however many dials ask, read again after it, and a
// failed reading keeps the previous ones.
func TestHostReadsInterfacesOncePerTTL(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	reads := 0
	lan := "192.168.7.7"
	var fail error
	h := &netguard.Host{
		TTL: time.Minute,
		Now: func() time.Time { return now },
		List: func() ([]net.Addr, error) {
			reads++
			if fail != nil {
				return nil, fail
			}
			_, n, _ := net.ParseCIDR(lan + "/24")
			n.IP = net.ParseIP(lan)
			return []net.Addr{n, &net.IPAddr{IP: net.ParseIP("fd00::2")}}, nil
		},
	}
	for range 1000 {
		if !h.Has(netip.MustParseAddr("192.168.7.7")) || !h.Has(netip.MustParseAddr("::ffff:192.168.7.7")) || h.Has(netip.MustParseAddr("192.168.7.8")) {
			t.Fatal("the listed addresses are not the host's")
		}
	}
	if !h.Has(netip.MustParseAddr("fd00::2")) {
		t.Fatal("an address listed as *net.IPAddr is not the host's")
	}
	if reads != 1 {
		t.Fatalf("%d readings within the TTL, want 1", reads)
	}
	now = now.Add(time.Minute)
	lan = "192.168.7.8"
	if !h.Has(netip.MustParseAddr("192.168.7.8")) || h.Has(netip.MustParseAddr("192.168.7.7")) {
		t.Fatal("a reading after the TTL did not replace the addresses")
	}
	now = now.Add(time.Minute)
	fail = fmt.Errorf("netlink: the machine is busy")
	if !h.Has(netip.MustParseAddr("192.168.7.8")) {
		t.Fatal("a failed reading dropped the known addresses")
	}
	h.Has(netip.MustParseAddr("192.168.7.8"))
	if reads != 3 {
		t.Fatalf("%d readings, want 3 (a failed one is not retried on every dial)", reads)
	}
}
