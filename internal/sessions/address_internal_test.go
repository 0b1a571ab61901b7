package sessions

import (
	"errors"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
)

// TestSandboxAgentdURLRefusesCraftedAddresses: the agentd URL (and the
// token sent to it) is built from the sandbox id and domain a backend
// answered, on create or on resume; one that is not a plain name is
// refused wherever the URL is built, not only when the sandbox was
// created.
func TestSandboxAgentdURLRefusesCraftedAddresses(t *testing.T) {
	env := envs.Environment{SandboxScheme: "https", SandboxDomain: "e2b.example"}
	tests := []struct {
		name, id, domain string
		ok               bool
	}{
		{"plain id, backend's domain", "sb1", "", true},
		{"plain id and domain", "sb1", "sandboxes.example", true},
		{"domain with a path", "sb1", "evil.example/x?", false},
		{"domain with userinfo", "sb1", "user@evil.example", false},
		{"id with a slash", "sb1/../x", "", false},
		{"empty id", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := sandboxAgentdURL(env, Session{SandboxID: tt.id, SandboxDomain: tt.domain})
			if tt.ok && (err != nil || u == "") {
				t.Fatalf("refused a plain address: %q, %v", u, err)
			}
			if !tt.ok && (err == nil || !errors.Is(err, apperr.ErrUpstream)) {
				t.Fatalf("built %q for a crafted address (err %v)", u, err)
			}
		})
	}
}
