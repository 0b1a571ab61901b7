package bench

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A request is tallied when its round trips were counted from its start:
// one that entered before the profile turned on (its trips uncounted)
// would lower the round trips per request, and is left out.
func TestProfileTalliesRequestsCountedFromTheirStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		atStart, on bool
		want        int
	}{
		{name: "counting throughout", atStart: true, on: true, want: 1},
		{name: "counting began meanwhile", atStart: false, on: true, want: 0},
		{name: "counting ended meanwhile", atStart: true, on: false, want: 0},
		{name: "not counting", atStart: false, on: false, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newProfile()
			p.Reset(tc.atStart)
			h := withOpCounter(p, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { p.Reset(tc.on) }))
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/api/v1/sessions/1/commands", nil))
			got := 0
			if tl := p.tallies["exec"]; tl != nil {
				got = tl.requests
			}
			if got != tc.want {
				t.Errorf("%d exec requests tallied, want %d", got, tc.want)
			}
			if n := p.inFlight("exec"); n != 0 {
				t.Errorf("%d exec requests still in flight after it returned", n)
			}
		})
	}
}
