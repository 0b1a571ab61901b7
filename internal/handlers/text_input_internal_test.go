package handlers

import (
	"strings"
	"testing"
)

// BenchmarkJSONTextProblem measures the check every JSON request body
// passes before its handler: an agent runtime's exec body (clean, the
// common case, which skips the walk) and one holding an escaped NUL (which
// is walked to name the field).
func BenchmarkJSONTextProblem(b *testing.B) {
	for _, tc := range []struct{ name, body string }{
		{"clean exec body", `{"command":"go test ./... -run TestGateway -count=1","cwd":"src","env":{"GOFLAGS":"-mod=mod"},"tty":false,"wait_ms":30000}`},
		{"escaped NUL", `{"command":"echo \u0000","cwd":"src","env":{"GOFLAGS":"-mod=mod"},"tty":false,"wait_ms":30000}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(tc.body)
			b.ReportAllocs()
			for b.Loop() {
				jsonTextProblem(body)
			}
		})
	}
}

// TestJSONTextProblemSkipsOnlyCleanBodies: the shortcut never hides a
// problem the walk would name.
func TestJSONTextProblemSkipsOnlyCleanBodies(t *testing.T) {
	tests := []struct {
		name, body, field string
	}{
		{"clean", `{"command":"ls","env":{"A":"b"}}`, ""},
		{"escaped NUL in a value", `{"command":"ls\u0000"}`, "command"},
		{"escaped NUL in a nested key", `{"env":{"A\u0000":"b"}}`, "env"},
		{"invalid UTF-8", "{\"command\":\"ls \xff\"}", "command"},
		{"too deep", strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1), "[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := jsonTextProblem([]byte(tt.body))
			if tt.field == "" {
				if p != nil {
					t.Fatalf("a clean body was refused: %+v", p)
				}
				return
			}
			if p == nil || !strings.HasPrefix(p.field, tt.field) {
				t.Fatalf("problem %+v, want one naming %q", p, tt.field)
			}
		})
	}
}
