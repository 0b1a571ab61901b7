package sessions_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// templateClient reaches the session's sandbox agentd with the template's
// token, as anyone holding it would.
func templateClient(tg sessions.Target) *agentd.Client {
	return agentd.NewClient(tg.AgentdURL, e2bfaketest.Token, &http.Client{Timeout: 30 * time.Second})
}

// sandboxClient reaches sandbox id's agentd through the fake's proxy with
// the template's token, as the console does right after creating it.
func (w *world) sandboxClient(id string) *agentd.Client {
	return agentd.NewClient(w.fake.ProxyURL()+"/sandbox/"+id+"/49984", e2bfaketest.Token, &http.Client{Timeout: 30 * time.Second})
}

// noTokenIn fails when tok appears in any audit record or the session's
// stored row other than sealed.
func (w *world) noTokenIn(t *testing.T, tok string) {
	t.Helper()
	var details []string
	if err := w.db.Table(audit.OrgTable).Pluck("details", &details).Error; err != nil {
		t.Fatal(err)
	}
	for _, d := range details {
		if strings.Contains(d, tok) {
			t.Fatalf("an audit record holds the per-sandbox token: %s", d)
		}
	}
	var rows []map[string]any
	if err := w.db.Table("sessions").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmt.Sprint(rows), tok) {
		t.Fatal("the sessions table holds the per-sandbox token in the clear")
	}
}

// TestPerSandboxToken: the console rekeys every sandbox it creates before
// anything else reaches it, so the template's token opens it no more, and
// uses the sandbox's own token (sealed on the session) for it alone.
func TestPerSandboxToken(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{})
		ctx := context.Background()
		svc := w.svc(nil)
		sess := w.newSession(t, svc, sys())
		tg, err := svc.Ensure(ctx, sys(), sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		tok := tg.AgentdToken

		t.Run("the sandbox has a token of its own", func(t *testing.T) {
			if tok == e2bfaketest.Token || len(tok) < agentd.MinRekeyTokenLength {
				t.Fatalf("the target's token is the template's or short (%d characters)", len(tok))
			}
			if tg.Session.AgentdTokenKind != sessions.TokenPerSandbox || tg.Session.SealedAgentdToken == "" {
				t.Fatalf("session token kind %q, sealed %v", tg.Session.AgentdTokenKind, tg.Session.SealedAgentdToken != "")
			}
		})
		t.Run("the template's token gets 401 from it, its own works", func(t *testing.T) {
			if _, err := templateClient(tg).Stat(ctx, "."); !errors.Is(err, agentd.ErrUnauthorized) {
				t.Fatalf("the template token: %v, want 401", err)
			}
			if got := run(t, tg, "echo own token"); got != "own token\n" {
				t.Fatalf("run with its own token: %q", got)
			}
			if err := agentdOf(tg).Rekey(ctx, strings.Repeat("z", 40)); !errors.Is(err, agentd.ErrAlreadyRekeyed) {
				t.Fatalf("a second rekey: %v", err)
			}
		})
		t.Run("another console process reads the same token", func(t *testing.T) {
			other := w.svc(&sessions.Runtime{Now: w.clock.Now})
			lt, err := other.Locate(ctx, sys(), sess.ID)
			if err != nil || lt.AgentdToken != tok {
				t.Fatalf("located token differs: %v", err)
			}
			et, err := other.Ensure(ctx, sys(), sess.ID)
			if err != nil || et.AgentdToken != tok {
				t.Fatalf("ensured token differs: %v", err)
			}
		})
		t.Run("another session's sandbox has another token", func(t *testing.T) {
			s2 := w.newSession(t, svc, sys())
			tg2, err := svc.Ensure(ctx, sys(), s2.ID)
			if err != nil {
				t.Fatal(err)
			}
			if tg2.AgentdToken == tok || tg2.AgentdToken == e2bfaketest.Token {
				t.Fatal("two sandboxes share a token")
			}
			if _, err := agentd.NewClient(tg2.AgentdURL, tok, nil).Stat(ctx, "."); !errors.Is(err, agentd.ErrUnauthorized) {
				t.Fatalf("one sandbox's token on another: %v, want 401", err)
			}
		})
		t.Run("the token is sealed and in no audit record", func(t *testing.T) {
			w.noTokenIn(t, tok)
			var kinds []string
			w.db.Table(audit.OrgTable).Where("action = ?", "session.start").Pluck("details", &kinds)
			if len(kinds) == 0 || !strings.Contains(kinds[0], `"agentd_token":"per_sandbox"`) {
				t.Fatalf("session.start does not say which token: %v", kinds)
			}
		})
	})
}

