package sessions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestPersistentWorkspace: on an environment with a workspace mount, a
// session's sandbox is created with the host-mount metadata and works in
// the session's host directory; reclaiming it kills the sandbox but keeps
// the session (pending, audited with the reason), and the next use creates
// a new sandbox over the same files, even after the environment's template
// was changed. A session created before the mount was set is closed by
// reclamation as before. Real agentd processes through the fake in
// CubeSandbox mode.
func TestPersistentWorkspace(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		prefix := t.TempDir()
		w := newWorld(t, d, e2bfake.Config{CubeSandbox: true, HostMountPrefix: prefix})
		w.envs.MountPrefix = prefix
		ctx := context.Background()
		svc := w.svc(nil)
		setMount := func(tpl string) {
			t.Helper()
			if _, _, err := w.envs.Update(ctx, sys(), w.env.ID, envs.Input{WorkspaceMount: &tpl}); err != nil {
				t.Fatalf("set workspace mount: %v", err)
			}
		}
		unmounted := w.newSession(t, svc, sys())
		setMount(prefix + "/{org}/sessions/{session}")
		sess := w.newSession(t, svc, sys())
		dir := filepath.Join(prefix, testOrg, "sessions", fmt.Sprint(sess.ID))
		if sess.Workspace != dir || sess.WorkspaceMount != dir || unmounted.WorkspaceMount != "" {
			t.Fatalf("workspace %q on %q (unmounted: %q), want both %q", sess.Workspace, sess.WorkspaceMount, unmounted.WorkspaceMount, dir)
		}

		tg, err := svc.Ensure(ctx, sys(), sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		first := tg.Session.SandboxID
		snap, ok := w.fake.Inspect(first)
		if !ok {
			t.Fatalf("the sandbox %s is not in the fake", first)
		}
		var mounts []map[string]any
		if err := json.Unmarshal([]byte(snap.Metadata[sessions.MetaHostMount]), &mounts); err != nil || len(mounts) != 1 ||
			mounts[0]["hostPath"] != dir || mounts[0]["mountPath"] != dir || mounts[0]["readOnly"] != false {
			t.Fatalf("host-mount metadata = %q (%v)", snap.Metadata[sessions.MetaHostMount], err)
		}
		if got := strings.TrimSpace(run(t, tg, "echo kept > notes.txt && pwd")); got != dir || snap.Workspace != dir {
			t.Fatalf("the sandbox works in %q (fake: %q), want %q", got, snap.Workspace, dir)
		}
		tgU, err := svc.Ensure(ctx, sys(), unmounted.ID)
		if err != nil {
			t.Fatal(err)
		}
		snapU, ok := w.fake.Inspect(tgU.Session.SandboxID)
		if !ok {
			t.Fatalf("the unmounted session's sandbox %q is not in the fake", tgU.Session.SandboxID)
		}
		if snapU.Metadata[sessions.MetaHostMount] != "" {
			t.Errorf("a session from before the mount asked for one: %v", snapU.Metadata)
		}

		// Idle past the timeout, then paused past the agent's window.
		w.fake.Advance(6 * time.Minute)
		w.fake.Advance(61 * time.Minute)
		setMount(prefix + "/{org}/moved/{session}")
		if st := w.reclaimOnce(t); st.Reclaimed != 2 || st.Lost+st.Orphans != 0 {
			t.Fatalf("round = %+v, want both reclaimed", st)
		}
		if _, ok := w.fake.Inspect(first); ok {
			t.Errorf("the reclaimed sandbox %s is still there", first)
		}
		wantState(t, svc, unmounted.ID, sessions.StateClosed)
		back := wantState(t, svc, sess.ID, sessions.StatePending)
		if back.SandboxID != "" || back.BackendState != "" || back.ClosedAt != nil || !strings.Contains(back.Reason, "workspace kept at "+dir) {
			t.Errorf("after reclaim: %+v", back)
		}
		var ev struct{ Actor, Details string }
		if err := w.db.Table(audit.OrgTable).Select("actor_name AS actor, details").Where("target_type = ? AND target_id = ? AND action = ?",
			"session", fmt.Sprint(sess.ID), "session.reclaim").Take(&ev).Error; err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"state":"pending"`, first, "workspace_kept", "paused for"} {
			if !strings.Contains(ev.Details, want) {
				t.Errorf("reclaim audit %s lacks %s", ev.Details, want)
			}
		}
		if ev.Actor != sessions.SystemActor().Name {
			t.Errorf("reclaimed by %q", ev.Actor)
		}

		tg2, err := svc.Ensure(ctx, sys(), sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		if tg2.Session.SandboxID == "" || tg2.Session.SandboxID == first || tg2.Session.State != sessions.StateRunning {
			t.Fatalf("next use: %+v", tg2.Session)
		}
		if got := run(t, tg2, "cat notes.txt"); got != "kept\n" {
			t.Errorf("the new sandbox reads %q", got)
		}
		if got := w.auditActions(t, sess.ID); strings.Join(got, " ") != "session.start session.reclaim session.start" {
			t.Errorf("audit = %v", got)
		}
		if st := w.reclaimOnce(t); st.Reclaimed+st.Lost+st.Orphans+st.Synced != 0 {
			t.Errorf("a round after the new sandbox = %+v", st)
		}
	})
}
