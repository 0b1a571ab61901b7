package policy_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/policy"
)

func TestDecideConn(t *testing.T) {
	t.Parallel()
	ip := netip.MustParseAddr
	p := policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
		{Action: policy.Allow, Host: "github.com", Ports: []int{443}},                                         // 1
		{Action: policy.Allow, Host: "*.githubusercontent.com", Ports: []int{443}},                            // 2
		{Action: policy.Allow, Host: "10.0.0.0/8"},                                                            // 3
		{Action: policy.Deny, Host: "10.9.0.0/16"},                                                            // 4
		{Action: policy.Allow, Host: "2001:db8::/32", Ports: []int{80, 443}},                                  // 5
		{Action: policy.Allow, Host: "api.example.com", Methods: []string{"GET"}, Inspect: true},              // 6
		{Action: policy.Deny, Host: "api.example.com", Methods: []string{"DELETE"}},                           // 7
		{Action: policy.Ask, Host: "api.example.com", Methods: []string{"POST"}, Paths: []string{"/admin/*"}}, // 8
		{Action: policy.Allow, Host: "192.0.2.7"},                                                             // 9
		{Action: policy.Allow, Host: "*", Ports: []int{53}},                                                   // 10
		{Action: policy.Allow, Host: "pypi.org"},                                                              // 11
	}}
	for _, tc := range []struct {
		name string
		c    policy.Conn
		want policy.Action
		rule int
	}{
		{"a name and its port", policy.Conn{Name: "github.com", Port: 443}, policy.Allow, 0},
		{"a name in another case, with a final dot", policy.Conn{Name: "GitHub.com.", Port: 443}, policy.Allow, 0},
		{"a name on another port", policy.Conn{Name: "github.com", Port: 22}, policy.Deny, -1},
		{"a subdomain of a name rule is not the name", policy.Conn{Name: "api.github.com", Port: 443}, policy.Deny, -1},
		{"*.x matches subdomains", policy.Conn{Name: "raw.githubusercontent.com", Port: 443}, policy.Allow, 1},
		{"*.x matches deeper subdomains", policy.Conn{Name: "a.b.githubusercontent.com", Port: 443}, policy.Allow, 1},
		{"*.x does not match x", policy.Conn{Name: "githubusercontent.com", Port: 443}, policy.Deny, -1},
		{"*.x does not match a name ending in x", policy.Conn{Name: "evilgithubusercontent.com", Port: 443}, policy.Deny, -1},
		{"a CIDR", policy.Conn{Addr: ip("10.1.2.3"), Port: 5432}, policy.Allow, 2},
		{"a narrower deny wins", policy.Conn{Addr: ip("10.9.1.1"), Port: 5432}, policy.Deny, 3},
		{"an IPv4-mapped IPv6 address is its IPv4", policy.Conn{Addr: ip("::ffff:10.1.2.3"), Port: 1}, policy.Allow, 2},
		{"outside the CIDR", policy.Conn{Addr: ip("11.0.0.1"), Port: 80}, policy.Deny, -1},
		{"an IPv6 CIDR", policy.Conn{Addr: ip("2001:db8::1"), Port: 443}, policy.Allow, 4},
		{"an IPv6 CIDR on another port", policy.Conn{Addr: ip("2001:db8::1"), Port: 8443}, policy.Deny, -1},
		{"an address", policy.Conn{Addr: ip("192.0.2.7"), Port: 9}, policy.Allow, 8},
		{"a name rule needs the name", policy.Conn{Addr: ip("140.82.112.3"), Port: 443}, policy.Deny, -1},
		{"an address rule matches a named connection's address", policy.Conn{Name: "internal.corp", Addr: ip("10.1.1.1"), Port: 80}, policy.Allow, 2},
		{"every host on a port", policy.Conn{Name: "dns.example", Port: 53}, policy.Allow, 9},
		{"a method an allow rule names", policy.Conn{Name: "api.example.com", Port: 443, Method: "GET", Path: "/"}, policy.Allow, 5},
		{"methods match regardless of case", policy.Conn{Name: "api.example.com", Port: 443, Method: "get", Path: "/"}, policy.Allow, 5},
		{"a method no rule names", policy.Conn{Name: "api.example.com", Port: 443, Method: "PUT", Path: "/"}, policy.Deny, -1},
		{"a denied method", policy.Conn{Name: "api.example.com", Port: 443, Method: "DELETE", Path: "/"}, policy.Deny, 6},
		{"an unknown method: the deny applies, the allow does not", policy.Conn{Name: "api.example.com", Port: 443}, policy.Deny, 6},
		{"a path", policy.Conn{Name: "api.example.com", Port: 443, Method: "POST", Path: "/admin/users"}, policy.Ask, 7},
		{"a path with dot segments is resolved", policy.Conn{Name: "api.example.com", Port: 443, Method: "POST", Path: "/public/../admin/users"}, policy.Ask, 7},
		{"a path with escapes is decoded", policy.Conn{Name: "api.example.com", Port: 443, Method: "POST", Path: "/%61dmin/users"}, policy.Ask, 7},
		{"another path", policy.Conn{Name: "api.example.com", Port: 443, Method: "POST", Path: "/public/x"}, policy.Deny, -1},
		{"a name rule without ports", policy.Conn{Name: "pypi.org", Port: 8080}, policy.Allow, 10},
	} {
		got := p.DecideConn(tc.c)
		if got.Action != tc.want || got.Rule != tc.rule {
			t.Errorf("%s: %+v decided %s by rule %d (%s), want %s by %d", tc.name, tc.c, got.Action, got.Rule, got.Why, tc.want, tc.rule)
		}
	}
	if got := (&policy.Network{}).DecideConn(policy.Conn{Name: "x.org", Port: 443}); got.Action != policy.Allow {
		t.Errorf("an empty policy decided %+v, want allow", got)
	}
}

