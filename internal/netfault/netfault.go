// Package netfault holds the loopback TCP plumbing that fault tests and
// the chaos run put between the parts of a deployment: a forwarder that
// can be cut (every live connection closed, new ones refused), pointed
// elsewhere, or made to answer new connections as a Postgres server
// refusing them (an ErrorResponse with a chosen SQLSTATE), and a
// round-robin balancer over console replicas that skips a
// backend that refuses connections. Both run in the test's (or the bench
// command's) process, so the parts behind them are real processes on real
// sockets.
package netfault

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// dialTimeout bounds one connection attempt to a target.
const dialTimeout = 5 * time.Second

// Forwarder is a loopback TCP forwarder in front of one target. Cut stops
// "the network" to the target for everyone who goes through it, without
// stopping the target itself (which other users may share).
type Forwarder struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	cut    bool
	// refusal, when set, is the Postgres error every new connection is
	// answered with instead of being forwarded.
	refusal *PGError
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// NewForwarder listens on a loopback port and forwards every connection to
// target (host:port).
func NewForwarder(target string) (*Forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	f := &Forwarder{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Reroute puts a forwarder in front of the host of the URL rawURL (a
// database DSN or an HTTP base URL) and returns it with the URL rewritten
// to go through it.
func Reroute(rawURL string) (*Forwarder, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, "", fmt.Errorf("netfault: %q is not a URL with a host to reroute", rawURL)
	}
	f, err := NewForwarder(u.Host)
	if err != nil {
		return nil, "", err
	}
	u.Host = f.Addr()
	return f, u.String(), nil
}

// Addr is the forwarder's own address (host:port).
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

func (f *Forwarder) accept() {
	defer f.wg.Done()
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		cut, target, refusal := f.cut, f.target, f.refusal
		f.mu.Unlock()
		if cut {
			in.Close()
			continue
		}
		if refusal != nil {
			if !f.track(in) {
				continue
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				refusal.answer(in)
				f.mu.Lock()
				delete(f.conns, in)
				f.mu.Unlock()
			}()
			continue
		}
		out, err := net.DialTimeout("tcp", target, dialTimeout)
		if err != nil {
			in.Close()
			continue
		}
		if !f.track(in, out) {
			continue
		}
		f.wg.Add(2)
		go f.pipe(in, out)
		go f.pipe(out, in)
	}
}

// track registers a live pair, unless a cut came in between.
func (f *Forwarder) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut || f.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *Forwarder) pipe(dst, src net.Conn) {
	defer f.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	f.mu.Lock()
	delete(f.conns, dst)
	delete(f.conns, src)
	f.mu.Unlock()
}

// Cut closes every live connection and refuses new ones until Restore.
func (f *Forwarder) Cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = true
	for c := range f.conns {
		c.Close()
	}
}

// Restore lets connections through again.
func (f *Forwarder) Restore() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = false
	f.refusal = nil
}

// Refuse closes every live connection and answers each new one as a
// Postgres server refusing it would: the startup message is read and
// answered with e (an ErrorResponse), then the connection is closed. It
// stands in for server states a test cannot put a shared server in
// (starting up, too many connections). Restore ends it.
func (f *Forwarder) Refuse(e PGError) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refusal = &e
	for c := range f.conns {
		c.Close()
	}
}

// SetTarget sends new connections to target; live ones stay where they
// are (a restarted process on a new port is reached without its clients
// changing their address).
func (f *Forwarder) SetTarget(target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target = target
}

// Close stops listening, closes every connection and waits for the
// forwarder's goroutines.
func (f *Forwarder) Close() error {
	err := f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return err
}

// Balancer spreads connections over backends round-robin. A backend that
// refuses the connection (a killed replica) is skipped for the next one,
// so clients see a refusal only when every backend refuses.
type Balancer struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint64
	// Accepted counts connections handed to a backend; Skipped the
	// backends that refused one (and were passed over).
	Accepted, Skipped atomic.Int64

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewBalancer listens on a loopback port in front of backends (host:port).
func NewBalancer(backends []string) (*Balancer, error) {
	if len(backends) == 0 {
		return nil, errors.New("netfault: a balancer needs at least one backend")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	b := &Balancer{ln: ln, backends: append([]string(nil), backends...), conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.accept()
	return b, nil
}

// Addr is the balancer's own address (host:port).
func (b *Balancer) Addr() string { return b.ln.Addr().String() }

func (b *Balancer) accept() {
	defer b.wg.Done()
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.wg.Add(1)
		go b.serve(in)
	}
}

// serve connects in to the next backend that accepts; dialing happens off
// the accept loop, so one slow backend does not hold up the others.
func (b *Balancer) serve(in net.Conn) {
	defer b.wg.Done()
	start := b.next.Add(1)
	for i := range uint64(len(b.backends)) {
		target := b.backends[(start+i)%uint64(len(b.backends))]
		out, err := net.DialTimeout("tcp", target, dialTimeout)
		if err != nil {
			b.Skipped.Add(1)
			continue
		}
		if !b.track(in, out) {
			return
		}
		b.Accepted.Add(1)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.pipe(out, in)
		}()
		b.pipe(in, out)
		return
	}
	in.Close()
}

func (b *Balancer) track(conns ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		b.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, then closes both.
func (b *Balancer) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	b.mu.Lock()
	delete(b.conns, dst)
	delete(b.conns, src)
	b.mu.Unlock()
}

// Close stops listening, closes every connection and waits.
func (b *Balancer) Close() error {
	err := b.ln.Close()
	b.mu.Lock()
	b.closed = true
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
	return err
}
