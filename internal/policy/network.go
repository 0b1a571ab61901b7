package policy

import (
	"net/netip"
	"net/url"
	"path"
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
	// Paths are globs over an HTTP request's path (`*` crosses slashes),
	// matched like Methods; empty means every path.
	Paths []string `json:"paths,omitempty"`
	// Inspect terminates TLS so methods and paths can be checked on HTTPS.
	Inspect bool   `json:"inspect,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// Limits of a network policy.
const (
	MaxNetRules    = 200
	maxRuleEntries = 64 // ports, methods or paths of one rule
)

// DefaultNetwork is the policy of an agent that has none: every
// connection is allowed.
func DefaultNetwork() Network { return Network{Default: Allow, Rules: []NetRule{}} }

// Normalize fills an unset default with allow, lower-cases actions and
// names (dropping a final dot), upper-cases methods, and sorts ports,
// methods and paths, so that two ways of writing one policy compare and
// digest alike. Validate afterwards.
func (p *Network) Normalize() {
	p.Default = normalAction(p.Default)
	if p.Default == "" {
		p.Default = Allow
	}
	rules := make([]NetRule, len(p.Rules))
	for i, r := range p.Rules {
		r.Action = normalAction(r.Action)
		r.Host = canonicalName(strings.TrimSpace(r.Host))
		r.Ports = slices.Compact(slices.Sorted(slices.Values(r.Ports)))
		methods := make([]string, 0, len(r.Methods))
		for _, m := range r.Methods {
			if m = strings.ToUpper(strings.TrimSpace(m)); m != "" {
				methods = append(methods, m)
			}
		}
		slices.Sort(methods)
		r.Methods = slices.Compact(methods)
		paths := make([]string, 0, len(r.Paths))
		for _, s := range r.Paths {
			if s = strings.TrimSpace(s); s != "" {
				paths = append(paths, s)
			}
		}
		slices.Sort(paths)
		r.Paths = slices.Compact(paths)
		if len(r.Ports) == 0 {
			r.Ports = nil
		}
		if len(r.Methods) == 0 {
			r.Methods = nil
		}
		if len(r.Paths) == 0 {
			r.Paths = nil
		}
		r.Reason = strings.TrimSpace(r.Reason)
		rules[i] = r
	}
	p.Rules = rules
}

// Canonical is the policy's normalized JSON, byte for byte the same for
// every way of writing one policy.
func (p Network) Canonical() []byte {
	q := p
	q.Rules = slices.Clone(p.Rules)
	q.Normalize()
	return canonical(q)
}

// Digest is the hex SHA-256 of Canonical: equal digests, equal policies.
func (p Network) Digest() string { return digest(p.Canonical()) }

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
// else the default. A rule restricted to methods or paths, when the
// connection's method or path is not known (TLS that is not inspected),
// applies if it denies or asks and not if it allows: what cannot be seen
// is not let through on a method or path it might not have.
func (p *Network) DecideConn(c Conn) Decision {
	def := p.Default.or(Allow)
	if def == Ask {
		def = Deny // no default may wait for a person; Validate refuses it
	}
	best := Decision{Action: def, Rule: -1, Why: "the default (no rule matches)"}
	matched := false
	reqPath, pathOK := canonicalPath(c.Path)
	for i, r := range p.Rules {
		act := r.Action.or(Deny)
		m := r.match(c, reqPath, pathOK)
		if m == noMatch || m == mayMatch && act == Allow {
			continue
		}
		if !matched || act.Stricter(best.Action) {
			best = Decision{Action: act, Rule: i, Why: ruleWhy(i, r.describe(), r.Reason)}
			matched = true
		}
	}
	return best
}

// match says whether r applies to c: surely, or maybe when it names
// methods or paths c does not show.
func (r NetRule) match(c Conn, reqPath string, pathOK bool) match {
	if !r.matchesHost(c.Name, c.Addr) {
		return noMatch
	}
	if len(r.Ports) > 0 && !slices.Contains(r.Ports, c.Port) {
		return noMatch
	}
	m := sureMatch
	if len(r.Methods) > 0 {
		switch {
		case c.Method == "":
			m = mayMatch
		case !slices.ContainsFunc(r.Methods, func(x string) bool { return strings.EqualFold(x, c.Method) }):
			return noMatch
		}
	}
	if len(r.Paths) > 0 {
		switch {
		case !pathOK:
			m = mayMatch
		case !slices.ContainsFunc(r.Paths, func(g string) bool { return matchGlob(g, reqPath) }):
			return noMatch
		}
	}
	return m
}

// matchesHost matches the rule's host against a connection's name or
// address: `*` every host, a CIDR or an address the address (IPv4-mapped
// IPv6 addresses as IPv4), a name or `*.name` the name.
func (r NetRule) matchesHost(name string, addr netip.Addr) bool {
	if r.Host == "*" {
		return true
	}
	if pfx, err := netip.ParsePrefix(r.Host); err == nil {
		return addr.IsValid() && unmapPrefix(pfx).Contains(addr.Unmap())
	}
	if a, err := netip.ParseAddr(r.Host); err == nil {
		return addr.IsValid() && a.Unmap() == addr.Unmap()
	}
	return name != "" && hostMatchesName(r.Host, canonicalName(name))
}

func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// canonicalPath is an HTTP path as a server would resolve it: percent
// escapes decoded and dot segments removed, so `/a/../b` is checked as
// `/b`. False when there is no path or it does not decode.
func canonicalPath(p string) (string, bool) {
	if p == "" {
		return "", false
	}
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	u, err := url.PathUnescape(p)
	if err != nil {
		return "", false
	}
	if !strings.HasPrefix(u, "/") {
		u = "/" + u
	}
	clean := path.Clean(u)
	if strings.HasSuffix(u, "/") && clean != "/" {
		clean += "/"
	}
	return clean, true
}

// Inspects reports whether a connection like c should have its TLS
// terminated so that its method and path can be checked: some rule that
// may apply to it asks for inspection.
func (p *Network) Inspects(c Conn) bool {
	for _, r := range p.Rules {
		if r.Inspect && r.matchesHost(c.Name, c.Addr) && (len(r.Ports) == 0 || slices.Contains(r.Ports, c.Port)) {
			return true
		}
	}
	return false
}

// MayResolve reports whether some allow or ask rule could match a
// connection to name (or the default allows): names no rule could allow
// are not resolved, so DNS carries nothing out. Address and CIDR rules
// allow connections to addresses, not the resolution of names.
func (p *Network) MayResolve(name string) bool {
	name = canonicalName(name)
	if name == "" {
		return false
	}
	for _, r := range p.Rules {
		if r.Action.or(Deny) != Deny && r.matchesHost(name, netip.Addr{}) {
			return true
		}
	}
	if p.Default.or(Allow) != Allow {
		return false
	}
	for _, r := range p.Rules {
		if r.Action.or(Deny) == Deny && len(r.Ports) == 0 && len(r.Methods) == 0 && len(r.Paths) == 0 && r.matchesHost(name, netip.Addr{}) {
			return false
		}
	}
	return true
}

// URLConn is the connection a request for rawURL makes, as the egress
// proxy would see it: the host (a name, or an address for an address
// literal), the port (from the URL, else 80 for http and ws, 443 for
// https and wss), method GET and the path.
func URLConn(rawURL string) (Conn, error) {
	c, _, err := urlConn(rawURL)
	return c, err
}

// urlConn is URLConn, and whether the connection is TLS.
func urlConn(rawURL string) (Conn, bool, error) {
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil {
		return Conn{}, false, &URLError{Message: "the URL does not parse: " + err.Error()}
	}
	var port int
	tls := false
	switch strings.ToLower(u.Scheme) {
	case "http", "ws":
		port = 80
	case "https", "wss":
		port, tls = 443, true
	default:
		return Conn{}, false, &URLError{Message: "the URL must start with http://, https://, ws:// or wss://"}
	}
	host := u.Hostname()
	if host == "" {
		return Conn{}, false, &URLError{Message: "the URL has no host"}
	}
	if s := u.Port(); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 65535 {
			return Conn{}, false, &URLError{Message: "the URL's port must be between 1 and 65535"}
		}
		port = n
	}
	c := Conn{Port: port, Method: "GET", Path: u.EscapedPath()}
	if c.Path == "" {
		c.Path = "/"
	}
	if a, err := netip.ParseAddr(host); err == nil {
		c.Addr = a.Unmap()
	} else {
		c.Name = canonicalName(host)
	}
	return c, tls, nil
}

// URLError is a URL the "try a URL" box cannot decide.
type URLError struct{ Message string }

func (e *URLError) Error() string { return "The URL cannot be checked: " + e.Message + "." }

// DecideURL decides a GET of rawURL, for the "try a URL" box, as the
// egress proxy would: over https the method and path are known only
// when a rule inspects the host. A name is not resolved, so address and
// CIDR rules apply only to a URL naming an address.
func (p *Network) DecideURL(rawURL string) (Decision, error) {
	c, tls, err := urlConn(rawURL)
	if err != nil {
		return Decision{}, err
	}
	if tls && !p.Inspects(c) {
		c.Method, c.Path = "", ""
	}
	return p.DecideConn(c), nil
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

// describe is a rule as one line: "allow host *.github.com ports 443".
func (r NetRule) describe() string {
	s := string(r.Action) + " host " + r.Host
	if len(r.Ports) > 0 {
		ports := make([]string, len(r.Ports))
		for i, p := range r.Ports {
			ports[i] = strconv.Itoa(p)
		}
		s += " ports " + strings.Join(ports, ",")
	}
	if len(r.Methods) > 0 {
		s += " methods " + strings.Join(r.Methods, ",")
	}
	if len(r.Paths) > 0 {
		s += " paths " + strings.Join(r.Paths, ",")
	}
	if r.Inspect {
		s += " (inspected)"
	}
	return s
}
