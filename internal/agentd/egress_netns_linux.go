//go:build linux

package agentd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A session's network namespace holds loopback and a veth pair whose both
// ends stay inside it: egressLink carries egressAddr and the default route,
// and its peer has no address, so whatever is routed out of it is dropped
// there. Nothing in the namespace leads anywhere else: the only ways out
// are the proxy's and the resolver's sockets, which agentd opened inside
// it and serves from its own namespace. nftables rules steer every TCP
// connection that does not stay on loopback to the proxy and every DNS
// query, to any address, to the resolver; everything else that would
// leave loopback is dropped.
const (
	egressLink     = "egress0"
	egressPeer     = "egress1"
	egressProxyNS  = 15001 // the proxy's port on egressAddr
	egressDNSPort  = 53
	egressTable    = "agentd_egress"
	nfOriginalDst  = 80 // SO_ORIGINAL_DST
	egressNSFDName = "netns"
)

// newSessionNetns creates and sets up a network namespace for one
// session and returns a descriptor of it.
func newSessionNetns() (int, error) {
	fd, err := onThread(-1, func() (int, error) {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return -1, fmt.Errorf("unshare the network namespace: %w", err)
		}
		return unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return -1, err
	}
	if err := setupNetns(fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// onThread runs fn on an OS thread of its own, first moved into the
// network namespace nsfd (unless negative), and lets the thread end with
// it: a thread whose namespace was changed must never run other
// goroutines.
func onThread[T any](nsfd int, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if nsfd >= 0 {
			if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
				var zero T
				done <- result{zero, fmt.Errorf("enter the session's network namespace: %w", err)}
				return
			}
		}
		v, err := fn()
		done <- result{v, err}
	}()
	r := <-done
	return r.v, r.err
}

// setupNetns brings up loopback and the black-hole route and writes the
// steering rules.
func setupNetns(fd int) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(fd), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in the session's namespace: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find loopback: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring loopback up: %w", err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: egressLink}, PeerName: egressPeer}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add the namespace's link: %w", err)
	}
	for _, name := range []string{egressLink, egressPeer} {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			return fmt.Errorf("bring %s up: %w", name, err)
		}
	}
	link, err := h.LinkByName(egressLink)
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: egressAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := h.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address the namespace's link: %w", err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("route the namespace's traffic: %w", err)
	}
	return writeEgressRules(fd)
}

// writeEgressRules writes the namespace's nftables rules in one batch:
//
//	table ip agentd_egress
//	  chain steer { type nat hook output priority -100
//	    udp dport 53 dnat to 192.0.0.8:53
//	    tcp dport 53 dnat to 192.0.0.8:53
//	    ip daddr 127.0.0.0/8 accept
//	    meta l4proto tcp dnat to 192.0.0.8:15001 }
//	  chain guard { type filter hook output priority 0
//	    oifname "lo" accept; ip daddr 192.0.0.8 accept; drop }
//	table ip6 agentd_egress
//	  chain guard { type filter hook output priority 0
//	    oifname "lo" accept; drop }
func writeEgressRules(fd int) error {
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		return err
	}
	t4 := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: egressTable})
	steer := c.AddChain(&nftables.Chain{Name: "steer", Table: t4, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t4, Chain: steer, Exprs: append(
			append(l4proto(proto), dport(egressDNSPort)...), dnatTo(egressDNSPort)...)})
	}
	c.AddRule(&nftables.Rule{Table: t4, Chain: steer, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{127, 0, 0, 0}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t4, Chain: steer, Exprs: append(l4proto(unix.IPPROTO_TCP), dnatTo(egressProxyNS)...)})
	t6 := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv6, Name: egressTable})
	for _, t := range []*nftables.Table{t4, t6} {
		drop := nftables.ChainPolicyDrop
		guard := c.AddChain(&nftables.Chain{Name: "guard", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
		c.AddRule(&nftables.Rule{Table: t, Chain: guard, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
		if t == t4 {
			// The output hook's device is the one routed to before the
			// steering rules changed the destination: what they steered
			// is told by its new destination.
			a := egressAddr.As4()
			c.AddRule(&nftables.Rule{Table: t, Chain: guard, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
				&expr.Verdict{Kind: expr.VerdictAccept},
			}})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write the namespace's nftables rules: %w", err)
	}
	return nil
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

func dnatTo(port uint16) []expr.Any {
	a := egressAddr.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// listenInNetns opens the proxy's and the resolver's sockets inside the
// namespace nsfd.
func listenInNetns(nsfd int) (proxy net.Listener, dnsTCP net.Listener, dnsUDP net.PacketConn, err error) {
	type socks struct {
		proxy, dnsTCP net.Listener
		dnsUDP        net.PacketConn
	}
	s, err := onThread(nsfd, func() (socks, error) {
		var s socks
		var err error
		closeAll := func() {
			for _, c := range []interface{ Close() error }{s.proxy, s.dnsTCP} {
				if c != nil && !isNilListener(c) {
					c.Close()
				}
			}
		}
		if s.proxy, err = net.Listen("tcp4", netip.AddrPortFrom(egressAddr, egressProxyNS).String()); err != nil {
			return s, err
		}
		if s.dnsTCP, err = net.Listen("tcp4", netip.AddrPortFrom(egressAddr, egressDNSPort).String()); err != nil {
			closeAll()
			return s, err
		}
		if s.dnsUDP, err = net.ListenPacket("udp4", netip.AddrPortFrom(egressAddr, egressDNSPort).String()); err != nil {
			closeAll()
			return s, err
		}
		return s, nil
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listen in the session's namespace: %w", err)
	}
	return s.proxy, s.dnsTCP, s.dnsUDP, nil
}

func isNilListener(c interface{ Close() error }) bool {
	l, ok := c.(net.Listener)
	return ok && l == nil
}

// originalDst is where a connection the namespace's rules steered to the
// proxy was going.
func originalDst(c net.Conn) (netip.AddrPort, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, false
	}
	var sa unix.RawSockaddrInet4
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(sa))
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, nfOriginalDst,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size)), 0)
	}); err != nil || errno != 0 {
		return netip.AddrPort{}, false
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), true
}

// errNotRoot says why agentd cannot make namespaces.
var errNotRoot = errors.New("agentd does not run as root (network namespaces and nftables need CAP_SYS_ADMIN and CAP_NET_ADMIN)")

// probeNetns reports whether sessions can have network namespaces here:
// it makes one, with its rules, and drops it.
func probeNetns() error {
	if os.Geteuid() != 0 {
		return errNotRoot
	}
	fd, err := newSessionNetns()
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}
