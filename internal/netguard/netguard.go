// Package netguard keeps outbound calls that a less trusted user aimed
// (a member's private environment) off the console's own machine and the
// cloud metadata services. The rule is enforced on the address actually
// dialled, after name resolution, so a host name that resolves to loopback,
// a DNS answer that changes between check and use, or an IPv4-mapped form
// cannot slip past it.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// ErrBlocked is wrapped by every refusal, so callers can tell a refused
// address from a network failure.
var ErrBlocked = errors.New("address not allowed")

// BlockedError names the refused address and why.
type BlockedError struct {
	Addr   netip.Addr
	Reason string
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("%s is %s: %v", e.Addr, e.Reason, ErrBlocked)
}

// Unwrap makes errors.Is(err, ErrBlocked) true.
func (e *BlockedError) Unwrap() error { return ErrBlocked }

// metadata are the instance metadata services that do not sit in a range
// refused anyway (169.254.169.254 is link-local and refused as such).
var metadata = map[netip.Addr]string{
	netip.MustParseAddr("fd00:ec2::254"):   "the AWS instance metadata service",
	netip.MustParseAddr("100.100.100.200"): "the Alibaba Cloud metadata service",
	netip.MustParseAddr("192.0.0.192"):     "the Oracle Cloud metadata service",
}

// nat64 is the well-known NAT64 prefix: 64:ff9b::7f00:1 reaches 127.0.0.1
// through a NAT64 gateway.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// thisNetwork is 0.0.0.0/8: Linux connects 0.x.y.z to the local host.
var thisNetwork = netip.MustParsePrefix("0.0.0.0/8")

// Blocked reports why a may not be dialled, or "" when it may. Private
// (RFC 1918, ULA) addresses are allowed: a workstation on the office
// network is what private environments are for.
func Blocked(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is6() && nat64.Contains(a) {
		b := a.As16()
		if r := Blocked(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); r != "" {
			return r + " (through NAT64)"
		}
	}
	switch {
	case !a.IsValid():
		return "not an IP address"
	case a.IsLoopback():
		return "a loopback address (this machine)"
	case a.IsUnspecified() || a.Is4() && thisNetwork.Contains(a):
		return "an unspecified address (this machine)"
	case a.IsLinkLocalUnicast():
		return "a link-local address (metadata services live there)"
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "a multicast or broadcast address"
	}
	if name, ok := metadata[a]; ok {
		return name
	}
	return ""
}

// Check refuses a blocked address with a *BlockedError.
func Check(a netip.Addr) error {
	if r := Blocked(a); r != "" {
		return &BlockedError{Addr: a.Unmap().WithZone(""), Reason: r}
	}
	return nil
}

// Control is a net.Dialer Control hook: it runs after resolution, for
// every address the dialer tries, and refuses blocked ones before the
// connection is made.
func Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("netguard: dial address %q: %w", address, ErrBlocked)
	}
	return Check(ap.Addr())
}

// Transport returns a transport for calls to addresses a less trusted user
// chose: base's settings (http.DefaultTransport's when base is nil or not
// an *http.Transport) with a dialer that refuses blocked addresses, no
// proxy (a proxy would dial the target on our behalf, out of the hook's
// sight) and no kept-alive connections (each Transport is made per use and
// must not leave idle connections behind).
func Transport(base http.RoundTripper) *http.Transport {
	return transport(base, Control)
}

// Watched is Transport without the refusal: every address is allowed, and
// seen is called with each one dialled, so a caller can decide afterwards
// how much of a failure to show (a probe of the console's own machine
// must not tell closed ports from open ones).
func Watched(base http.RoundTripper, seen func(netip.Addr)) *http.Transport {
	return transport(base, func(_, address string, _ syscall.RawConn) error {
		if ap, err := netip.ParseAddrPort(address); err == nil {
			seen(ap.Addr().Unmap().WithZone(""))
		}
		return nil
	})
}

func transport(base http.RoundTripper, control func(network, address string, c syscall.RawConn) error) *http.Transport {
	t, ok := base.(*http.Transport)
	if !ok || t == nil {
		t, _ = http.DefaultTransport.(*http.Transport)
	}
	custom := t.DialContext
	if t == http.DefaultTransport {
		custom = nil
	}
	t = t.Clone()
	if custom != nil {
		// A dialer of the caller's own (a test's name mapping, a tunnel)
		// resolves out of the hook's sight: check where the connection
		// landed before a byte is sent, and drop it if it is refused.
		t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := custom(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if err := control(network, conn.RemoteAddr().String(), nil); err != nil {
				conn.Close()
				return nil, err
			}
			return conn, nil
		}
	} else {
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: control}
		t.DialContext = d.DialContext
	}
	// Every other dial path is cleared so the hooked dialer is the only one.
	t.DialTLSContext = nil
	//lint:ignore SA1019 a deprecated dial hook of base must not bypass the check
	t.Dial = nil
	//lint:ignore SA1019 idem: DialTLS is used when DialTLSContext is nil
	t.DialTLS = nil
	t.Proxy = nil
	t.DisableKeepAlives = true
	return t
}
