package sessions_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gatehouse/gatehouse/internal/archivetest"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// countActions counts a session's audit events of action.
func (w *world) countActions(t *testing.T, id int64, action string) int {
	t.Helper()
	n := 0
	for _, a := range w.auditActions(t, id) {
		if a == action {
			n++
		}
	}
	return n
}

// TestSandboxPreparation: per-session sandboxes through the fake (real
// agentd processes). Concurrent first uses on two replicas prepare a new
// sandbox once; a failed preparation kills the half-prepared sandbox and
// leaves the session pending, and the retry prepares a fresh one; a
// persistent (host-mount) workspace is checked, not rewritten, in the new
// sandbox after a reclaim, and prepared again when its files were removed.
func TestSandboxPreparation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		prefix := t.TempDir()
		w := newWorld(t, d, e2bfake.Config{CubeSandbox: true, HostMountPrefix: prefix})
		w.envs.MountPrefix = prefix
		ctx := context.Background()
		docs := archivetest.Zip(t, map[string]string{"DOCS.md": "# docs\n"})
		if _, _, err := w.ags.PutUpload(ctx, sys(), w.agent.ID, agents.UploadInput{Kind: agents.UploadSkill, Name: "docs", FileName: "docs.zip", Body: docs, By: "t"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := w.ags.PutUpload(ctx, sys(), w.agent.ID, agents.UploadInput{Kind: agents.UploadFile, Name: "notes/brief.md", Body: []byte("brief\n"), By: "t"}); err != nil {
			t.Fatal(err)
		}
		setPin := func(t *testing.T, pin string) {
			t.Helper()
			cfg := fmt.Sprintf(`{"model":"m","skills":[{"name":"docs","source":"upload:docs","sha256":%q}]}`, pin)
			if _, _, err := w.ags.Update(ctx, sys(), w.agent.ID, agents.Input{Config: &cfg}); err != nil {
				t.Fatal(err)
			}
		}
		setPin(t, hexSum(docs))

		t.Run("concurrent first uses on two replicas prepare once", func(t *testing.T) {
			sess := w.newSession(t, w.svc(nil), sys())
			replicas := []*sessions.Service{w.svc(nil), w.svc(&sessions.Runtime{Now: w.clock.Now})}
			var wg sync.WaitGroup
			targets := make([]sessions.Target, 6)
			errs := make([]error, 6)
			for i := range targets {
				wg.Add(1)
				go func() {
					defer wg.Done()
					targets[i], errs[i] = replicas[i%2].Ensure(ctx, sys(), sess.ID)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("use %d: %v", i, err)
				}
			}
			if got := run(t, targets[0], "cat .skills/docs/DOCS.md notes/brief.md"); got != "# docs\nbrief\n" {
				t.Errorf("the workspace holds %q", got)
			}
			if n := w.countActions(t, sess.ID, "session.prepare"); n != 1 {
				t.Errorf("%d session.prepare events, want 1", n)
			}
			p, err := w.svc(nil).Preparation(ctx, sys(), sess.ID)
			if err != nil || p == nil || p.Status != sessions.PrepPrepared || len(p.Items) != 2 || p.SandboxID != targets[0].Session.SandboxID {
				t.Fatalf("preparation %+v, %v", p, err)
			}
		})

		t.Run("a failed preparation kills the sandbox and leaves the session pending; the retry prepares a fresh one", func(t *testing.T) {
			setPin(t, strings.Repeat("1", 64))
			svc := w.svc(nil)
			sess := w.newSession(t, svc, sys())
			_, err := svc.Ensure(ctx, sys(), sess.ID)
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != "session_not_prepared" || !strings.Contains(ae.Message, "sha256 mismatch") {
				t.Fatalf("ensure: %v, want session_not_prepared naming the mismatch", err)
			}
			back := wantState(t, svc, sess.ID, sessions.StatePending)
			if back.SandboxID != "" || !strings.Contains(back.Reason, "preparation failed") {
				t.Fatalf("after the failure: %+v", back)
			}
			if ids := w.tagged(t, sess.ID); len(ids) != 0 {
				t.Errorf("the half-prepared sandbox is still there: %v", ids)
			}
			setPin(t, hexSum(docs))
			got, err := svc.Prepare(ctx, sys(), sess.ID)
			if err != nil || got.State != sessions.StateRunning {
				t.Fatalf("retry: %+v %v", got, err)
			}
			tg, err := svc.Ensure(ctx, sys(), sess.ID)
			if err != nil {
				t.Fatal(err)
			}
			if out := run(t, tg, "cat .skills/docs/DOCS.md"); out != "# docs\n" {
				t.Errorf("the fresh sandbox holds %q", out)
			}
			if n := w.countActions(t, sess.ID, "session.prepare"); n != 2 {
				t.Errorf("%d session.prepare events, want the failure and the success", n)
			}
		})

		t.Run("a mount_path outside agentd's root fails the preparation", func(t *testing.T) {
			cfg := `{"model":"m","skills":[{"name":"docs","source":"upload:docs","mount_path":"/etc/gatehouse-docs"}]}`
			if _, _, err := w.ags.Update(ctx, sys(), w.agent.ID, agents.Input{Config: &cfg}); err != nil {
				t.Fatal(err)
			}
			defer setPin(t, hexSum(docs))
			svc := w.svc(nil)
			sess := w.newSession(t, svc, sys())
			_, err := svc.Ensure(ctx, sys(), sess.ID)
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != "session_not_prepared" || !strings.Contains(ae.Message, "path_outside_root") {
				t.Fatalf("ensure: %v, want session_not_prepared naming path_outside_root", err)
			}
			if _, err := os.Stat("/etc/gatehouse-docs"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the skill was placed outside agentd's root: %v", err)
			}
		})

		t.Run("a failure whose reason quotes a long non-ASCII path is recorded: the sandbox killed, the session pending", func(t *testing.T) {
			// 3-byte characters put the reason's 400-byte cut inside one,
			// which Postgres refuses as invalid UTF-8 unless it is cut on
			// a character.
			long := "/etc/" + strings.Repeat("日", 150)
			cfg := fmt.Sprintf(`{"model":"m","skills":[{"name":"docs","source":"upload:docs","mount_path":%q}]}`, long)
			if _, _, err := w.ags.Update(ctx, sys(), w.agent.ID, agents.Input{Config: &cfg}); err != nil {
				t.Fatal(err)
			}
			defer setPin(t, hexSum(docs))
			svc := w.svc(nil)
			sess := w.newSession(t, svc, sys())
			_, err := svc.Ensure(ctx, sys(), sess.ID)
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != "session_not_prepared" {
				t.Fatalf("ensure: %v, want session_not_prepared", err)
			}
			back := wantState(t, svc, sess.ID, sessions.StatePending)
			if back.SandboxID != "" || !utf8.ValidString(back.Reason) {
				t.Fatalf("after the failure: %+v", back)
			}
			if ids := w.tagged(t, sess.ID); len(ids) != 0 {
				t.Errorf("the half-prepared sandbox is still there: %v", ids)
			}
			p, err := svc.Preparation(ctx, sys(), sess.ID)
			if err != nil || p == nil || p.Status != sessions.PrepFailed || !strings.Contains(p.Reason, "日日") || !utf8.ValidString(p.Reason) {
				t.Fatalf("preparation %+v, %v: want it failed, quoting the path", p, err)
			}
		})

		t.Run("a failure quoting a download's NUL status is recorded: the sandbox killed, the session pending", func(t *testing.T) {
			// Postgres text cannot hold NUL: the reason must not carry it.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						buf := make([]byte, 4096)
						_, _ = c.Read(buf)
						_, _ = c.Write([]byte("HTTP/1.1 404 Not\x00Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
					}()
				}
			}()
			cfg := fmt.Sprintf(`{"model":"m","skills":[{"name":"docs","source":"http://%s/docs.tar.gz"}]}`, ln.Addr())
			if _, _, err := w.ags.Update(ctx, sys(), w.agent.ID, agents.Input{Config: &cfg}); err != nil {
				t.Fatal(err)
			}
			defer setPin(t, hexSum(docs))
			svc := w.svc(nil)
			sess := w.newSession(t, svc, sys())
			_, err = svc.Ensure(ctx, sys(), sess.ID)
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != "session_not_prepared" {
				t.Fatalf("ensure: %v, want session_not_prepared", err)
			}
			back := wantState(t, svc, sess.ID, sessions.StatePending)
			if back.SandboxID != "" || strings.IndexByte(back.Reason, 0) >= 0 {
				t.Fatalf("after the failure: %+v", back)
			}
			if ids := w.tagged(t, sess.ID); len(ids) != 0 {
				t.Errorf("the half-prepared sandbox is still there: %v", ids)
			}
			p, err := svc.Preparation(ctx, sys(), sess.ID)
			if err != nil || p == nil || p.Status != sessions.PrepFailed || !strings.Contains(p.Reason, "404") || strings.IndexByte(p.Reason, 0) >= 0 {
				t.Fatalf("preparation %+v, %v: want it failed, quoting the status without NUL", p, err)
			}
		})

		t.Run("a persistent workspace is checked, not rewritten, in a new sandbox; prepared again when removed", func(t *testing.T) {
			tpl := prefix + "/{org}/sessions/{session}"
			if _, _, err := w.envs.Update(ctx, sys(), w.env.ID, envs.Input{WorkspaceMount: &tpl}); err != nil {
				t.Fatal(err)
			}
			svc := w.svc(nil)
			sess := w.newSession(t, svc, sys())
			tg, err := svc.Ensure(ctx, sys(), sess.ID)
			if err != nil {
				t.Fatal(err)
			}
			// A mark inside the unpacked skill: rewriting it (an atomic
			// replace of the directory) would drop the mark.
			run(t, tg, "echo mine > .skills/docs/mark")
			reclaim := func(t *testing.T) sessions.Target {
				t.Helper()
				w.fake.Advance(6 * time.Minute)
				w.fake.Advance(61 * time.Minute)
				if st := w.reclaimOnce(t); st.Reclaimed < 1 {
					t.Fatalf("round = %+v, want the session's sandbox reclaimed", st)
				}
				wantState(t, svc, sess.ID, sessions.StatePending)
				next, err := svc.Ensure(ctx, sys(), sess.ID)
				if err != nil {
					t.Fatal(err)
				}
				if next.Session.SandboxID == tg.Session.SandboxID {
					t.Fatalf("no new sandbox after the reclaim")
				}
				return next
			}
			next := reclaim(t)
			if got := run(t, next, "cat .skills/docs/mark notes/brief.md"); got != "mine\nbrief\n" {
				t.Errorf("the persistent workspace reads %q after the new sandbox", got)
			}
			if n := w.countActions(t, sess.ID, "session.prepare"); n != 1 {
				t.Errorf("%d session.prepare events, want 1: the kept workspace is not prepared again", n)
			}
			// Someone removes the agent's file from the host directory.
			if err := os.Remove(filepath.Join(sess.WorkspaceMount, "notes", "brief.md")); err != nil {
				t.Fatal(err)
			}
			tg = next
			third := reclaim(t)
			if got := run(t, third, "cat notes/brief.md .skills/docs/DOCS.md"); got != "brief\n# docs\n" {
				t.Errorf("after preparing again the workspace reads %q", got)
			}
			if n := w.countActions(t, sess.ID, "session.prepare"); n != 2 {
				t.Errorf("%d session.prepare events, want 2", n)
			}
		})
	})
}
