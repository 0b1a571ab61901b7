package gateway

import "testing"

// TestRunningCapWords: the caps' count counts one past a cap, so a user
// over a cap lowered since their commands started is told "more than",
// not a count that stopped at the cap; a cap that is off counts nothing.
func TestRunningCapWords(t *testing.T) {
	const then = "wait for one to end, or kill one, first"
	for _, c := range []struct {
		limit, countTo int
		counted        int64
		want           string
	}{
		{20, 21, 20, "You have 20 running commands, the most allowed per user; " + then + "."},
		{20, 21, 21, "You have more running commands than the 20 allowed per user; " + then + "."},
		{1, 2, 1, "You have 1 running command, the most allowed per user; " + then + "."},
		{0, 0, 0, ""},
	} {
		if got := countTo(c.limit); got != c.countTo {
			t.Errorf("cap %d: counted to %d, want %d", c.limit, got, c.countTo)
		}
		if c.want == "" {
			continue
		}
		if got := capMessage("You have", c.counted, "running command", c.limit, "per user", then); got != c.want {
			t.Errorf("cap %d, counted %d: %q, want %q", c.limit, c.counted, got, c.want)
		}
	}
}
