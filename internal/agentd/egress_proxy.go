package agentd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// The proxy takes every TCP connection a session makes (in a namespace,
// steered there by its rules; otherwise as the session's HTTP proxy),
// learns where it is going (TLS SNI, the HTTP Host, a CONNECT target or an
// absolute URL, else the name the session's resolver answered for the
// address), decides with the session's policy and, when allowed, dials
// the name itself: the address the client chose is never used unless the
// connection names nothing and a rule names that address.
const (
	// egressSniffWait is how long the proxy waits for a client's first
	// bytes before it treats the protocol as one where the server speaks
	// first (SMTP, SSH servers' banners), decided by address alone.
	egressSniffWait = time.Second
	// egressDialTimeout bounds the dial of one destination.
	egressDialTimeout = 10 * time.Second
	// egressPeekSize holds a whole TLS record (a ClientHello).
	egressPeekSize = 16<<10 + 5
)

// netConn is one connection the proxy took.
type netConn struct {
	e      *sessionEgress
	pol    *NetworkPolicy
	client net.Conn
	br     *bufio.Reader
	orig   netip.AddrPort // where the client aimed, in a namespace
	to     netip.AddrPort // where the client's socket is connected
	start  time.Time
	rec    NetRecord
	// peer receives who connected, looked up once the connection is set
	// up (its first bytes sent on, or its refusal decided), beside the
	// relay: on two busy cores the lookup's reads of /proc, run during
	// the set-up, made it several milliseconds slower. A client gone
	// before the lookup reads its descriptors is not named. gotPeer says
	// it was received.
	peer    chan peerInfo
	gotPeer bool
}

type peerInfo struct {
	pid     int
	program string
}

// serveProxy accepts connections until the listener closes.
func (e *sessionEgress) serveProxy(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		if !e.track(c) {
			c.Close()
			continue
		}
		go e.handleConn(c)
	}
}

func (e *sessionEgress) handleConn(c net.Conn) {
	defer e.untrack(c)
	defer c.Close()
	nc := &netConn{e: e, pol: e.policy.load(), client: c, start: time.Now()}
	nc.rec = NetRecord{Type: NetRecordConnect, Rule: -1, PolicyVersion: nc.pol.Version}
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		nc.to = ta.AddrPort()
	}
	if e.mode == EgressEnforcementNetns {
		if dst, ok := originalDst(c); ok {
			nc.to = dst
			if dst.Addr() != egressAddr {
				nc.orig = dst
			}
		}
	}
	br := peekReaders.Get().(*bufio.Reader)
	br.Reset(c)
	nc.br = br
	nc.serve()
	nc.finish()
	br.Reset(nil)
	peekReaders.Put(br)
}

// peekReaders keeps the proxy's 16 KiB peek buffers between connections.
var peekReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, egressPeekSize) }}

// lookupPeer starts finding who made the connection (once).
func (nc *netConn) lookupPeer() {
	if nc.peer != nil {
		return
	}
	nc.peer = make(chan peerInfo, 1)
	go func() {
		pid, prog := nc.e.peerOf(nc.client, nc.to)
		nc.peer <- peerInfo{pid, prog}
	}()
}

// awaitPeer puts who connected in the record, waiting at most wait.
func (nc *netConn) awaitPeer(wait time.Duration) {
	nc.lookupPeer()
	if nc.gotPeer {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case p := <-nc.peer:
		nc.rec.PID, nc.rec.Program, nc.gotPeer = p.pid, p.program, true
	case <-t.C:
	}
}

