package handlers_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// gatehouse_gateway_record_duration_seconds, as docs/operations.md
// describes it: one sample per exec and per stdin write (a keystroke, or
// closing stdin) whose record was committed and which was then
// forwarded; a refused exec or keystroke (no record, no forward), whether
// before its commit or in it, and a read add none.
func TestRecordMetricCountsForwardedOperations(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		metricsSrv := httptest.NewServer(f.e.c.MetricsHandler())
		t.Cleanup(metricsSrv.Close)
		const family = "gatehouse_gateway_record_duration_seconds"
		count := func(op string) float64 {
			return value(scrape(t, metricsSrv.URL), family, map[string]string{"operation": op})
		}
		if n := count("exec") + count("stdin"); n != 0 {
			t.Fatalf("%v samples before any operation", n)
		}

		const execs = 3
		var ended outputJSON
		for range execs {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "true", "wait_ms": 5000})
			wantStatus(t, "exec true", r, http.StatusCreated)
			r.decode(t, &ended)
		}
		// Refused in its commit, the command's end being recorded:
		// nothing is recorded or forwarded, so nothing is timed.
		waitCommandEnded(t, f, ended.CommandID)
		wantStatus(t, "type into an ended command", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", ended.CommandID), "member",
			map[string]any{"text": "line\n"}), http.StatusConflict)
		if got := count("stdin"); got != 0 {
			t.Fatalf("stdin samples = %v after a refused keystroke, want 0", got)
		}
		// Refused by the agent's command policy: nothing is recorded or
		// forwarded, so nothing is timed.
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "rm -rf / --no-preserve-root"})
		wantStatus(t, "exec refused by policy", r, http.StatusForbidden)
		if got := count("exec"); got != execs {
			t.Fatalf("exec samples = %v, want %d (one per forwarded exec)", got, execs)
		}

		r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "cat", "stdin": true})
		wantStatus(t, "start cat", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		const keys = 2
		for range keys {
			wantStatus(t, "type a line", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "member",
				map[string]any{"text": "line\n"}), http.StatusNoContent)
		}
		// Closing stdin is recorded, and timed, as a keystroke is.
		wantStatus(t, "close stdin", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "member",
			map[string]any{"eof": true}), http.StatusNoContent)
		// A read is no operation on the command.
		wantStatus(t, "read output", f.call(http.MethodGet, f.sessionPath("/commands/%d/output?wait_ms=0", o.CommandID), "member", nil), http.StatusOK)
		if got := count("stdin"); got != keys+1 {
			t.Fatalf("stdin samples = %v, want %d (one per forwarded keystroke and the close)", got, keys+1)
		}
		if got := count("exec"); got != execs+1 {
			t.Fatalf("exec samples = %v, want %d", got, execs+1)
		}
		waitCommandEnded(t, f, o.CommandID) // cat ends at the end of its stdin
	})
}
