package policy

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Network is an agent's egress policy: rules over destination hosts (a
// name, `*.name` for its subdomains only, an address or a CIDR), ports
// and, for plain HTTP or inspected HTTPS, methods; the default decides
// what no rule matches.
type Network struct {
	Default            Action    `json:"default"`
	RequireEnforcement bool      `json:"require_enforcement,omitempty"`
	Rules              []NetRule `json:"rules"`
}

// NetRule is one egress rule. Ports empty means every port; Methods empty
// means every method.
type NetRule struct {
	Action  Action   `json:"action"`
	Host    string   `json:"host"`
	Ports   []int    `json:"ports,omitempty"`
	Methods []string `json:"methods,omitempty"`
	// Inspect terminates TLS so methods and paths can be checked on HTTPS.
	Inspect bool   `json:"inspect,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// Conn is one connection about to leave: the name the client asked for
// (Host header, SNI, or the resolved name; empty when it gave only an
// address), the address, the port, and the HTTP method and path when
// known.
type Conn struct {
	Name   string
	Addr   netip.Addr
	Port   int
	Method string
	Path   string
}

// DecideConn decides one connection: the strictest matching rule wins,
// else the default.
func (p *Network) DecideConn(c Conn) Decision {
	best := Decision{Action: p.Default, Rule: -1, Why: "no rule matches; the default is " + string(p.Default)}
	matched := false
	for i, r := range p.Rules {
		if !r.matches(c) {
			continue
		}
		if !matched || r.Action.Stricter(best.Action) {
			best = Decision{Action: r.Action, Rule: i, Why: "rule " + strconv.Itoa(i+1) + " (" + string(r.Action) + " " + r.Host + ")"}
			matched = true
		}
	}
	return best
}

// MayResolve reports whether some allow or ask rule could match a
// connection to name (or the default allows): names no rule could allow
// are not resolved, so DNS carries nothing out.
func (p *Network) MayResolve(name string) bool {
	name = canonicalName(name)
	for _, r := range p.Rules {
		if r.Action != Deny && hostMatchesName(r.Host, name) {
			return true
		}
	}
	if p.Default != Allow {
		return false
	}
	for _, r := range p.Rules {
		if r.Action == Deny && len(r.Ports) == 0 && len(r.Methods) == 0 && hostMatchesName(r.Host, name) {
			return false
		}
	}
	return true
}

func (r NetRule) matches(c Conn) bool {
	if len(r.Ports) > 0 && !slices.Contains(r.Ports, c.Port) {
		return false
	}
	if len(r.Methods) > 0 && c.Method != "" && !slices.ContainsFunc(r.Methods, func(m string) bool { return strings.EqualFold(m, c.Method) }) {
		return false
	}
	if pfx, err := netip.ParsePrefix(r.Host); err == nil {
		return c.Addr.IsValid() && pfx.Contains(c.Addr.Unmap())
	}
	if a, err := netip.ParseAddr(r.Host); err == nil {
		return c.Addr.IsValid() && a.Unmap() == c.Addr.Unmap()
	}
	return c.Name != "" && hostMatchesName(r.Host, canonicalName(c.Name))
}

// hostMatchesName matches a host rule against a canonical name: `*.x`
// matches x's subdomains only, anything else the name itself.
func hostMatchesName(host, name string) bool {
	host = canonicalName(host)
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		return strings.HasSuffix(name, "."+rest)
	}
	return host == name
}

func canonicalName(s string) string { return strings.TrimSuffix(strings.ToLower(s), ".") }
