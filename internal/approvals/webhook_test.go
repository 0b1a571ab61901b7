package approvals_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestWebhook: a new pending request is posted to the org's webhook,
// signed with HMAC-SHA256 under its sealed secret, without env values; a
// receiver that hangs does not hold the request up, and one that fails is
// counted; bad settings are refused with field errors.
func TestWebhook(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, storetest.Open(t, d, store.OrgSet))
		ctx := context.Background()
		key := make([]byte, sealed.KeySize)
		_, _ = rand.Read(key)
		box, err := sealed.New(key)
		if err != nil {
			t.Fatal(err)
		}
		const secret = "webhook-secret-0123456789"
		type delivery struct {
			sig, event string
			body       []byte
		}
		got := make(chan delivery, 10)
		release := make(chan struct{})
		var status sync.Map // path -> int
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if r.URL.Path == "/hang" {
				<-release
			}
			code, _ := status.Load(r.URL.Path)
			if c, ok := code.(int); ok {
				rw.WriteHeader(c)
			}
			got <- delivery{r.Header.Get(approvals.HeaderSignature), r.Header.Get(approvals.HeaderEvent), b}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) })
		results := make(chan string, 10)
		hook := &approvals.Webhook{HTTP: srv.Client(), Box: box, Counted: func(r string) { results <- r }}
		w.svc.Requested = hook.Hook(w.svc)
		by := audit.Actor{Type: audit.ActorUser, ID: "1", Name: "admin"}

		for _, bad := range []struct{ url, secret, field string }{
			{"ftp://x", secret, "url"}, {"relative/path", secret, "url"}, {"https://u:p@x/", secret, "url"}, {srv.URL, "short", "secret"},
		} {
			_, err := w.svc.SetWebhook(ctx, by, box, bad.url, bad.secret)
			var v *apperr.ValidationError
			if !errors.As(err, &v) || v.Fields[bad.field] == "" {
				t.Errorf("SetWebhook(%q, %q): %v, want a field error on %s", bad.url, bad.secret, err, bad.field)
			}
		}

		t.Run("signed delivery", func(t *testing.T) {
			cfg, err := w.svc.SetWebhook(ctx, by, box, srv.URL+"/ok", secret)
			if err != nil || !cfg.SecretSet || cfg.URL != srv.URL+"/ok" {
				t.Fatalf("set: %+v %v", cfg, err)
			}
			var n int64
			if err := w.db.Raw("SELECT count(*) FROM approval_webhooks WHERE secret_sealed LIKE ?", "%"+secret+"%").Scan(&n).Error; err != nil || n != 0 {
				t.Fatalf("the secret is stored in the clear (%d, %v)", n, err)
			}
			a := w.request(t, w.binding("git push"))
			select {
			case dv := <-got:
				if dv.sig != approvals.Sign([]byte(secret), dv.body) || dv.event != "approval.requested" {
					t.Fatalf("signature %q event %q", dv.sig, dv.event)
				}
				if !strings.Contains(string(dv.body), `"command":"git push"`) || !strings.Contains(string(dv.body), `"TOKEN"`) || strings.Contains(string(dv.body), "s3cr3t") {
					t.Fatalf("body %s", dv.body)
				}
				if !strings.Contains(string(dv.body), `"id":`+itoa(a.ID)) {
					t.Fatalf("body names another request: %s", dv.body)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("nothing delivered")
			}
			if r := <-results; r != "ok" {
				t.Fatalf("result %s", r)
			}
		})

		t.Run("a hanging receiver does not block the request", func(t *testing.T) {
			if _, err := w.svc.SetWebhook(ctx, by, box, srv.URL+"/hang", secret); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := w.svc.Request(ctx, w.binding("git push")); done <- err }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the request waited for the webhook")
			}
		})

		t.Run("a failing receiver is counted", func(t *testing.T) {
			status.Store("/fail", http.StatusInternalServerError)
			if _, err := w.svc.SetWebhook(ctx, by, box, srv.URL+"/fail", secret); err != nil {
				t.Fatal(err)
			}
			w.request(t, w.binding("git push"))
			for r := range results {
				if r == "error" {
					break
				}
			}
		})

		t.Run("removed", func(t *testing.T) {
			cfg, err := w.svc.SetWebhook(ctx, by, box, "", "")
			if err != nil || cfg.URL != "" || cfg.SecretSet {
				t.Fatalf("removed: %+v %v", cfg, err)
			}
			if got := w.actionsOf(t, "approval.webhook_update"); got != 4 {
				t.Fatalf("%d webhook updates audited, want 4 (ok, hang, fail, removed)", got)
			}
		})
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func (w *world) actionsOf(t *testing.T, action string) int64 {
	t.Helper()
	var n int64
	if err := w.db.Raw("SELECT count(*) FROM audit_events WHERE action = ?", action).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func newBox(t *testing.T) *sealed.Box {
	t.Helper()
	key := make([]byte, sealed.KeySize)
	_, _ = rand.Read(key)
	box, err := sealed.New(key)
	if err != nil {
		t.Fatal(err)
	}
	return box
}

// TestConcurrentSetWebhook: two settings of the webhook at once, on two
// replicas, both succeed and one of them stands.
func TestConcurrentSetWebhook(t *testing.T) {
	t.Parallel()
	w, other := replicas(t)
	box := newBox(t)
	ctx := context.Background()
	by := audit.Actor{Type: audit.ActorUser, ID: "1", Name: "admin"}
	for i := range 10 {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		for j, svc := range []*approvals.Service{w.svc, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[j] = svc.SetWebhook(ctx, by, box, fmt.Sprintf("https://hooks.example.com/%d/%d", i, j), "webhook-secret-0123456789")
			}()
		}
		close(start)
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Fatalf("round %d: setting %d: %v", i, j, err)
			}
		}
		if cfg, err := w.svc.GetWebhook(ctx); err != nil || !cfg.SecretSet {
			t.Fatalf("round %d: %+v %v", i, cfg, err)
		}
	}
}