// TestPerSandboxTokenLost: a sandbox created by an attempt that rekeyed it
// and then lost the answer (and so the token) is found by its tag, refuses
// the template's token, and is killed and replaced by a new one.
func TestPerSandboxTokenLost(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{})
		ctx := context.Background()
		svc := w.svc(&sessions.Runtime{Now: w.clock.Now})
		sess := w.newSession(t, svc, sys())
		// The create happens but its answer is lost, and the lookup by tag
		// fails too: the attempt ends with the sandbox unattached.
		removeCreate := w.fake.InjectFault(e2bfake.Fault{Route: "POST /sandboxes", Status: 502, AfterHandler: true})
		removeList := w.fake.InjectFault(e2bfake.Fault{Route: "GET /v2/sandboxes", Status: 503})
		if _, err := svc.Ensure(ctx, sys(), sess.ID); err == nil {
			t.Fatal("the first attempt succeeded")
		}
		removeCreate()
		removeList()
		orphan := w.tagged(t, sess.ID)
		if len(orphan) != 1 {
			t.Fatalf("tagged sandboxes %v, want the one created", orphan)
		}
		// As if that attempt had rekeyed it before it stopped.
		if err := w.sandboxClient(orphan[0]).Rekey(ctx, strings.Repeat("q", 40)); err != nil {
			t.Fatal(err)
		}
		tg, err := svc.Ensure(ctx, sys(), sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		if tg.Session.SandboxID == orphan[0] {
			t.Fatal("the sandbox whose token was lost was used")
		}
		if now := w.tagged(t, sess.ID); len(now) != 1 || now[0] != tg.Session.SandboxID {
			t.Fatalf("tagged now %v; the lost one must be killed", now)
		}
		if got := run(t, tg, "echo replaced"); got != "replaced\n" {
			t.Fatalf("run: %q", got)
		}
		if _, err := templateClient(tg).Stat(ctx, "."); !errors.Is(err, agentd.ErrUnauthorized) {
			t.Fatalf("the replacement takes the template token: %v", err)
		}
	})
}

// TestPerSandboxTokenUsedBeforeRekey: a sandbox that someone else holding
// the template's token reached before the console's rekey (they may have
// started a command in it) refuses the rekey; the console kills it rather
// than use it, and the next use starts a fresh sandbox.
func TestPerSandboxTokenUsedBeforeRekey(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{})
		ctx := context.Background()
		svc := w.svc(&sessions.Runtime{Now: w.clock.Now})
		sess := w.newSession(t, svc, sys())
		// The create's answer is lost, so the sandbox sits unattached.
		removeCreate := w.fake.InjectFault(e2bfake.Fault{Route: "POST /sandboxes", Status: 502, AfterHandler: true})
		removeList := w.fake.InjectFault(e2bfake.Fault{Route: "GET /v2/sandboxes", Status: 503})
		if _, err := svc.Ensure(ctx, sys(), sess.ID); err == nil {
			t.Fatal("the first attempt succeeded")
		}
		removeCreate()
		removeList()
		orphan := w.tagged(t, sess.ID)
		if len(orphan) != 1 {
			t.Fatalf("tagged sandboxes %v, want the one created", orphan)
		}
		// Someone with the template's token gets in first.
		if _, err := w.sandboxClient(orphan[0]).Stat(ctx, "."); err != nil {
			t.Fatal(err)
		}
		_, err := svc.Ensure(ctx, sys(), sess.ID)
		var ae *apperr.Error
		if !errors.As(err, &ae) || ae.Code != "sandbox_rekey_failed" || !strings.Contains(ae.Message, "used_before_rekey") {
			t.Fatalf("adopting the used sandbox: %v; want sandbox_rekey_failed naming used_before_rekey", err)
		}
		if now := w.tagged(t, sess.ID); len(now) != 0 {
			t.Fatalf("tagged now %v; the used sandbox must be killed", now)
		}
		tg, err := svc.Ensure(ctx, sys(), sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		if tg.Session.SandboxID == orphan[0] || tg.Session.AgentdTokenKind != sessions.TokenPerSandbox {
			t.Fatalf("the next use took sandbox %s (%s); want a fresh, rekeyed one", tg.Session.SandboxID, tg.Session.AgentdTokenKind)
		}
	})
}

// oldAgentdLauncher runs, per sandbox, a real agentd server behind a
// handler that answers POST /v1/token as an agentd from before rekeys
// does: 404 not_found.
type oldAgentdLauncher struct{ t *testing.T }

type oldAgentd struct {
	ts  *httptest.Server
	srv *agentd.Server
}

func (o *oldAgentd) Addr() string  { return o.ts.Listener.Addr().String() }
func (o *oldAgentd) PID() int      { return 0 }
func (o *oldAgentd) Freeze() error { return nil }
func (o *oldAgentd) Thaw() error   { return nil }
func (o *oldAgentd) Kill() error {
	o.srv.Close()
	o.ts.Close()
	return nil
}

func (l oldAgentdLauncher) Launch(_ context.Context, spec e2bfake.LaunchSpec) (e2bfake.Process, error) {
	srv, err := agentd.NewServer(agentd.Config{Token: e2bfaketest.Token, Root: spec.Workspace})
	if err != nil {
		return nil, err
	}
	h := srv.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/token" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"not_found","message":"There is no such endpoint."}}`))
			return
		}
		h.ServeHTTP(w, r)
	}))
	o := &oldAgentd{ts: ts, srv: srv}
	l.t.Cleanup(func() { o.Kill() })
	return o, nil
}

// TestPerSandboxTokenOldAgentd: an agentd that cannot be rekeyed is used
// with the template's token, and the session says so.
func TestPerSandboxTokenOldAgentd(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{Launcher: oldAgentdLauncher{t}})
		ctx := context.Background()
		svc := w.svc(nil)
		sess := w.newSession(t, svc, sys())
		tg, err := svc.Ensure(ctx, sys(), sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		if tg.AgentdToken != e2bfaketest.Token || tg.Session.AgentdTokenKind != sessions.TokenTemplate || tg.Session.SealedAgentdToken != "" {
			t.Fatalf("kind %q, template token used %v", tg.Session.AgentdTokenKind, tg.AgentdToken == e2bfaketest.Token)
		}
		if got := run(t, tg, "echo old"); got != "old\n" {
			t.Fatalf("run: %q", got)
		}
	})
}
