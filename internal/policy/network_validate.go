package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// Validate reports what is wrong with p, normalized, as an
// *apperr.ValidationError keyed by field ("default", "rules[2].host").
func (p *Network) Validate() error {
	v := apperr.Validation()
	p.ValidateInto(v, "")
	return v.Err()
}

// ValidateInto adds what is wrong with p, normalized, to v, with each
// field key prefixed by prefix (e.g. "network_policy.").
func (p *Network) ValidateInto(v *apperr.ValidationError, prefix string) {
	q := *p
	q.Rules = append([]NetRule(nil), p.Rules...)
	q.Normalize()
	switch {
	case q.Default == Ask:
		v.Add(prefix+"default", "The default must be allow or deny: a connection no rule matches cannot wait for an approval.")
	case q.Default != Allow && q.Default != Deny:
		v.Add(prefix+"default", "The default must be allow or deny, not %q.", q.Default)
	}
	if len(q.Rules) > MaxNetRules {
		v.Add(prefix+"rules", "At most %d rules (there are %d).", MaxNetRules, len(q.Rules))
	}
	for i, r := range q.Rules {
		validateNetRule(v, fmt.Sprintf("%srules[%d].", prefix, i), fmt.Sprintf("Rule %d: ", i+1), r)
	}
}

func validateNetRule(v *apperr.ValidationError, key, name string, r NetRule) {
	if !r.Action.Valid() {
		v.Add(key+"action", "%sthe action must be allow, ask or deny, not %q.", name, r.Action)
	}
	if msg := checkHost(r.Host); msg != "" {
		v.Add(key+"host", "%s%s", name, msg)
	}
	if len(r.Ports) > maxRuleEntries {
		v.Add(key+"ports", "%sat most %d ports.", name, maxRuleEntries)
	}
	for _, port := range r.Ports {
		if port < 1 || port > 65535 {
			v.Add(key+"ports", "%sports must be between 1 and 65535, not %d.", name, port)
			break
		}
	}
	if len(r.Methods) > maxRuleEntries {
		v.Add(key+"methods", "%sat most %d methods.", name, maxRuleEntries)
	}
	for _, m := range r.Methods {
		if !isToken(m) {
			v.Add(key+"methods", "%s%q is not an HTTP method (a word such as GET or POST).", name, m)
			break
		}
	}
	if len(r.Paths) > maxRuleEntries {
		v.Add(key+"paths", "%sat most %d paths.", name, maxRuleEntries)
	}
	for _, s := range r.Paths {
		if !strings.HasPrefix(s, "/") || len(s) > MaxPattern || hasControl(s) || checkGlob(s) != nil {
			v.Add(key+"paths", "%sthe path %q must be a glob starting with / (such as /repos/*), at most %d characters.", name, s, MaxPattern)
			break
		}
	}
	if r.Inspect && len(r.Methods) == 0 && len(r.Paths) == 0 {
		v.Add(key+"inspect", "%sinspect terminates TLS to check methods or paths; give methods or paths, or turn inspect off.", name)
	}
	if len(r.Reason) > MaxReason {
		v.Add(key+"reason", "%sthe reason must be at most %d characters.", name, MaxReason)
	}
}

// checkHost says what is wrong with a rule's host, "" when nothing: it is
// `*`, a name, `*.` and a name, an IPv4 or IPv6 address, or a CIDR.
func checkHost(h string) string {
	switch {
	case h == "":
		return "the host is empty; give a name (\"api.github.com\"), \"*.\" and a name for its subdomains, an address, a CIDR, or \"*\" for every host."
	case h == "*":
		return ""
	case strings.Contains(h, "://"):
		return fmt.Sprintf("%q is a URL, not a host name; write the name alone (\"github.com\").", h)
	case strings.HasPrefix(h, "["):
		return fmt.Sprintf("write the IPv6 address %q without brackets.", h)
	case strings.Contains(h, "/"):
		pfx, err := netip.ParsePrefix(h)
		switch {
		case err != nil || pfx.Addr().Zone() != "":
			return fmt.Sprintf("%q is not a CIDR (such as 10.0.0.0/8 or fd00::/8).", h)
		case pfx.Masked() != pfx:
			return fmt.Sprintf("%q has bits set past its prefix length; did you mean %s?", h, pfx.Masked())
		}
		return ""
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return fmt.Sprintf("the address %q must not have a zone.", h)
		}
		return ""
	}
	name := strings.TrimPrefix(h, "*.")
	if !validName(name) {
		if strings.Contains(name, "*") {
			return fmt.Sprintf("%q: a wildcard may only stand first, as \"*.\" before a name (\"*.example.com\").", h)
		}
		return fmt.Sprintf("%q is not a host name, address or CIDR (names are letters, digits, hyphens and dots; write international names in their xn-- form).", h)
	}
	return ""
}

func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// isToken reports whether s is an HTTP token (RFC 9110), as methods are.
func isToken(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ParseNetwork reads a network policy from JSON as a person or the API
// wrote it, refusing unknown fields, and returns it normalized; problems
// go to v under field and field + ".rules[2].host" and the like. An empty
// document is DefaultNetwork.
func ParseNetwork(raw string, v *apperr.ValidationError, field string) Network {
	p := DefaultNetwork()
	if strings.TrimSpace(raw) == "" {
		return p
	}
	if !decodeStrict(raw, &p, v, field, "The network policy", "default, require_enforcement, rules[{action, host, ports, methods, paths, inspect, reason}]") {
		return p
	}
	p.Normalize()
	p.ValidateInto(v, prefixOf(field))
	return p
}