func TestMayResolve(t *testing.T) {
	t.Parallel()
	deny := policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
		{Action: policy.Allow, Host: "github.com", Ports: []int{443}},
		{Action: policy.Ask, Host: "*.example.com"},
		{Action: policy.Deny, Host: "pypi.org"},
		{Action: policy.Allow, Host: "10.0.0.0/8"},
	}}
	allow := policy.Network{Default: policy.Allow, Rules: []policy.NetRule{
		{Action: policy.Deny, Host: "evil.com"},
		{Action: policy.Deny, Host: "*.evil.com"},
		{Action: policy.Deny, Host: "mail.com", Ports: []int{25}},
		{Action: policy.Deny, Host: "api.com", Methods: []string{"DELETE"}},
		{Action: policy.Allow, Host: "ok.evil.com"},
	}}
	every := policy.Network{Default: policy.Deny, Rules: []policy.NetRule{{Action: policy.Allow, Host: "*", Ports: []int{443}}}}
	for _, tc := range []struct {
		p    policy.Network
		name string
		want bool
	}{
		{deny, "github.com", true},
		{deny, "GITHUB.COM.", true},
		{deny, "api.github.com", false},
		{deny, "a.example.com", true},
		{deny, "example.com", false},
		{deny, "pypi.org", false},
		{deny, "internal.corp", false}, // address rules allow addresses, not names
		{deny, "", false},
		{allow, "github.com", true},
		{allow, "evil.com", false},
		{allow, "x.evil.com", false},
		{allow, "ok.evil.com", true}, // an allow rule could match it
		{allow, "mail.com", true},    // denied on one port only
		{allow, "api.com", true},     // denied for one method only
		{every, "anything.org", true},
	} {
		if got := tc.p.MayResolve(tc.name); got != tc.want {
			t.Errorf("default %s: MayResolve(%q) = %v, want %v", tc.p.Default, tc.name, got, tc.want)
		}
	}
}

