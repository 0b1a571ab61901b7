package agentd

import "testing"

// TestBlockingRingAddKeepsUnackedOutput: in a blocking ring, whenever fits
// says a write has room, add stores it without evicting output no poller
// asked past. Before the fix fits reserved the write's length while add
// took its rounded-up buffer (or a spare up to four times larger), so a
// write of a non-power-of-two size could evict unread output: a peeking
// watcher saw "truncated" (TestPeekReleasesNothing, under load in CI).
func TestBlockingRingAddKeepsUnackedOutput(t *testing.T) {
	const max = 64 << 10
	for _, spare := range []int{0, 4 * 8 << 10} {
		for n := 1; n <= 80<<10; n += 997 {
			r := ring{max: max, blocking: true}
			if spare > 0 {
				r.recycle(make([]byte, 0, spare), false)
			}
			r.add(streamStdout, make([]byte, 100)) // unread by anyone
			if !r.fits(n) {
				continue
			}
			r.add(streamStdout+1, make([]byte, n)) // another stream: no coalescing
			if res := r.read(0, max); res.dropped > 0 || len(res.chunks) == 0 || res.chunks[0].ID != 1 {
				t.Fatalf("spare %d, write of %d bytes: the unread first chunk was evicted (dropped %d)", spare, n, res.dropped)
			}
			if r.bytes > r.max {
				t.Fatalf("spare %d, write of %d bytes: ring holds %d of %d", spare, n, r.bytes, r.max)
			}
		}
	}
}
