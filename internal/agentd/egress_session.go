package agentd

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// egressService is the server's side of egress: how sessions are
// confined here (decided once, at first need), where names are resolved,
// and who decides what an ask rule holds.
type egressService struct {
	setting string // Config.Egress
	logger  *slog.Logger
	holds   egressHolds
	names   *upstreamDNS
	roots   *x509.CertPool // for re-originated TLS; nil: the system's

	once sync.Once
	mode string
	why  string

	// pool holds namespaces made ahead (see takeNetns); filling says one
	// is being made; closed stops making them.
	pool    chan *netnsSlot
	filling atomic.Bool
	closed  atomic.Bool
}

// netnsPool is how many session namespaces agentd keeps made ahead, once
// a session has asked for one: making one takes milliseconds, and
// hundreds while the kernel is tearing others down.
const netnsPool = 2

// netnsSlot is a session namespace with the sockets agentd serves in it.
type netnsSlot struct {
	place  *egressPlace
	proxy  net.Listener
	dnsTCP net.Listener
	dnsUDP net.PacketConn
}

func (n *netnsSlot) close() {
	n.proxy.Close()
	n.dnsTCP.Close()
	n.dnsUDP.Close()
	n.place.close()
}

// takeNetns hands out a namespace made ahead, or makes one, and has the
// pool refilled in the background.
func (s *egressService) takeNetns() (*netnsSlot, error) {
	defer s.refill()
	select {
	case n := <-s.pool:
		return n, nil
	default:
		return openNetns()
	}
}

// refill makes namespaces until the pool is full (one goroutine at a
// time), unless the server is closing.
func (s *egressService) refill() {
	if s.closed.Load() || !s.filling.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.filling.Store(false)
		for !s.closed.Load() && len(s.pool) < cap(s.pool) {
			n, err := openNetns()
			if err != nil {
				s.logger.Warn("make a session network namespace ahead", "error", err)
				return
			}
			select {
			case s.pool <- n:
			default:
				n.close()
			}
		}
		if s.closed.Load() {
			s.drainPool()
		}
	}()
}

func (s *egressService) drainPool() {
	for {
		select {
		case n := <-s.pool:
			n.close()
		default:
			return
		}
	}
}

// close releases the namespaces made ahead.
func (s *egressService) close() {
	s.closed.Store(true)
	s.drainPool()
}

func newEgressService(cfg *Config) *egressService {
	return &egressService{
		setting: cfg.Egress,
		logger:  cfg.Logger,
		holds:   denyingHolds{logger: cfg.Logger},
		names:   newUpstreamDNS(cfg.EgressDNS),
		roots:   cfg.EgressRootCAs,
		pool:    make(chan *netnsSlot, netnsPool),
	}
}

// enforcement reports how sessions with a network policy are confined
// (Health.EgressEnforcement) and, unless in a namespace, what is missing.
func (s *egressService) enforcement() (mode, reason string) {
	s.once.Do(func() { s.mode, s.why = detectEgress(s.setting) })
	return s.mode, s.why
}

// egressConnGrace bounds how long a session's end waits for its open
// connections to finish (and their records to be written) before it
// closes them.
const egressConnGrace = time.Second

// maxPendingNet bounds the records kept for a session not yet attached.
const maxPendingNet = 1024

// sessionEgress is one session's confinement: its policy, its proxy and
// resolver, and where their records go.
type sessionEgress struct {
	svc    *egressService
	mode   string
	policy policyHolder
	place  *egressPlace
	env    []string // added to the command's environment
	// proxy (and, in a namespace, the resolver's sockets) are the
	// session's listeners; the proxy's address is what the proxy
	// variables name outside a namespace.
	proxy  net.Listener
	dnsTCP net.Listener
	dnsUDP net.PacketConn
	ca     *egressCA // nil unless a rule inspects
	caDir  string
	diag   sockDiag // finds the sockets of connections' clients

	ctx      context.Context // ends with the session
	attached chan struct{}   // closed once the session is known
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the listeners' loops

	mu      sync.Mutex
	sess    *session
	pending []NetRecord
	lost    int
	drained bool
	conns   map[net.Conn]struct{}
	connsWG sync.WaitGroup
	// names and addrs map the synthetic addresses the resolver answered
	// to their names and back; next is the last one given.
	names map[netip.Addr]string
	addrs map[string]netip.Addr
	next  uint32
}

// syntheticNet is where a session's resolver takes the addresses it
// answers with (RFC 2544's benchmarking range, which no network routes):
// the session sees one address per name, never the real ones, and a
// connection to one is known by its name even when it carries none (SSH,
// a server speaking first). Each session's namespace has the whole range
// to itself; past its 131,070 addresses the oldest are given again.
var syntheticNet = netip.MustParsePrefix("198.18.0.0/15")

const syntheticCount = 1<<17 - 2

