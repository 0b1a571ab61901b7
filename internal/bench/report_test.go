package bench

import (
	"strings"
	"testing"
	"time"
)

// The report prints, under the exec and keystroke figures, the p50 of the
// gateway's record commits and the floor they set: (direct + commit) ÷
// direct, what docs/operations.md says it shows; a run without commit
// times (an older Result) prints neither line.
func TestPrintShowsTheCommitFloor(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x * float64(time.Millisecond))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		r         Result
		want, not []string
	}{
		{
			name: "commit times collected",
			r: Result{Dialect: "postgres", ExecDirect: ms(2, 2, 2), ExecGW: ms(3.5, 3.5, 3.5), ExecRecord: ms(0.9, 1, 1.1),
				KeyDirect: ms(0.5), KeyGW: ms(1.2), KeyRecord: ms(0.4)},
			want: []string{"of which the exec's record committed first, p50", "1.00 ms", "(direct + commit) ÷ direct = 1.50×",
				"of which the keystroke's record committed first, p50", "0.40 ms"},
		},
		{
			name: "none collected",
			r:    Result{Dialect: "sqlite", ExecDirect: ms(2), ExecGW: ms(3), KeyDirect: ms(0.5), KeyGW: ms(1)},
			not:  []string{"record committed first", "(direct + commit)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			Print(&b, Config{}, []*Result{&tc.r})
			out := b.String()
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("report lacks %q:\n%s", w, out)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("report has %q:\n%s", n, out)
				}
			}
		})
	}
}