func TestDecideURL(t *testing.T) {
	t.Parallel()
	p := policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
		{Action: policy.Allow, Host: "github.com", Ports: []int{443}},
		{Action: policy.Allow, Host: "api.example.com", Methods: []string{"GET"}, Paths: []string{"/v1/*"}, Inspect: true},
		{Action: policy.Allow, Host: "plain.example.com", Ports: []int{80}, Methods: []string{"GET"}},
		{Action: policy.Allow, Host: "tls.example.com", Methods: []string{"GET"}},
		{Action: policy.Allow, Host: "10.0.0.0/8", Ports: []int{8080}},
		{Action: policy.Allow, Host: "2001:db8::1"},
	}}
	for _, tc := range []struct {
		url  string
		want policy.Action
		rule int
	}{
		{"https://github.com/gatehouse", policy.Allow, 0},
		{"https://GitHub.com:443/", policy.Allow, 0},
		{"http://github.com/", policy.Deny, -1},
		{"https://github.com:8443/", policy.Deny, -1},
		{"https://api.example.com/v1/items?x=1", policy.Allow, 1},
		{"https://api.example.com/v2/items", policy.Deny, -1},
		{"http://plain.example.com/x", policy.Allow, 2},
		// Over TLS that is not inspected the method is not seen, so an
		// allow restricted to methods does not apply.
		{"https://tls.example.com/x", policy.Deny, -1},
		{"http://10.1.2.3:8080/metrics", policy.Allow, 4},
		{"http://[2001:db8::1]/", policy.Allow, 5},
		{"wss://github.com/socket", policy.Allow, 0},
	} {
		got, err := p.DecideURL(tc.url)
		if err != nil || got.Action != tc.want || got.Rule != tc.rule {
			t.Errorf("%s: %+v, %v; want %s by rule %d", tc.url, got, err, tc.want, tc.rule)
		}
	}
	for _, bad := range []string{"ftp://x.org/", "github.com", "https://", "http://x.org:0/", "http://x.org:70000/", "http://%zz/"} {
		if _, err := p.DecideURL(bad); err == nil || !strings.HasPrefix(err.Error(), "The URL cannot be checked") {
			t.Errorf("%s: err = %v, want a URL error", bad, err)
		}
	}
	c, err := policy.URLConn("https://Api.Example.com./v1/a%20b")
	if err != nil || c.Name != "api.example.com" || c.Port != 443 || c.Method != "GET" || c.Path != "/v1/a%20b" || c.Addr.IsValid() {
		t.Errorf("URLConn = %+v, %v", c, err)
	}
}

func TestInspects(t *testing.T) {
	t.Parallel()
	p := policy.Network{Rules: []policy.NetRule{
		{Action: policy.Allow, Host: "*.example.com", Ports: []int{443}, Methods: []string{"GET"}, Inspect: true},
		{Action: policy.Allow, Host: "github.com"},
	}}
	for c, want := range map[policy.Conn]bool{
		{Name: "api.example.com", Port: 443}: true,
		{Name: "api.example.com", Port: 80}:  false,
		{Name: "github.com", Port: 443}:      false,
	} {
		if got := p.Inspects(c); got != want {
			t.Errorf("Inspects(%+v) = %v, want %v", c, got, want)
		}
	}
}

