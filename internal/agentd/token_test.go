package agentd_test

import (
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TestTokenRule: agentd refuses the tokens the console refuses, and the
// refusal names the rule, not the token.
func TestTokenRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"empty", "", false},
		{"nine characters", "123456789", false},
		{"one short", strings.Repeat("x", agentd.MinTokenLength-1), false},
		{"exactly the minimum", strings.Repeat("x", agentd.MinTokenLength), true},
		{"generated", "Zm9vYmFyYmF6cXV4cXV1eGZvb2Jhcg", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := agentd.NewServer(agentd.Config{Token: tt.token, Root: t.TempDir()})
			if srv != nil {
				srv.Close()
			}
			if (err == nil) != tt.ok {
				t.Fatalf("NewServer with a %d-character token: %v; want ok=%v", len(tt.token), err, tt.ok)
			}
			if err != nil && (!strings.Contains(err.Error(), "at least 16") || (tt.token != "" && strings.Contains(err.Error(), tt.token))) {
				t.Errorf("refusal %q: want the rule and not the token", err)
			}
		})
	}
}
