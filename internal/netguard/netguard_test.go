package netguard_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/gatehouse/gatehouse/internal/netguard"
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
	c := &http.Client{Transport: netguard.Watched(nil, func(a netip.Addr) {
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