func TestValidateNetwork(t *testing.T) {
	t.Parallel()
	rule := func(r policy.NetRule) policy.Network {
		if r.Action == "" {
			r.Action = policy.Allow
		}
		return policy.Network{Default: policy.Deny, Rules: []policy.NetRule{r}}
	}
	for _, tc := range []struct {
		name  string
		p     policy.Network
		field string
		has   string
	}{
		{"the default policy", policy.DefaultNetwork(), "", ""},
		{"an empty policy", policy.Network{}, "", ""},
		{"a name", rule(policy.NetRule{Host: "API.GitHub.com."}), "", ""},
		{"subdomains", rule(policy.NetRule{Host: "*.githubusercontent.com"}), "", ""},
		{"every host", rule(policy.NetRule{Host: "*", Ports: []int{443}}), "", ""},
		{"an IPv4 address", rule(policy.NetRule{Host: "192.0.2.1"}), "", ""},
		{"an IPv6 address", rule(policy.NetRule{Host: "2001:db8::1"}), "", ""},
		{"a CIDR", rule(policy.NetRule{Host: "10.0.0.0/8"}), "", ""},
		{"an IPv6 CIDR", rule(policy.NetRule{Host: "fd00::/8"}), "", ""},
		{"methods and paths inspected", rule(policy.NetRule{Host: "x.org", Methods: []string{"get", "POST"}, Paths: []string{"/v1/*"}, Inspect: true}), "", ""},
		{"default ask", policy.Network{Default: policy.Ask}, "default", "cannot wait for an approval"},
		{"another default", policy.Network{Default: "maybe"}, "default", `not "maybe"`},
		{"an action that is none", rule(policy.NetRule{Action: "nope", Host: "x.org"}), "rules[0].action", "Rule 1: the action"},
		{"no host", rule(policy.NetRule{}), "rules[0].host", "Rule 1: the host is empty"},
		{"a wildcard inside a name", rule(policy.NetRule{Host: "api.*.com"}), "rules[0].host", "wildcard may only stand first"},
		{"a partial wildcard", rule(policy.NetRule{Host: "*github.com"}), "rules[0].host", "wildcard"},
		{"a URL for a host", rule(policy.NetRule{Host: "https://github.com"}), "rules[0].host", "is a URL"},
		{"a name with a space", rule(policy.NetRule{Host: "git hub.com"}), "rules[0].host", "not a host name"},
		{"a unicode name", rule(policy.NetRule{Host: "bücher.de"}), "rules[0].host", "xn--"},
		{"a bracketed IPv6 address", rule(policy.NetRule{Host: "[::1]"}), "rules[0].host", "without brackets"},
		{"a CIDR with host bits", rule(policy.NetRule{Host: "10.1.2.3/8"}), "rules[0].host", "did you mean 10.0.0.0/8"},
		{"a CIDR that is none", rule(policy.NetRule{Host: "10.0.0.0/33"}), "rules[0].host", "not a CIDR"},
		{"an address with a zone", rule(policy.NetRule{Host: "fe80::1%eth0"}), "rules[0].host", "zone"},
		{"port 0", rule(policy.NetRule{Host: "x.org", Ports: []int{0}}), "rules[0].ports", "between 1 and 65535"},
		{"port 65536", rule(policy.NetRule{Host: "x.org", Ports: []int{443, 65536}}), "rules[0].ports", "not 65536"},
		{"a method that is no token", rule(policy.NetRule{Host: "x.org", Methods: []string{"GET POST"}}), "rules[0].methods", "not an HTTP method"},
		{"a path without a slash", rule(policy.NetRule{Host: "x.org", Paths: []string{"v1/*"}}), "rules[0].paths", "starting with /"},
		{"a path glob that does not compile", rule(policy.NetRule{Host: "x.org", Paths: []string{"/v1/[x"}}), "rules[0].paths", "glob"},
		{"inspect with nothing to inspect", rule(policy.NetRule{Host: "x.org", Inspect: true}), "rules[0].inspect", "give methods or paths"},
		{"a reason too long", rule(policy.NetRule{Host: "x.org", Reason: strings.Repeat("x", 501)}), "rules[0].reason", "at most 500"},
	} {
		got := fields(t, tc.p.Validate())
		switch {
		case tc.field == "" && got != nil:
			t.Errorf("%s: invalid: %v", tc.name, got)
		case tc.field != "" && !strings.Contains(got[tc.field], tc.has):
			t.Errorf("%s: fields %q, want %s to say %q", tc.name, got, tc.field, tc.has)
		}
	}
}

func TestParseNetworkAndDigest(t *testing.T) {
	t.Parallel()
	v := apperr.Validation()
	p := policy.ParseNetwork(`{"default":"deny","rules":[{"action":"allow","host":"GitHub.com.","ports":[443,443,80],"methods":["post","get"]}]}`, v, "network_policy")
	if v.Err() != nil {
		t.Fatal(v.Err())
	}
	r := p.Rules[0]
	if r.Host != "github.com" || len(r.Ports) != 2 || r.Ports[0] != 80 || r.Methods[0] != "GET" {
		t.Errorf("not normalized: %+v", r)
	}
	same := policy.Network{Default: policy.Deny, Rules: []policy.NetRule{{Action: policy.Allow, Host: "github.com", Ports: []int{80, 443}, Methods: []string{"GET", "POST"}}}}
	if p.Digest() != same.Digest() {
		t.Errorf("one policy written two ways digests differently:\n%s\n%s", p.Canonical(), same.Canonical())
	}
	if got := string(policy.DefaultNetwork().Canonical()); got != `{"default":"allow","rules":[]}` {
		t.Errorf("DefaultNetwork canonical JSON %s", got)
	}
	v = apperr.Validation()
	policy.ParseNetwork(`{"default":"deny","rules":[{"host":"x.org","action":"allow","port":443}]}`, v, "network_policy")
	if !strings.Contains(v.Fields["network_policy"], "Allowed fields") {
		t.Errorf("an unknown field: %q", v.Fields)
	}
}

func TestValidateIntoPrefixes(t *testing.T) {
	t.Parallel()
	v := apperr.Validation()
	p := policy.Exec{Default: "x"}
	p.ValidateInto(v, "exec_policy.")
	n := policy.Network{Default: policy.Ask}
	n.ValidateInto(v, "network_policy.")
	if v.Fields["exec_policy.default"] == "" || v.Fields["network_policy.default"] == "" {
		t.Errorf("fields %q", v.Fields)
	}
}