// serve tells the protocol by the client's first bytes and serves it.
func (nc *netConn) serve() {
	nc.client.SetReadDeadline(time.Now().Add(egressSniffWait))
	first, err := nc.br.Peek(1)
	nc.client.SetReadDeadline(time.Time{})
	switch {
	case err == nil && first[0] == 0x16:
		nc.serveTLS()
	case err == nil && looksLikeHTTP(nc.br):
		nc.serveHTTP()
	case err == nil || isTimeout(err):
		nc.serveRaw()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// looksLikeHTTP reports whether the buffered bytes start with an HTTP
// method and a space.
func looksLikeHTTP(br *bufio.Reader) bool {
	b, _ := br.Peek(min(br.Buffered(), 8))
	i := strings.IndexByte(string(b), ' ')
	if i <= 0 {
		return false
	}
	switch string(b[:i]) {
	case "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH":
		return true
	}
	return false
}

// serveTLS serves a TLS connection aimed at an address: decided by its
// SNI, relayed untouched, or terminated when a rule inspects it.
func (nc *netConn) serveTLS() {
	sni := peekSNI(nc.br)
	nc.rec.SNI = sni
	port := int(nc.orig.Port())
	if port == 0 {
		nc.deny("The connection names no destination the proxy can reach.")
		return
	}
	if nc.inspects(sni, port) {
		nc.inspect(nc.client, sni, port)
		return
	}
	up := nc.connect(sni, port, "", "")
	if up == nil {
		return
	}
	nc.relay(nc.client, up)
}

// serveRaw serves a connection that is neither TLS nor HTTP: decided by
// the name the session's resolver gave its address, or by the address.
func (nc *netConn) serveRaw() {
	if !nc.orig.IsValid() {
		nc.deny("The connection names no destination the proxy can reach.")
		return
	}
	up := nc.connect("", int(nc.orig.Port()), "", "")
	if up == nil {
		return
	}
	nc.relay(nc.client, up)
}

// inspects reports whether a rule marked inspect covers name:port.
func (nc *netConn) inspects(name string, port int) bool {
	return name != "" && nc.pol.inspects() && nc.pol.inspected(policy.Conn{Name: name, Port: port})
}

// connect decides a connection to name (or, without one, to the address
// the client aimed at) and dials it when allowed. It returns nil when the
// connection must end (denied, or failed), with the record saying why.
func (nc *netConn) connect(name string, port int, method, path string) net.Conn {
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		name, addrs = "", []netip.Addr{a.Unmap()}
	}
	if name == "" && len(addrs) == 0 && nc.orig.IsValid() {
		addrs = []netip.Addr{nc.orig.Addr().Unmap()}
	}
	if len(addrs) == 1 && syntheticNet.Contains(addrs[0]) {
		// An address the session's resolver made up stands for its name.
		if name = nc.e.nameOf(addrs[0]); name != "" {
			addrs = nil
		}
	}
	ctx, cancel := context.WithTimeout(nc.e.ctx, egressDialTimeout)
	defer cancel()
	var resolveErr error
	if name != "" && nc.pol.Policy.MayResolve(name) {
		// Only names a rule could allow are resolved: a name in an SNI
		// must not reach a DNS server any more than a query could.
		addrs, resolveErr = nc.e.svc.names.lookup(ctx, name)
	}
	c := policy.Conn{Name: name, Port: port, Method: method, Path: path}
	if len(addrs) > 0 {
		c.Addr = addrs[0]
	}
	nc.rec.Name, nc.rec.Port, nc.rec.Method, nc.rec.Path = name, port, method, path
	nc.rec.Addr = fmtAddr(c.Addr)
	d := nc.pol.Policy.DecideConn(c)
	// A hold lasts while the session does, not a dial's time.
	if !nc.allowed(nc.e.ctx, d) {
		return nil
	}
	ctx, cancel = context.WithTimeout(nc.e.ctx, egressDialTimeout)
	defer cancel()
	if resolveErr != nil {
		nc.rec.Error = "resolve " + name + ": " + resolveErr.Error()
		return nil
	}
	if len(addrs) == 0 {
		nc.deny("The connection names no destination the proxy can reach.")
		return nil
	}
	var refused string
	var lastErr error
	for _, a := range addrs {
		if why := nc.refusedAddr(name, a, port, method, path, d); why != "" {
			refused = why
			continue
		}
		up, err := (&net.Dialer{}).DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			nc.rec.Addr = fmtAddr(a)
			return up
		}
		lastErr = err
	}
	if lastErr == nil {
		nc.rec.Decision = NetDeny
		nc.rec.Reason = refused
		return nil
	}
	nc.rec.Error = "dial: " + lastErr.Error()
	return nil
}

