package sessions

import (
	"testing"
	"time"
)

// TestRuntimeStaysBounded: past maxCached entries the cache drops what is
// stale and the gates nobody holds, keeping fresh entries and held gates.
func TestRuntimeStaysBounded(t *testing.T) {
	r := NewRuntime()
	now := time.Now()
	held := r.gate(cacheKey{org: "acme", id: -1})
	held.TryLock()
	defer held.Unlock()
	for i := 0; i < maxCached; i++ {
		k := cacheKey{org: "acme", id: int64(i)}
		r.gate(k)
		r.put(k, &cached{checked: now.Add(-time.Minute), refresh: time.Second})
	}
	fresh := cacheKey{org: "acme", id: maxCached}
	r.put(fresh, &cached{checked: now, refresh: time.Second})
	if _, ok := r.get(fresh); !ok || len(r.cache) != 1 {
		t.Errorf("after pruning: %d cached, fresh kept %v", len(r.cache), ok)
	}
	if len(r.gates) != 1 || r.gates[cacheKey{org: "acme", id: -1}] != held {
		t.Errorf("after pruning: %d gates, held gate kept %v", len(r.gates), r.gates[cacheKey{org: "acme", id: -1}] == held)
	}
}