// forSession prepares the confinement of a session about to start with
// np (nil, nil without a policy): its namespace or Landlock rule, its
// proxy and resolver, and the environment the command gets.
func (s *egressService) forSession(np *NetworkPolicy) (*sessionEgress, error) {
	if np == nil {
		return nil, nil
	}
	if err := np.check(); err != nil {
		return nil, err
	}
	mode, why := s.enforcement()
	if np.Policy.RequireEnforcement && mode == EgressEnforcementUnavailable {
		return nil, newError(CodeEgressUnenforceable, "The network policy requires enforcement, which this agentd cannot provide: %s", why)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &sessionEgress{svc: s, mode: mode, ctx: ctx, cancel: cancel, attached: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, names: map[netip.Addr]string{}, addrs: map[string]netip.Addr{}}
	e.policy.store(np)
	if err := e.open(); err != nil {
		e.close()
		s.logger.Error("set up a session's egress", "mode", mode, "error", err)
		return nil, newError(CodeEgressUnenforceable, "The session's network confinement could not be set up.")
	}
	return e, nil
}

// open sets up the mode's listeners and the session's environment.
func (e *sessionEgress) open() error {
	var err error
	if e.mode == EgressEnforcementNetns {
		n, err := e.svc.takeNetns()
		if err != nil {
			return err
		}
		e.place, e.proxy, e.dnsTCP, e.dnsUDP = n.place, n.proxy, n.dnsTCP, n.dnsUDP
	} else {
		if e.proxy, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return err
		}
		proxyURL := "http://" + e.proxy.Addr().String()
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
			e.env = append(e.env, k+"="+proxyURL)
		}
		e.env = append(e.env, "NO_PROXY=", "no_proxy=")
		if e.mode == EgressEnforcementLandlock {
			e.place = &egressPlace{netns: -1, connectPort: e.proxy.Addr().(*net.TCPAddr).Port}
		}
	}
	if e.policy.load().inspects() {
		if err := e.openCA(); err != nil {
			return err
		}
	}
	e.serve()
	return nil
}

// serve starts the proxy's and the resolver's loops.
func (e *sessionEgress) serve() {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.serveProxy(e.proxy)
	}()
	if e.dnsUDP != nil {
		e.serveDNS()
	}
}

// placeOf is where the session's first process starts (nil: as agentd).
func (e *sessionEgress) placeOf() *egressPlace {
	if e == nil {
		return nil
	}
	return e.place
}

// attach sends the records to sess from now on, with those made before.
func (e *sessionEgress) attach(sess *session) {
	if e == nil {
		return
	}
	sess.egress = e
	e.mu.Lock()
	e.sess = sess
	pending := e.pending
	e.pending = nil
	e.mu.Unlock()
	close(e.attached)
	for _, r := range pending {
		sess.appendNet(r)
	}
}

// record hands r to the session's output (or keeps it until attach).
func (e *sessionEgress) record(r NetRecord) {
	e.mu.Lock()
	sess, drained := e.sess, e.drained
	if sess == nil && !drained {
		if len(e.pending) < maxPendingNet {
			e.pending = append(e.pending, r)
		}
	}
	e.mu.Unlock()
	if sess != nil && !drained {
		sess.appendNet(r)
	}
}

// track registers a proxied connection, refusing it once the session is
// ending.
func (e *sessionEgress) track(c net.Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.drained {
		return false
	}
	e.conns[c] = struct{}{}
	e.connsWG.Add(1)
	return true
}

func (e *sessionEgress) untrack(c net.Conn) {
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
	e.connsWG.Done()
}

// drain ends the session's egress before its state turns final: no new
// connections, the open ones get egressConnGrace to finish (a command's
// last connection usually is closing already), then are closed, so every
// record is in the output before the end.
func (e *sessionEgress) drain() {
	if e == nil {
		return
	}
	e.closeListeners()
	done := make(chan struct{})
	go func() {
		e.connsWG.Wait()
		close(done)
	}()
	t := time.NewTimer(egressConnGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		e.mu.Lock()
		for c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		<-done
	}
	e.mu.Lock()
	e.drained = true
	e.mu.Unlock()
}

func (e *sessionEgress) closeListeners() {
	e.cancel()
	for _, l := range []net.Listener{e.proxy, e.dnsTCP} {
		if l != nil {
			l.Close()
		}
	}
	if e.dnsUDP != nil {
		e.dnsUDP.Close()
	}
	e.wg.Wait()
}

// close releases what the session's egress holds; safe on a session that
// never started.
func (e *sessionEgress) close() {
	if e == nil {
		return
	}
	e.closeListeners()
	e.mu.Lock()
	for c := range e.conns {
		c.Close()
	}
	e.drained = true
	e.mu.Unlock()
	e.diag.close()
	e.place.close()
	if e.caDir != "" {
		os.RemoveAll(e.caDir)
	}
}

// synthetic is the session's address for name, given on first use.
func (e *sessionEgress) synthetic(name string) netip.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.addrs[name]; ok {
		return a
	}
	e.next = e.next%syntheticCount + 1
	base := syntheticNet.Addr().As4()
	n := binary.BigEndian.Uint32(base[:]) + e.next
	a := netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, n)))
	if old, ok := e.names[a]; ok {
		delete(e.addrs, old)
	}
	e.names[a], e.addrs[name] = name, a
	return a
}

// nameOf is the name the session's resolver gave a for ("" for none).
func (e *sessionEgress) nameOf(a netip.Addr) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.names[a.Unmap()]
}

// replacePolicy makes np the session's policy for new connections and
// names, unless it is older than the one in force; it returns the version
// in force.
func (e *sessionEgress) replacePolicy(np *NetworkPolicy) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.policy.load(); np.Version < cur.Version {
		return cur.Version
	}
	e.policy.store(np)
	return np.Version
}

// appendNet adds a net record to the output, without waiting, as
// appendExec does for exec records.
func (s *session) appendNet(r NetRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lost := &s.egress.lost
	if s.ring.blocking && s.ring.bytes > 2*s.ring.max {
		*lost++
		return
	}
	var data []byte
	if *lost > 0 {
		data = appendNetRecord(data, NetRecord{Type: NetRecordLost, Time: r.Time, Count: *lost, Rule: -1})
		*lost = 0
	}
	s.ring.addRecords(streamNet, appendNetRecord(data, r))
	s.wakeLocked()
}

func durationMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func fmtAddr(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.Unmap().String()
}

// environ is what the session's command gets added to its environment.
func (e *sessionEgress) environ() []string {
	if e == nil {
		return nil
	}
	return e.env
}
