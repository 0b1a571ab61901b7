package e2bfake

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// halfFreezing is a process whose freeze stops part of its tree and then
// fails, as a process stuck in uninterruptible sleep makes stopTree fail.
type halfFreezing struct {
	nopProcess
	frozen atomic.Bool
	thawed atomic.Int32
}

func (p *halfFreezing) Freeze() error {
	p.frozen.Store(true)
	return errors.New("process 42 did not stop (state D)")
}

func (p *halfFreezing) Thaw() error {
	p.frozen.Store(false)
	p.thawed.Add(1)
	return nil
}

type halfFreezingLauncher struct{ p *halfFreezing }

func (l halfFreezingLauncher) Launch(context.Context, LaunchSpec) (Process, error) { return l.p, nil }

// TestFailedPauseLeavesTheSandboxRunning: a pause whose freeze fails
// part-way answers 500 and continues what it stopped, so the sandbox it
// still reports running is not left half-frozen.
func TestFailedPauseLeavesTheSandboxRunning(t *testing.T) {
	t.Parallel()
	p := &halfFreezing{}
	s, err := New(Config{Launcher: halfFreezingLauncher{p}, APIKey: "k", AgentdToken: "0123456789abcdef", WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	do := func(method, path, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("X-API-Key", "k")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		return w
	}
	w := do(http.MethodPost, "/sandboxes", `{"templateID":"base","timeout":300}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	var id string
	for k := range s.sandboxes {
		id = k
	}
	if w := do(http.MethodPost, "/sandboxes/"+id+"/pause", ""); w.Code != http.StatusInternalServerError {
		t.Fatalf("pause with a failing freeze: %d %s", w.Code, w.Body)
	}
	snap, _ := s.Inspect(id)
	if snap.State != sandbox.StateRunning || p.frozen.Load() || p.thawed.Load() != 1 {
		t.Fatalf("after the failed pause: state %s, frozen %v, thawed %d times; want running and continued", snap.State, p.frozen.Load(), p.thawed.Load())
	}
}
