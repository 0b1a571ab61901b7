//go:build !linux

package agentd

import (
	"errors"
	"net"
	"net/netip"
)

// egressPlace exists on Linux only (see egress_linux.go): elsewhere no
// session is confined, and its commands start as agentd's.
type egressPlace struct {
	netns       int
	connectPort int
}

func (p *egressPlace) run(fn func() error) error { return fn() }

func (p *egressPlace) close() {}

var errEgressLinuxOnly = errors.New("network namespaces and Landlock are Linux's")

func openNetns() (*netnsSlot, error) { return nil, errEgressLinuxOnly }

func detectEgress(setting string) (mode, reason string) {
	if setting == EgressOff {
		return EgressEnforcementUnavailable, "turned off (--egress off)"
	}
	return EgressEnforcementUnavailable, "sessions can be confined only on Linux; the proxy variables point to agentd's proxy, which programs may ignore"
}

func originalDst(net.Conn) (netip.AddrPort, bool) { return netip.AddrPort{}, false }

func (e *sessionEgress) peerOf(net.Conn, netip.AddrPort) (int, string) { return 0, "" }

// sockDiag is Linux's (see egress_linux.go).
type sockDiag struct{}

func (*sockDiag) close() {}
