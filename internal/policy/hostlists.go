package policy

// HostLists is the part of p a backend that filters outgoing traffic by
// host alone can enforce: with a deny default, the hosts some allow or
// ask rule names (a person may still be asked, by the sandbox's agentd)
// and no internet otherwise; with an allow default, the hosts a deny rule
// names for every port and method. Complete reports whether the lists say
// all the policy says; when they do not (ports, methods, paths, ask,
// inspection, deny rules narrowed to ports), what is left is enforced by
// the sandbox's agentd and the environment's page says so.
func (p *Network) HostLists() (allowOut, denyOut []string, internet, complete bool) {
	complete = true
	for _, r := range p.Rules {
		narrowed := len(r.Ports) > 0 || len(r.Methods) > 0 || len(r.Paths) > 0 || r.Inspect
		switch {
		case r.Action == Ask:
			complete = false
			if p.Default == Deny {
				allowOut = append(allowOut, r.Host)
			}
		case r.Action == Allow && p.Default == Deny:
			allowOut = append(allowOut, r.Host)
			complete = complete && !narrowed
		case r.Action == Deny && p.Default != Deny:
			if narrowed {
				complete = false
				continue
			}
			denyOut = append(denyOut, r.Host)
		}
	}
	return allowOut, denyOut, p.Default != Deny, complete
}
