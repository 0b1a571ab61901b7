package agentd

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// NetworkPolicy is the network egress policy a create carries (its
// network_policy field): the agent's rules, and the version the console
// gave them, which every net record of the session names.
type NetworkPolicy struct {
	Version int64          `json:"version"`
	Policy  policy.Network `json:"policy"`
}

// UnmarshalJSON decodes strictly: a field this agentd does not know, at
// any depth, is refused, since a rule it ignored would be a rule it does
// not enforce.
func (p *NetworkPolicy) UnmarshalJSON(b []byte) error {
	type plain NetworkPolicy
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var v plain
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*p = NetworkPolicy(v)
	return nil
}

// check refuses a policy agentd could not apply as written.
func (p *NetworkPolicy) check() error {
	if !p.Policy.Default.Valid() {
		return newError(CodeBadRequest, "The network policy's default must be allow, ask or deny.")
	}
	for i, r := range p.Policy.Rules {
		switch {
		case !r.Action.Valid():
			return newError(CodeBadRequest, "Network rule %d: the action must be allow, ask or deny.", i+1)
		case strings.TrimSpace(r.Host) == "":
			return newError(CodeBadRequest, "Network rule %d: the host is required.", i+1)
		}
		for _, port := range r.Ports {
			if port < 1 || port > 65535 {
				return newError(CodeBadRequest, "Network rule %d: the port %d is not between 1 and 65535.", i+1, port)
			}
		}
	}
	return nil
}

// inspects reports whether some rule terminates TLS.
func (p *NetworkPolicy) inspects() bool {
	for _, r := range p.Policy.Rules {
		if r.Inspect {
			return true
		}
	}
	return false
}

// ruleMatches reports whether rule i's host and ports match c, whatever
// its methods and paths (which only an inspected request shows), by
// asking the policy package about a policy of that rule alone.
func (p *NetworkPolicy) ruleMatches(i int, c policy.Conn) bool {
	r := p.Policy.Rules[i]
	r.Action, r.Methods, r.Paths = policy.Allow, nil, nil
	one := policy.Network{Default: policy.Deny, Rules: []policy.NetRule{r}}
	return one.DecideConn(c).Rule == 0
}

// inspected reports whether a connection to c is one whose TLS agentd
// terminates: a rule marked inspect matches it.
func (p *NetworkPolicy) inspected(c policy.Conn) bool {
	for i, r := range p.Policy.Rules {
		if r.Inspect && r.Action != policy.Deny && p.ruleMatches(i, c) {
			return true
		}
	}
	return false
}

// namesAddr reports whether an allow or ask rule names a on port by
// address or prefix: what lets a name reach a private or local address. The
// rule's ports must include port, and its address or prefix must lie
// within a's own range (addrScope): 127.0.0.0/8 names 127.0.0.1, but
// 0.0.0.0/0 or 10.0.0.0/8 do not name loopback, and only the exact address
// names one of this host's own, since the proxy dials from agentd's
// namespace and reaches the host's services there.
func (p *NetworkPolicy) namesAddr(a netip.Addr, port int) bool {
	a = a.Unmap().WithZone("")
	scope := addrScope(a)
	for _, r := range p.Policy.Rules {
		if r.Action == policy.Deny || len(r.Ports) > 0 && !slices.Contains(r.Ports, port) {
			continue
		}
		pfx, err := netip.ParsePrefix(r.Host)
		if err != nil {
			ra, err := netip.ParseAddr(r.Host)
			if err != nil {
				continue
			}
			ra = ra.Unmap().WithZone("")
			pfx = netip.PrefixFrom(ra, ra.BitLen())
		}
		pfx = pfx.Masked()
		if pfx.Contains(a) && pfx.Bits() >= scope.Bits() {
			return true
		}
	}
	return false
}

// localScopes are the ranges of addresses that are not the Internet's,
// narrowest first: a rule reaches an address in one only by naming an
// address or prefix inside it.
var localScopes = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("ff00::/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("fc00::/7"),
	cgnat,
}

// addrScope is the range a rule's address or prefix must lie within to
// name a private or local address a: the loopback, link-local, private
// (and so on) range holding it, or a alone when it is one of this host's
// own addresses (or otherwise refused by netguard outside those ranges).
// A public address has the whole Internet as its scope.
func addrScope(a netip.Addr) netip.Prefix {
	if !privateAddr(a) {
		return netip.PrefixFrom(a, 0)
	}
	if netguard.Blocked(a) != "" && !a.IsLoopback() && !a.IsUnspecified() && !a.IsLinkLocalUnicast() && !a.IsMulticast() && !(a.Is4() && localScopes[2].Contains(a)) {
		// One of this host's own addresses (any range), a NAT64 form of
		// a local one, or broadcast: only the address itself names it.
		return netip.PrefixFrom(a, a.BitLen())
	}
	for _, s := range localScopes {
		if s.Contains(a) {
			return s
		}
	}
	return netip.PrefixFrom(a, a.BitLen())
}

// namesExactly reports whether rule i names name itself (not a wildcard,
// not the default): such a rule may lead to a private address.
func (p *NetworkPolicy) namesExactly(i int, name string) bool {
	if i < 0 || i >= len(p.Policy.Rules) {
		return false
	}
	h := strings.TrimSuffix(strings.ToLower(p.Policy.Rules[i].Host), ".")
	return !strings.HasPrefix(h, "*.") && h == strings.TrimSuffix(strings.ToLower(name), ".")
}

