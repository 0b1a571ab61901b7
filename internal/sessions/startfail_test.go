package sessions_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestFailedStartMarksEnvironment (issue 26, item 1): a backend that
// answers its health and template calls but fails to start a sandbox
// marks its environment degraded with the backend's reason, audited; the
// person starting the session is told what to do; the environment's
// probes keep it degraded while nothing starts; the next sandbox that
// starts makes it healthy again.
func TestFailedStartMarksEnvironment(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
		ctx := context.Background()
		svc := w.svc(nil)
		sess := w.newSession(t, svc, sys())
		health := func() envs.Environment {
			t.Helper()
			e, err := w.envs.Get(ctx, sys(), w.env.ID)
			if err != nil {
				t.Fatal(err)
			}
			return e
		}

		remove := w.fake.InjectFault(e2bfake.Fault{Route: "POST /sandboxes", Status: 500})
		_, err := svc.Ensure(ctx, sys(), sess.ID)
		if err == nil {
			t.Fatal("a failing backend started the session")
		}
		for _, want := range []string{"create the session's sandbox", `Environment "sandboxes" is marked degraded`, "start the session again"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal %q does not say %q", err, want)
			}
		}
		e := health()
		if e.HealthStatus != envs.HealthDegraded || !strings.HasPrefix(e.HealthError, envs.StartFailedPrefix) {
			t.Fatalf("after a failed start the environment is %s (%q), want degraded for the start", e.HealthStatus, e.HealthError)
		}
		if acts := w.envActions(t, e.ID); !contains(acts, "environment.health_change") {
			t.Errorf("the change to degraded is not audited: %v", acts)
		}

		// Its backend still answers health and templates: the probe keeps
		// the failed start, rather than call it healthy.
		if h, err := w.envs.CheckAndRecord(ctx, e, w.log, 5*time.Second); err != nil || h.Status != envs.HealthDegraded || !strings.HasPrefix(h.Error, envs.StartFailedPrefix) {
			t.Fatalf("a probe after the failed start found %s (%q), err %v; want it still degraded for the start", h.Status, h.Error, err)
		}

		remove()
		if _, err := svc.Ensure(ctx, sys(), sess.ID); err != nil {
			t.Fatalf("start once the backend works: %v", err)
		}
		if e := health(); e.HealthStatus != envs.HealthHealthy || e.HealthError != "" {
			t.Fatalf("after a sandbox started the environment is %s (%q), want healthy", e.HealthStatus, e.HealthError)
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// envActions returns the actions recorded for an environment, oldest first.
func (w *world) envActions(t testing.TB, id int64) []string {
	t.Helper()
	var out []string
	if err := w.db.Table(audit.OrgTable).Where("target_type = ? AND target_id = ?", "environment", strconv.FormatInt(id, 10)).Order("seq").Pluck("action", &out).Error; err != nil {
		t.Fatal(err)
	}
	return out
}
