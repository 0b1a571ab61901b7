package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/gateway"
)

// The commit times printed with the exec and keystroke figures are the
// timed runs' own: a commit from before the runs or from their warm-ups
// is dropped, and each timed gateway run's is kept, in order.
func TestTimeRecordedKeepsOnlyTheTimedRunsCommits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		n, warm int
	}{
		{name: "fewer runs than warm-ups", n: 5, warm: 5},
		{name: "as many runs as warm-ups", n: 20, warm: 20},
		{name: "more runs than warm-ups", n: 50, warm: 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &Stack{records: &recordTimes{}}
			s.records.add(gateway.RecordedExec, time.Hour) // from an earlier phase
			calls := 0
			direct := func() (time.Duration, error) { return time.Millisecond, nil }
			viaGateway := func() (time.Duration, error) {
				calls++
				// The gateway's commit of this run, numbered by call; a
				// keystroke's record is told under another operation.
				s.records.add(gateway.RecordedExec, time.Duration(calls))
				s.records.add(gateway.RecordedStdin, time.Minute)
				return 2 * time.Millisecond, nil
			}
			da, db, rec, err := s.timeRecorded(context.Background(), gateway.RecordedExec, tc.n, direct, viaGateway)
			if err != nil {
				t.Fatal(err)
			}
			if len(da) != tc.n || len(db) != tc.n {
				t.Fatalf("%d direct and %d gateway timings, want %d each", len(da), len(db), tc.n)
			}
			var want []time.Duration
			for i := tc.warm + 1; i <= tc.warm+tc.n; i++ {
				want = append(want, time.Duration(i))
			}
			if !slices.Equal(rec, want) {
				t.Errorf("commit times %v, want the timed runs' %v", rec, want)
			}
		})
	}
}
