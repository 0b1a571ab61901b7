package views

import (
	"strings"
	"testing"
	"time"
)

func TestLifecycle(t *testing.T) {
	t.Parallel()
	used := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	base := SessionTimes{SandboxMode: "per-session", LastUsed: used, Idle: 15 * time.Minute, Reclaim: 90 * time.Minute}
	cases := []struct {
		name  string
		edit  func(*SessionTimes)
		wants []string
	}{
		{"running", func(*SessionTimes) {}, []string{"Pauses after 15 min without use: around 2026-03-04 10:15 UTC", "1 h 30 min after pausing: around 2026-03-04 11:45 UTC"}},
		{"paused", func(s *SessionTimes) { s.State = "paused" }, []string{"next use resumes it", "around 2026-03-04 11:45 UTC"}},
		{"pending", func(s *SessionTimes) { s.State = "pending" }, []string{"created on first use", "after 15 min without use", "after 1 h 30 min paused"}},
		{"host", func(s *SessionTimes) { s.SandboxMode = "off" }, []string{"nothing pauses or reclaims it"}},
		{"closed", func(s *SessionTimes) { s.State = "closed" }, []string{"Ended", "recordings"}},
		{"lost", func(s *SessionTimes) { s.State = "lost" }, []string{"Ended"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			s.State = "running"
			tc.edit(&s)
			got := Lifecycle(s)
			for _, w := range tc.wants {
				if !strings.Contains(got, w) {
					t.Fatalf("%q lacks %q", got, w)
				}
			}
		})
	}
}
