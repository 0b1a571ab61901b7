package agentd

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// upstreamDNS is where agentd resolves: the resolver given with
// --egress-dns, or the host's (its resolv.conf, read at first use). The
// session's resolver forwards the names it may answer there, and the
// proxy resolves the names it dials there, so both see the same answers.
type upstreamDNS struct {
	fixed string // host:port from --egress-dns; "" for the host's

	once    sync.Once
	servers []string
	client  *dns.Client

	mu    sync.Mutex
	cache map[string]cachedAddrs
}

// cachedAddrs is a name's addresses until their time to live ends.
type cachedAddrs struct {
	addrs   []netip.Addr
	expires time.Time
}

// Bounds of the proxy's cache of resolved names: no answer is kept longer
// than maxCacheTTL (or its own TTL), and at most maxCachedNames at once.
const (
	maxCacheTTL    = 30 * time.Second
	maxCachedNames = 4096
)

// egressDNSTimeout bounds one upstream query.
const egressDNSTimeout = 5 * time.Second

func newUpstreamDNS(addr string) *upstreamDNS {
	return &upstreamDNS{fixed: addr}
}

func (u *upstreamDNS) init() {
	u.once.Do(func() {
		u.client = &dns.Client{Timeout: egressDNSTimeout}
		if u.fixed != "" {
			u.servers = []string{u.fixed}
			return
		}
		cfg, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil || len(cfg.Servers) == 0 {
			u.servers = []string{"127.0.0.1:53"}
			return
		}
		for _, s := range cfg.Servers {
			u.servers = append(u.servers, net.JoinHostPort(s, cfg.Port))
		}
	})
}

// exchange asks the upstream servers, in order, until one answers.
func (u *upstreamDNS) exchange(ctx context.Context, m *dns.Msg, network string) (*dns.Msg, error) {
	u.init()
	c := u.client
	if network == "tcp" {
		c = &dns.Client{Net: "tcp", Timeout: egressDNSTimeout}
	}
	var last error
	for _, s := range u.servers {
		r, _, err := c.ExchangeContext(ctx, m, s)
		if err == nil && r != nil && r.Truncated && network != "tcp" {
			r, _, err = (&dns.Client{Net: "tcp", Timeout: egressDNSTimeout}).ExchangeContext(ctx, m, s)
		}
		if err == nil {
			return r, nil
		}
		last = err
	}
	return nil, last
}

// lookup resolves name to its addresses (IPv4 first), as the proxy dials
// them, from the cache while the answer's time to live lasts.
func (u *upstreamDNS) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	now := time.Now()
	u.mu.Lock()
	c, ok := u.cache[name]
	u.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.addrs, nil
	}
	addrs, ttl, err := u.resolve(ctx, name)
	if err == nil && ttl > 0 {
		u.mu.Lock()
		if u.cache == nil || len(u.cache) >= maxCachedNames {
			u.cache = map[string]cachedAddrs{}
		}
		u.cache[name] = cachedAddrs{addrs: addrs, expires: now.Add(min(ttl, maxCacheTTL))}
		u.mu.Unlock()
	}
	return addrs, err
}

// resolve asks the upstream for name's A and AAAA records at once and
// returns the addresses with the shortest time to live among them.
func (u *upstreamDNS) resolve(ctx context.Context, name string) ([]netip.Addr, time.Duration, error) {
	type answer struct {
		addrs []netip.Addr
		ttl   time.Duration
		err   error
	}
	ask := func(qtype uint16, out chan<- answer) {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		m.RecursionDesired = true
		r, err := u.exchange(ctx, m, "udp")
		if err != nil {
			out <- answer{err: err}
			return
		}
		if r.Rcode != dns.RcodeSuccess {
			out <- answer{err: errors.New("the name does not resolve (" + dns.RcodeToString[r.Rcode] + ")")}
			return
		}
		ttl := maxCacheTTL
		for _, rr := range r.Answer {
			ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
		}
		out <- answer{addrs: answerAddrs(r), ttl: ttl}
	}
	v4, v6 := make(chan answer, 1), make(chan answer, 1)
	go ask(dns.TypeA, v4)
	go ask(dns.TypeAAAA, v6)
	a4, a6 := <-v4, <-v6
	addrs := append(a4.addrs, a6.addrs...)
	if len(addrs) == 0 {
		if a4.err != nil {
			return nil, 0, a4.err
		}
		return nil, 0, errors.New("the name has no addresses")
	}
	ttl := a4.ttl
	if a6.err == nil && len(a6.addrs) > 0 {
		ttl = min(ttl, a6.ttl)
	}
	return addrs, ttl, nil
}

// answerAddrs lists the A and AAAA records of an answer.
func answerAddrs(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		var ip net.IP
		switch v := rr.(type) {
		case *dns.A:
			ip = v.A
		case *dns.AAAA:
			ip = v.AAAA
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// serveDNS answers the session's queries on its namespace's resolver
// address, over UDP and TCP.
func (e *sessionEgress) serveDNS() {
	h := dns.HandlerFunc(e.answerDNS)
	servers := []*dns.Server{{PacketConn: e.dnsUDP, Handler: h}, {Listener: e.dnsTCP, Handler: h}}
	for _, srv := range servers {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			_ = srv.ActivateAndServe()
		}()
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		<-e.ctx.Done()
		for _, srv := range servers {
			_ = srv.Shutdown()
		}
	}()
}

// answerDNS answers one query: REFUSED for a name no rule could allow
// (so a query cannot carry data out), otherwise what the upstream answers,
// with the name's addresses replaced by one synthetic address of the
// session's (see sessionEgress.synthetic). The session has no IPv6 route,
// so AAAA questions get an empty answer.
func (e *sessionEgress) answerDNS(w dns.ResponseWriter, q *dns.Msg) {
	resp := new(dns.Msg)
	if len(q.Question) != 1 || q.Opcode != dns.OpcodeQuery {
		w.WriteMsg(resp.SetRcode(q, dns.RcodeRefused))
		return
	}
	question := q.Question[0]
	name := strings.TrimSuffix(strings.ToLower(question.Name), ".")
	pol := e.policy.load()
	if !pol.Policy.MayResolve(name) {
		e.record(NetRecord{Type: NetRecordDNS, Time: time.Now().UTC(), Name: name, QType: dns.TypeToString[question.Qtype],
			Decision: NetDeny, Action: NetDeny, Rule: -1, PolicyVersion: pol.Version,
			Reason: "no allow or ask rule could match the name, so it is not resolved"})
		w.WriteMsg(resp.SetRcode(q, dns.RcodeRefused))
		return
	}
	if question.Qtype == dns.TypeAAAA {
		w.WriteMsg(resp.SetReply(q))
		return
	}
	network := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		network = "tcp"
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*egressDNSTimeout)
	defer cancel()
	fwd := q.Copy()
	fwd.Id = dns.Id()
	r, err := e.svc.names.exchange(ctx, fwd, network)
	if err != nil {
		w.WriteMsg(resp.SetRcode(q, dns.RcodeServerFailure))
		return
	}
	r.Id = q.Id
	if question.Qtype == dns.TypeA && r.Rcode == dns.RcodeSuccess && len(answerAddrs(r)) > 0 {
		resp.SetReply(q)
		resp.Answer = []dns.RR{&dns.A{
			Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: syntheticTTL},
			A:   e.synthetic(name).AsSlice(),
		}}
		w.WriteMsg(resp)
		return
	}
	w.WriteMsg(r)
}

// syntheticTTL is the time to live of a synthetic answer: short, so a
// session asks again (and a policy change is seen) soon.
const syntheticTTL = 30