// allowed records decision d and reports whether the connection may go
// on: allow, or an ask the hold allowed.
func (nc *netConn) allowed(ctx context.Context, d policy.Decision) bool {
	nc.rec.Action, nc.rec.Rule, nc.rec.Reason = string(d.Action), d.Rule, nc.pol.reason(d)
	ok := d.Action == policy.Allow
	if d.Action == policy.Ask {
		detail, _ := json.Marshal(nc.rec)
		ok = nc.e.svc.holds.Hold(ctx, nc.e.sessionID(), HoldNetConnect, string(detail))
	}
	nc.rec.Decision = NetDeny
	if ok {
		nc.rec.Decision = NetAllow
	}
	return ok
}

// refusedAddr says why a, one address of name, may not be dialled even
// though the policy allows the connection ("" when it may): metadata and
// link-local addresses never; private, loopback and this host's own
// addresses only when a rule for the port names the address or a prefix
// within its range (namesAddr) or the deciding rule names the name itself
// (not through a wildcard or the default); and no address a rule denies.
func (nc *netConn) refusedAddr(name string, a netip.Addr, port int, method, path string, d policy.Decision) string {
	if why := netguard.Metadata(a); why != "" {
		return fmt.Sprintf("%s resolves to %s, %s, which is never reachable.", orAddr(name, a), a, why)
	}
	if syntheticNet.Contains(a) {
		return fmt.Sprintf("%s is in %s, where the session's resolver makes up addresses, and stands for no name now.", a, syntheticNet)
	}
	if privateAddr(a) && !nc.pol.namesAddr(a, port) && !nc.pol.namesExactly(d.Rule, name) {
		return fmt.Sprintf("%s resolves to %s, a private or local address, which only a rule naming it (or naming %s itself) lets through.", orAddr(name, a), a, orAddr(name, a))
	}
	if nc.pol.Policy.DecideConn(policy.Conn{Name: name, Addr: a, Port: port, Method: method, Path: path}).Action == policy.Deny {
		return fmt.Sprintf("A rule denies %s.", a)
	}
	return ""
}

func orAddr(name string, a netip.Addr) string {
	if name != "" {
		return name
	}
	return a.String()
}

// cgnat is the shared address space (RFC 6598), private in practice.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// privateAddr reports addresses of this machine or of private networks.
func privateAddr(a netip.Addr) bool {
	return netguard.Blocked(a) != "" || a.IsPrivate() || cgnat.Contains(a)
}

// deny ends a connection the proxy cannot serve, with why.
func (nc *netConn) deny(why string) {
	nc.rec.Decision, nc.rec.Action = NetDeny, NetDeny
	if nc.rec.Reason == "" {
		nc.rec.Reason = why
	}
}

// relay copies both ways between the client (whose peeked bytes go
// first) and up until both sides are done, counting bytes.
func (nc *netConn) relay(client net.Conn, up net.Conn) {
	defer up.Close()
	if n := nc.br.Buffered(); n > 0 {
		b, _ := nc.br.Peek(n)
		w, err := up.Write(b)
		nc.rec.BytesOut += int64(w)
		if err != nil {
			return
		}
		nc.br.Discard(n)
	}
	nc.lookupPeer()
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(up, client)
		closeWrite(up)
		done <- n
	}()
	in, _ := io.Copy(client, up)
	closeWrite(client)
	nc.rec.BytesIn += in
	nc.rec.BytesOut += <-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// finish writes the connection's record.
func (nc *netConn) finish() {
	if nc.rec.Decision == "" {
		nc.deny("The connection ended before it named a destination.")
	}
	nc.awaitPeer(time.Second)
	nc.rec.Time = nc.start.UTC()
	nc.rec.DurationMS = durationMS(time.Since(nc.start))
	nc.e.record(nc.rec)
}

// splitHostPort splits host[:port], defaulting the port.
func splitHostPort(hostport string, def int) (string, int) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return strings.Trim(hostport, "[]"), def
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return host, def
	}
	return host, port
}

// sessionID names the session in holds.
func (e *sessionEgress) sessionID() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sess == nil {
		return ""
	}
	return e.sess.id
}
