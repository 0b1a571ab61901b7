package audit_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
)

func TestParseQuery(t *testing.T) {
	t.Parallel()
	day := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }
	tests := []struct {
		name    string
		q       string
		want    audit.Filter
		wantErr string // substring of the "q" field message
	}{
		{name: "empty", q: "  ", want: audit.Filter{}},
		{name: "actor", q: "actor:jane@example.com", want: audit.Filter{Actor: "jane@example.com"}},
		{name: "quoted actor", q: `actor:"Jane Doe"`, want: audit.Filter{Actor: "Jane Doe"}},
		{name: "action prefix", q: "action:agent.", want: audit.Filter{Action: "agent."}},
		{name: "target", q: `target:"db 2"`, want: audit.Filter{Target: "db 2"}},
		{name: "decision any case", q: "decision:DENY", want: audit.Filter{Decision: audit.Deny}},
		{name: "decision allow", q: "decision:allow", want: audit.Filter{Decision: audit.Allow}},
		{name: "from date", q: "from:2026-01-02", want: audit.Filter{From: day(2026, 1, 2)}},
		{name: "to date is inclusive", q: "to:2026-01-02", want: audit.Filter{Until: day(2026, 1, 3)}},
		{name: "same day range", q: "from:2026-01-02 to:2026-01-02", want: audit.Filter{From: day(2026, 1, 2), Until: day(2026, 1, 3)}},
		{name: "rfc3339", q: "from:2026-01-02T10:00:00+02:00 to:2026-01-02T12:00:00Z",
			want: audit.Filter{From: time.Date(2026, 1, 2, 8, 0, 0, 0, time.UTC), Until: time.Date(2026, 1, 2, 12, 0, 0, 1000, time.UTC)}},
		{name: "free text", q: "kubectl  get", want: audit.Filter{Text: []string{"kubectl", "get"}}},
		{name: "quoted phrase", q: `"rm -rf" action:agent.exec`, want: audit.Filter{Text: []string{"rm -rf"}, Action: "agent.exec"}},
		{name: "unknown key is text", q: "http://example.com foo:bar", want: audit.Filter{Text: []string{"http://example.com", "foo:bar"}}},
		{name: "quoted key is text", q: `"actor:x"`, want: audit.Filter{Text: []string{"actor:x"}}},
		{name: "wildcards kept literal", q: "100%_done", want: audit.Filter{Text: []string{"100%_done"}}},
		{name: "all", q: `actor:u1 action:user. target:prod decision:deny from:2026-01-01 to:2026-01-31 boom`,
			want: audit.Filter{Actor: "u1", Action: "user.", Target: "prod", Decision: audit.Deny,
				From: day(2026, 1, 1), Until: day(2026, 2, 1), Text: []string{"boom"}}},

		{name: "bad decision", q: "decision:maybe", wantErr: `Unknown decision "maybe"`},
		{name: "bad from", q: "from:yesterday", wantErr: "from:yesterday is not a date"},
		{name: "bad to", q: "to:2026-13-01", wantErr: "to:2026-13-01 is not a date"},
		{name: "from after to", q: "from:2026-02-01 to:2026-01-01", wantErr: "from: must be before to:"},
		{name: "empty value", q: "actor:", wantErr: "needs a value"},
		{name: "twice", q: "actor:a actor:b", wantErr: "given twice"},
		{name: "unclosed quote", q: `actor:"Jane`, wantErr: "quote is not closed"},
		{name: "short free text", q: "rm", wantErr: "at least 3 characters"},
		{name: "short term beside a filter", q: "action:agent. zq", wantErr: `"zq" is too short`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := audit.ParseQuery(tc.q)
			if tc.wantErr != "" {
				var ve *apperr.ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("ParseQuery(%q) error = %v, want a validation error", tc.q, err)
				}
				if !strings.Contains(ve.Fields["q"], tc.wantErr) {
					t.Fatalf("ParseQuery(%q) q message = %q, want it to contain %q", tc.q, ve.Fields["q"], tc.wantErr)
				}
				if !errors.Is(err, apperr.ErrInvalid) {
					t.Fatalf("error should match apperr.ErrInvalid")
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseQuery(%q): %v", tc.q, err)
			}
			if got.Query != tc.q {
				t.Fatalf("ParseQuery(%q) keeps the query %q", tc.q, got.Query)
			}
			got.Query = ""
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseQuery(%q) =\n %+v\nwant\n %+v", tc.q, got, tc.want)
			}
		})
	}
}