// reason is the sentence a denial shows: the decision's, and the rule's
// own reason when it has one.
func (p *NetworkPolicy) reason(d policy.Decision) string {
	why := d.Why
	if d.Rule >= 0 && d.Rule < len(p.Policy.Rules) && p.Policy.Rules[d.Rule].Reason != "" {
		why += ": " + p.Policy.Rules[d.Rule].Reason
	}
	return why
}

// egressAddr is a session namespace's one address outside loopback
// (RFC 7600's IPv4 dummy address): its proxy and resolver listen there.
var egressAddr = netip.AddrFrom4([4]byte{192, 0, 0, 8})

// Egress enforcement of Health.EgressEnforcement.
const (
	// EgressEnforcementNetns: each session with a network policy has a
	// network namespace of its own whose only ways out are agentd's proxy
	// and resolver (agentd as root on Linux).
	EgressEnforcementNetns = "netns"
	// EgressEnforcementLandlock: Landlock lets the session's processes
	// connect over TCP only to agentd's proxy port; the proxy variables
	// point there. UDP and DNS are not confined.
	EgressEnforcementLandlock = "landlock"
	// EgressEnforcementUnavailable: nothing confines a session; the proxy
	// variables point to agentd's proxy, which programs may ignore.
	EgressEnforcementUnavailable = "unavailable"
)

// Egress settings of Config.Egress.
const (
	EgressAuto     = "auto"     // namespaces as root, else Landlock, else unavailable
	EgressNetns    = "netns"    // namespaces only
	EgressLandlock = "landlock" // Landlock only
	EgressOff      = "off"      // never enforce
)

// StreamNet is the stream of net records (see NetRecord): one per
// connection a session's processes made, and one per name its resolver
// refused. Only sessions whose create carried a network policy have it.
const StreamNet = "net"

// streamNet is StreamNet's number in the ring and the binary framing.
const streamNet uint8 = 4

// Net record types.
const (
	NetRecordConnect = "connect" // a TCP connection the proxy took
	NetRecordDNS     = "dns"     // a name the resolver refused
	NetRecordLost    = "lost"    // records agentd could not keep (Count)
)

// Decisions of NetRecord.Decision.
const (
	NetAllow = "allow"
	NetDeny  = "deny"
)

// NetRecord is one line of the net stream: JSON, one object per line.
type NetRecord struct {
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	// PID and Program name the process that connected, when agentd could
	// tell (its socket among the session's processes' descriptors).
	PID     int    `json:"pid,omitempty"`
	Program string `json:"program,omitempty"`
	// Name is the destination name decided on (TLS SNI, HTTP Host, a
	// CONNECT target, or the name the session's resolver answered for the
	// address); Addr and Port where the proxy connected (where the client
	// aimed when nothing was dialled).
	Name string `json:"name,omitempty"`
	Addr string `json:"addr,omitempty"`
	Port int    `json:"port,omitempty"`
	SNI  string `json:"sni,omitempty"`
	Host string `json:"host,omitempty"`
	// Method and Path of the deciding HTTP request (plain HTTP, or
	// inspected HTTPS).
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// QType is a refused DNS query's type.
	QType string `json:"qtype,omitempty"`
	// Decision is what happened (allow or deny); Action what the policy
	// said (allow, ask or deny: an ask is decided by the hold).
	Decision string `json:"decision"`
	Action   string `json:"action,omitempty"`
	// Rule is the index (from 0) of the deciding rule, -1 for the default.
	Rule          int    `json:"rule"`
	Reason        string `json:"reason,omitempty"`
	PolicyVersion int64  `json:"policy_version"`
	// BytesOut went from the session to the destination, BytesIn back.
	BytesOut   int64   `json:"bytes_out"`
	BytesIn    int64   `json:"bytes_in"`
	DurationMS float64 `json:"duration_ms"`
	Inspected  bool    `json:"inspected,omitempty"`
	// Error says why an allowed connection failed (resolution, a refused
	// address, the dial).
	Error string `json:"error,omitempty"`
	Count int    `json:"count,omitempty"`
}

// appendNetRecord appends r as one JSON line.
func appendNetRecord(dst []byte, r NetRecord) []byte { return appendJSONLine(dst, r) }

// ParseNetRecords decodes the data of net chunks (one JSON object per
// line; a record never spans chunks).
func ParseNetRecords(data []byte) ([]NetRecord, error) {
	return parseJSONLines[NetRecord](data, "net record")
}

// HoldNetConnect is the kind of hold an ask rule's connection waits in.
const HoldNetConnect = "net.connect"

// egressHolds decides what an ask rule holds: Hold reports the held
// connection (detail is its NetRecord as JSON, without the outcome) and
// returns once someone decided, or ctx ended (then false).
type egressHolds interface {
	Hold(ctx context.Context, session, kind, detail string) (allow bool)
}

// denyingHolds is the holds of an agentd without a hold mechanism: it
// logs the ask and denies it.
type denyingHolds struct{ logger *slog.Logger }

func (h denyingHolds) Hold(_ context.Context, session, kind, detail string) bool {
	h.logger.Info("ask denied: no hold mechanism", "session", session, "kind", kind, "detail", detail)
	return false
}

// versionedPolicy is a session's policy as it stands: replaced whole, so
// a connection decides against one version.
type versionedPolicy = NetworkPolicy

// policyHolder is a session's current policy.
type policyHolder struct {
	p atomic.Pointer[versionedPolicy]
}

func (h *policyHolder) load() *versionedPolicy   { return h.p.Load() }
func (h *policyHolder) store(p *versionedPolicy) { h.p.Store(p) }
