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

// TestKillBeforeCreate: a kill that names an id before its create arrived
// (a session's close racing an exec on its way) is answered "no such
// session", and the create that arrives afterwards does not start: a kill
// is never lost to the order two requests arrive in. Other ids start.
func TestKillBeforeCreate(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	if _, err := c.Kill(ctx, "gh-late-create"); !errors.Is(err, agentd.ErrNotFound) {
		t.Fatalf("kill of an id not yet created = %v, want not_found", err)
	}
	_, err := c.CreateSession(ctx, agentd.CreateSessionRequest{ID: "gh-late-create", Command: "sleep 60"})
	var ae *agentd.Error
	if !errors.Is(err, agentd.ErrKilledFirst) || !errors.As(err, &ae) || ae.Status != 409 {
		t.Fatalf("create after its kill = %v, want 409 killed_first", err)
	}
	if _, err := c.Poll(ctx, "gh-late-create", 0, 0); !errors.Is(err, agentd.ErrNotFound) {
		t.Fatalf("the refused create left a session: poll = %v", err)
	}
	if _, err := c.CreateSession(ctx, agentd.CreateSessionRequest{ID: "gh-never-killed", Command: "true", WaitMS: 5000}); err != nil {
		t.Fatalf("another id: %v", err)
	}
}
