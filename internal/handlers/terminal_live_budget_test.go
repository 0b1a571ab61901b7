package handlers_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestLiveWindowBudget: with the live window's budget far below what the
// running commands printed, the window stays within it, and a poll from
// cursor 0 of each still running command gets all its output, the part
// the budget pushed out read from the recording.
func TestLiveWindowBudget(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	const budget = 256 << 10
	f.e.c.Gateway.Followers.LiveBudget = budget // no follower runs yet
	var want strings.Builder
	for i := 1; i <= 150000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	var ids []int64
	for range 3 {
		// Prints about 0.9 MiB, then runs on until its stdin closes.
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "seq 1 150000; cat >/dev/null", "stdin": true, "wait_ms": 0})
		wantStatus(t, "exec", r, http.StatusCreated)
		var o gateway.Output
		r.decode(t, &o)
		ids = append(ids, o.CommandID)
	}
	// The followers read it all: the budget pushed most of it out.
	deadline := time.Now().Add(60 * time.Second)
	for {
		u := f.e.c.Gateway.Followers.LiveWindow()
		held, evicted := u.Held, u.Evicted
		if held > budget {
			t.Fatalf("the live window holds %d bytes, over its budget of %d", held, budget)
		}
		if evicted > 2*int64(want.Len()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s the budget pushed out %d bytes, want over %d", evicted, 2*want.Len())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range ids {
		var got bytes.Buffer
		cursor := uint64(0)
		for got.Len() < want.Len() {
			r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", id, cursor), "member", nil)
			wantStatus(t, "poll output", r, http.StatusOK)
			var o outputJSON
			r.decode(t, &o)
			for _, ch := range o.Chunks {
				if ch.ID <= cursor {
					t.Fatalf("command %d: chunk %d again after cursor %d", id, ch.ID, cursor)
				}
				if ch.Stream == "stdout" {
					got.Write(ch.Data)
				}
				cursor = ch.ID
			}
			cursor = max(cursor, o.NextCursor)
			if o.State != "running" {
				t.Fatalf("command %d ended (%s) before its output was read", id, o.State)
			}
		}
		if got.String() != want.String() {
			t.Fatalf("command %d: a poll from cursor 0 got %d bytes, not the %d printed", id, got.Len(), want.Len())
		}
		wantStatus(t, "close stdin", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", id), "member", map[string]any{"eof": true}), http.StatusNoContent)
	}
	for _, id := range ids {
		waitCommandEnded(t, f, id)
	}
	waitFollowersIdle(t, f.e)
}
