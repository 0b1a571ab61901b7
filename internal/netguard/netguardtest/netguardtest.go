// Package netguardtest serves HTTP at an address of the test machine's own
// network interfaces other than loopback (its LAN address, say), so tests
// can prove that the console's own machine is refused there too.
package netguardtest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// Server is an HTTP server with handler h listening on a non-loopback,
// non-link-local address of this machine's interfaces, closed at cleanup.
// It fails t, saying why, when the machine has no such address to listen
// on (a sandbox with loopback only): the own-machine rule would then go
// unproven, and a skipped test proves nothing in CI.
func Server(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	ln := listen(t)
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatalf("cannot list this machine's interface addresses: %v", err)
	}
	var tried []string
	for _, n := range addrs {
		p, err := netip.ParsePrefix(n.String())
		if err != nil {
			continue
		}
		a := p.Addr().Unmap()
		// Link-local addresses are refused for every environment anyway;
		// the point here is an address only the own-machine rule refuses.
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
			continue
		}
		ln, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
		if err == nil {
			return ln
		}
		tried = append(tried, a.String()+": "+err.Error())
	}
	t.Fatalf("this machine has no non-loopback interface address to listen on (tried %v); the own-machine rule cannot be proven here", tried)
	return nil
}
