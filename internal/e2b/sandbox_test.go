package e2b_test

import (
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/sealed"
)

// A sandbox id names its org, fits one DNS label behind envd's port even
// for the longest slug, and nothing else parses as one.
func TestSandboxIDs(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("a", 40)
	for _, slug := range []string{"acme", "a-b-c", longest} {
		id := e2b.NewSandboxID(slug)
		if got, ok := e2b.OrgOf(id); !ok || got != slug {
			t.Errorf("OrgOf(%q) = %q, %v", id, got, ok)
		}
		if label := "49983-" + id; len(label) > 63 {
			t.Errorf("host label %q is %d characters, more than DNS allows", label, len(label))
		}
	}
	if a, b := e2b.NewSandboxID("acme"), e2b.NewSandboxID("acme"); a == b {
		t.Error("two sandbox ids are equal")
	}
	for _, bad := range []string{"", "acme", "acme-", "-0123456789abcdef", "acme-0123456789ABCDEF", "acme-0123456789abcde", "Acme-0123456789abcdef",
		"acme-0123456789abcdef0", "../x-0123456789abcdef", "acme.example-0123456789abcdef"} {
		if slug, ok := e2b.OrgOf(bad); ok {
			t.Errorf("OrgOf(%q) = %q, want no org", bad, slug)
		}
	}
}

// The minted token is 32 random bytes in hex, sealed bound to its org and
// sandbox: it does not open for another sandbox or org.
func TestAccessTokenSealing(t *testing.T) {
	t.Parallel()
	box, err := sealed.New(make([]byte, sealed.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	tok := e2b.MintAccessToken()
	if len(tok) != 64 || strings.Trim(tok, "0123456789abcdef") != "" || tok == e2b.MintAccessToken() {
		t.Fatalf("token %q", tok)
	}
	id := e2b.NewSandboxID("acme")
	s, err := e2b.SealToken(box, "acme", id, tok)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, slug, id string
		opens          bool
	}{
		{"its own", "acme", id, true},
		{"another org", "globex", id, false},
		{"another sandbox", "acme", e2b.NewSandboxID("acme"), false},
	} {
		got, err := e2b.OpenToken(box, tc.slug, e2b.Sandbox{SandboxID: tc.id, TokenSealed: s})
		if tc.opens != (err == nil) || tc.opens && got != tok {
			t.Errorf("%s: %q, %v", tc.name, got, err)
		}
	}
}

// The endpoint: the org's control plane under the console, the data plane
// as one host (the console's when none is configured), and the domain
// answers carry (a placeholder that never resolves when none is set).
func TestEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		console, sandbox, domain string
		want                     e2b.Endpoint
		answer                   string
	}{
		{"https://console.example/", "", "", e2b.Endpoint{APIURL: "https://console.example/e2b/orgs/acme", SandboxURL: "https://console.example"},
			e2b.PlaceholderDomain},
		{"https://console.example", "https://sbx.example/", "e2b.example",
			e2b.Endpoint{APIURL: "https://console.example/e2b/orgs/acme", SandboxURL: "https://sbx.example", Domain: "e2b.example"}, "e2b.example"},
	} {
		if got := e2b.EndpointFor(tc.console, tc.sandbox, tc.domain, "acme"); got != tc.want {
			t.Errorf("EndpointFor(%q, %q, %q) = %+v, want %+v", tc.console, tc.sandbox, tc.domain, got, tc.want)
		}
		if got := e2b.AnswerDomain(tc.domain); got != tc.answer {
			t.Errorf("AnswerDomain(%q) = %q", tc.domain, got)
		}
	}
	if !strings.HasSuffix(e2b.PlaceholderDomain, ".invalid") {
		t.Errorf("placeholder %q is not under .invalid (RFC 2606)", e2b.PlaceholderDomain)
	}
}
