//go:build unix

package agentd_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TestClientChosenSessionID: a client may name a session up front (the
// gateway records a command before starting it); the id is then used like
// agentd's own, and one id starts at most one session.
func TestClientChosenSessionID(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{ID: "gh-0123abcd", Command: "printf named", WaitMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if resp.SessionID != "gh-0123abcd" {
		t.Fatalf("session id %q", resp.SessionID)
	}
	got, err := c.Poll(ctx, "gh-0123abcd", 0, 0)
	if err != nil || len(got.Chunks) != 1 || string(got.Chunks[0].Data) != "named" {
		t.Fatalf("poll by chosen id = %+v, %v", got, err)
	}
	t.Run("an id in use is refused", func(t *testing.T) {
		_, err := c.CreateSession(ctx, agentd.CreateSessionRequest{ID: "gh-0123abcd", Command: "true"})
		if !errors.Is(err, agentd.ErrIDInUse) {
			t.Fatalf("reuse = %v, want id_in_use", err)
		}
	})
	t.Run("concurrent starts of one id start one session", func(t *testing.T) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		started := 0
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.CreateSession(ctx, agentd.CreateSessionRequest{ID: "race-1", Command: "sleep 0.2"}); err == nil {
					mu.Lock()
					started++
					mu.Unlock()
				} else if !errors.Is(err, agentd.ErrIDInUse) {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if started != 1 {
			t.Fatalf("%d sessions started for one id", started)
		}
	})
	for _, bad := range []string{"has space", "slash/no", strings.Repeat("x", 65), "ünï"} {
		_, err := c.CreateSession(ctx, agentd.CreateSessionRequest{ID: bad, Command: "true"})
		if !errors.Is(err, agentd.ErrBadRequest) {
			t.Errorf("id %q = %v, want bad_request", bad, err)
		}
	}
}
