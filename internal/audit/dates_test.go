package audit_test

import (
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
)

// TestSplitJoinDates checks that the audit page's date inputs and search
// box round-trip a search: dates come out, everything else stays as typed.
func TestSplitJoinDates(t *testing.T) {
	t.Parallel()
	cases := []struct {
		q, rest, from, to string
	}{
		{"", "", "", ""},
		{"actor:jane from:2026-01-02 to:2026-01-31", "actor:jane", "2026-01-02", "2026-01-31"},
		{`target:"prod box" "rm -rf" from:2026-01-02`, `target:"prod box" "rm -rf"`, "2026-01-02", ""},
		{"from:2026-01-02T15:04:05Z kubectl", "from:2026-01-02T15:04:05Z kubectl", "", ""},
		{`"actor:x" to:2026-02-01`, `"actor:x"`, "", "2026-02-01"},
	}
	for _, tc := range cases {
		rest, from, to := audit.SplitDates(tc.q)
		if rest != tc.rest || from != tc.from || to != tc.to {
			t.Errorf("SplitDates(%q) = %q, %q, %q; want %q, %q, %q", tc.q, rest, from, to, tc.rest, tc.from, tc.to)
		}
		want, err := audit.ParseQuery(tc.q)
		if err != nil {
			t.Fatalf("ParseQuery(%q): %v", tc.q, err)
		}
		got, err := audit.ParseQuery(audit.JoinDates(rest, from, to))
		if err != nil {
			t.Fatalf("ParseQuery(JoinDates(%q)): %v", tc.q, err)
		}
		if got.Actor != want.Actor || got.Target != want.Target || !got.From.Equal(want.From) || !got.Until.Equal(want.Until) || len(got.Text) != len(want.Text) {
			t.Errorf("%q does not round-trip: %+v, want %+v", tc.q, got, want)
		}
	}
}
