// Package netguard keeps outbound calls to environments off the addresses
// they must never reach. Two rules:
//
//   - Metadata, for every environment, shared ones included: link-local
//     addresses and the cloud metadata services, where a call would hand
//     the console's cloud credentials to whoever chose the address.
//   - Blocked, for addresses a less trusted user aimed at (a member's
//     private environment): Metadata's, and the console's own machine as
//     well (loopback, and the addresses of its network interfaces, so a
//     LAN address of the console host is refused like 127.0.0.1).
//
// A rule is enforced on the address actually dialled, after name
// resolution, so a host name that resolves to a refused address, a DNS
// answer that changes between check and use, or an IPv4-mapped form cannot
// slip past it.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
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

// Metadata reports why no environment at all, shared ones set up by org
// admins included, may be dialled at a, or "" when it may: link-local
// addresses (169.254.0.0/16 holds the metadata services of AWS, GCP and
// Azure at 169.254.169.254; fe80::/10) and the other clouds' metadata
// addresses, in any of their IPv4-mapped or NAT64 forms. Loopback is
// allowed here: an admin's development agentd on 127.0.0.1 is a shared
// environment.
func Metadata(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is6() && nat64.Contains(a) {
		if r := Metadata(embedded4(a)); r != "" {
			return r + " (through NAT64)"
		}
	}
	switch {
	case !a.IsValid():
		return "not an IP address"
	case a.IsLinkLocalUnicast():
		return "a link-local address (metadata services live there)"
	}
	if name, ok := metadata[a]; ok {
		return name
	}
	return ""
}

// Blocked reports why a may not be dialled for a less trusted user, or ""
// when it may: Metadata's refusals, and the console's own machine
// (loopback, unspecified, and every address of its network interfaces),
// multicast and broadcast. Private (RFC 1918, ULA) addresses of other
// machines are allowed: a workstation on the office network is what
// private environments are for.
func Blocked(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if r := Metadata(a); r != "" {
		return r
	}
	if a.Is6() && nat64.Contains(a) {
		if r := Blocked(embedded4(a)); r != "" {
			return r + " (through NAT64)"
		}
	}
	switch {
	case a.IsLoopback():
		return "a loopback address (this machine)"
	case a.IsUnspecified() || a.Is4() && thisNetwork.Contains(a):
		return "an unspecified address (this machine)"
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "a multicast or broadcast address"
	case thisHost.Has(a):
		return "an address of the console's own machine"
	}
	return ""
}

// embedded4 is the IPv4 address in the low 32 bits of a NAT64 address.
func embedded4(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
}

// HostRefresh is how long the console host's interface addresses are
// trusted before they are read again: an address added since (a new DHCP
// lease, a container bridge) is refused at most this late, and dials do
// not cost a system call each.
const HostRefresh = time.Minute

// Host is the set of the console host's own addresses, read from its
// network interfaces and kept for TTL. A service bound to 0.0.0.0 answers
// on each of them, so each is "this machine" as much as 127.0.0.1 is.
// Addresses the host is known by only through NAT (a cloud VM's public
// address) are not among them; nothing on the machine can list those.
type Host struct {
	// List reads the interface addresses; nil is net.InterfaceAddrs.
	List func() ([]net.Addr, error)
	// TTL is how long a reading is used; zero is HostRefresh.
	TTL time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time

	mu   sync.Mutex
	read time.Time
	set  map[netip.Addr]bool
}

// thisHost is the process's one view of its machine's addresses: they are
// a property of the machine, not of a caller, and every guarded transport
// shares the reading (one system call a minute, however many dials).
var thisHost = &Host{}

// Has reports whether a is one of the host's addresses, reading them again
// when the last reading is older than TTL. A reading that fails keeps the
// previous set (and is retried after TTL, not on every dial): the fixed
// rules still refuse loopback and link-local meanwhile.
func (h *Host) Has(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	now := time.Now
	if h.Now != nil {
		now = h.Now
	}
	ttl := h.TTL
	if ttl <= 0 {
		ttl = HostRefresh
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t := now(); h.set == nil || t.Sub(h.read) >= ttl || t.Before(h.read) {
		h.read = t
		if set, err := h.load(); err == nil || h.set == nil {
			h.set = set
		}
	}
	return h.set[a]
}

func (h *Host) load() (map[netip.Addr]bool, error) {
	list := net.InterfaceAddrs
	if h.List != nil {
		list = h.List
	}
	addrs, err := list()
	set := make(map[netip.Addr]bool, len(addrs))
	for _, n := range addrs {
		var ip net.IP
		switch v := n.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			set[a.Unmap().WithZone("")] = true
		}
	}
	return set, err
}

// Check refuses a blocked address with a *BlockedError.
func Check(a netip.Addr) error { return check(Blocked, a) }

func check(rule func(netip.Addr) string, a netip.Addr) error {
	if r := rule(a); r != "" {
		return &BlockedError{Addr: a.Unmap().WithZone(""), Reason: r}
	}
	return nil
}

// Control is a net.Dialer Control hook: it runs after resolution, for
// every address the dialer tries, and refuses blocked ones before the
// connection is made.
func Control(network, address string, c syscall.RawConn) error {
	return ControlFor(Blocked)(network, address, c)
}

// ControlFor is Control with another rule (Metadata, say): the hook of a
// dialer that refuses what rule refuses.
func ControlFor(rule func(netip.Addr) string) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("netguard: dial address %q: %w", address, ErrBlocked)
		}
		return check(rule, ap.Addr())
	}
}

// Transport returns a transport for calls to addresses a less trusted user
// chose: Guarded with the Blocked rule.
func Transport(base http.RoundTripper) *http.Transport {
	return Guarded(base, Blocked)
}

// Guarded returns a transport that dials only addresses rule allows:
// base's settings (http.DefaultTransport's when base is nil or not an
// *http.Transport) with a dialer that refuses the others, no proxy (a
// proxy would dial the target on our behalf, out of the hook's sight) and
// no kept-alive connections (a transport made per use must not leave idle
// connections behind; one kept for the process may turn them back on).
func Guarded(base http.RoundTripper, rule func(netip.Addr) string) *http.Transport {
	return transport(base, ControlFor(rule))
}

// Watched is Guarded that also calls seen with each address dialled and
// allowed, so a caller can decide afterwards how much of a failure to show
// (a probe of the console's own machine must not tell closed ports from
// open ones). A nil rule allows every address.
func Watched(base http.RoundTripper, rule func(netip.Addr) string, seen func(netip.Addr)) *http.Transport {
	return transport(base, func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			if rule != nil {
				return fmt.Errorf("netguard: dial address %q: %w", address, ErrBlocked)
			}
			return nil
		}
		if rule != nil {
			if err := check(rule, ap.Addr()); err != nil {
				return err
			}
		}
		seen(ap.Addr().Unmap().WithZone(""))
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
