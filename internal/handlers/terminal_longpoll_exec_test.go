package handlers_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestLongPollWaitsPastExecRecords: agentd's exec records are not given to
// readers, so a long-poll of a running command whose only news is exec
// records keeps waiting for output instead of answering an empty batch at
// once (which made every client spin). The check is the long-poll's own
// contract — an empty answer of a running command comes after its wait —
// not a speed.
func TestLongPollWaitsPastExecRecords(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		onAgentdProcess(t, f)
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
			"command": "echo ready; /bin/true; /bin/true; sleep 1; /bin/true; exec sleep 30"})
		wantStatus(t, "exec", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		cursor, seen := uint64(0), ""
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(seen, "ready"); {
			if time.Now().After(deadline) {
				t.Fatalf("no output after 30 s: %q", seen)
			}
			r = f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", o.CommandID, cursor), "member", nil)
			wantStatus(t, "poll", r, http.StatusOK)
			var out outputJSON
			r.decode(t, &out)
			for _, ch := range out.Chunks {
				seen += string(ch.Data)
			}
			cursor = out.NextCursor
		}
		const wait = 2500 * time.Millisecond
		start := time.Now()
		r = f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=%d", o.CommandID, cursor, wait.Milliseconds()), "member", nil)
		took := time.Since(start)
		wantStatus(t, "long-poll", r, http.StatusOK)
		var out outputJSON
		r.decode(t, &out)
		if len(out.Chunks) != 0 || out.State != "running" {
			t.Fatalf("long-poll answered %d chunks, state %s", len(out.Chunks), out.State)
		}
		if took < wait-100*time.Millisecond {
			t.Fatalf("an empty answer of a running command came after %v, before its wait of %v", took, wait)
		}
		f.call(http.MethodPost, f.sessionPath("/commands/%d/kill", o.CommandID), "member", nil)
	})
}
