package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

func TestAddressing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a    sandbox.Addressing
		sb   sandbox.Sandbox
		want string
	}{
		{"host-based", sandbox.Addressing{Scheme: "http"}, sandbox.Sandbox{ID: "abc123", Domain: "cube.app"}, "http://49984-abc123.cube.app"},
		{"default scheme", sandbox.Addressing{}, sandbox.Sandbox{ID: "abc123", Domain: "e2b.app"}, "https://49984-abc123.e2b.app"},
		{"configured domain when the backend names none", sandbox.Addressing{Domain: "sbx.example"}, sandbox.Sandbox{ID: "abc123"}, "https://49984-abc123.sbx.example"},
		{"backend's domain wins", sandbox.Addressing{Domain: "sbx.example"}, sandbox.Sandbox{ID: "abc123", Domain: "e2b.app"}, "https://49984-abc123.e2b.app"},
		{"path-based", sandbox.Addressing{Scheme: "http", ProxyBaseURL: "http://proxy:8080"}, sandbox.Sandbox{ID: "abc123", Domain: "cube.app"}, "http://proxy:8080/sandbox/abc123/49984"},
		{"path-based trailing slash", sandbox.Addressing{ProxyBaseURL: "http://proxy/"}, sandbox.Sandbox{ID: "abc123"}, "http://proxy/sandbox/abc123/49984"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.a.AgentdURL(tt.sb); got != tt.want {
				t.Errorf("AgentdURL = %q, want %q", got, tt.want)
			}
		})
	}
	if got := (sandbox.Addressing{ProxyBaseURL: "http://p"}).PortURL("x", "", sandbox.EnvdPort); got != "http://p/sandbox/x/49983" {
		t.Errorf("PortURL = %q", got)
	}
}

func TestErrorKinds(t *testing.T) {
	t.Parallel()
	api := func(status int) error {
		return fmt.Errorf("wrapped: %w", &sandbox.APIError{Status: status, Code: status, Op: "POST /sandboxes"})
	}
	tests := []struct {
		name    string
		err     error
		kind    error
		unknown bool
	}{
		{"400", api(400), sandbox.ErrBadRequest, false},
		{"401", api(401), sandbox.ErrUnauthorized, false},
		{"404", api(404), sandbox.ErrNotFound, false},
		{"409", api(409), sandbox.ErrConflict, false},
		{"429", api(429), sandbox.ErrRateLimited, false},
		{"500", api(500), sandbox.ErrServer, true},
		{"502", api(502), sandbox.ErrUnavailable, true},
		{"503", api(503), sandbox.ErrUnavailable, true},
		{"504", api(504), sandbox.ErrUnavailable, true},
		{"timeout", fmt.Errorf("x: %w: %w", sandbox.ErrTimeout, context.DeadlineExceeded), sandbox.ErrTimeout, true},
		{"malformed", fmt.Errorf("x: %w", sandbox.ErrMalformed), sandbox.ErrMalformed, true},
		{"redirect", fmt.Errorf("x: %w", sandbox.ErrRedirect), sandbox.ErrRedirect, false},
		{"not sent", sandbox.NotSent(fmt.Errorf("x: %w", sandbox.ErrBadRequest)), sandbox.ErrBadRequest, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if !errors.Is(tt.err, tt.kind) {
				t.Errorf("%v does not match %v", tt.err, tt.kind)
			}
			if got := sandbox.OutcomeUnknown(tt.err); got != tt.unknown {
				t.Errorf("OutcomeUnknown(%v) = %v, want %v", tt.err, got, tt.unknown)
			}
		})
	}
	if sandbox.OutcomeUnknown(nil) {
		t.Error("OutcomeUnknown(nil) = true")
	}
}

func TestSafeAddress(t *testing.T) {
	for _, tc := range []struct {
		id, domain string
		ok         bool
	}{
		{"i5c2b8x1", "e2b.app", true},
		{"sbx-01", "", true},
		{"sbx", "cube.app", true},
		{"", "e2b.app", false},
		{"evil.example#", "e2b.app", false},
		{"sbx", "evil.example:8080", false},
		{"sbx", "user@evil.example", false},
		{"sbx/../x", "e2b.app", false},
		{"sbx", "evil.example/x", false},
	} {
		if got := sandbox.SafeAddress(sandbox.Sandbox{ID: tc.id, Domain: tc.domain}); got != tc.ok {
			t.Errorf("SafeAddress(%q, %q) = %v, want %v", tc.id, tc.domain, got, tc.ok)
		}
	}
}
