package approvals_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
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
		// The receiver is on loopback, which the production rule refuses.
		hook := &approvals.Webhook{Rule: func(netip.Addr) string { return "" }, Box: box, Counted: func(r string) { results <- r }}
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
			if err != nil || !cfg.SecretSet || cfg.URL != srv.URL || !cfg.PathSet {
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

// syncBuffer is a log sink safe for the delivery goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestWebhookAddr: the production rule refuses this machine, metadata and
// private networks, and allows public addresses.
func TestWebhookAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr  string
		allow bool
	}{
		{"127.0.0.1", false}, {"::1", false}, {"::ffff:127.0.0.1", false}, {"0.0.0.0", false},
		{"10.1.2.3", false}, {"172.16.0.5", false}, {"192.168.1.1", false}, {"::ffff:10.0.0.1", false}, {"fd00::1", false},
		{"100.64.0.1", false}, {"169.254.169.254", false}, {"fe80::1", false},
		{"93.184.216.34", true}, {"2606:2800:220:1::1", true},
	} {
		if got := approvals.WebhookAddr(netip.MustParseAddr(tc.addr)) == ""; got != tc.allow {
			t.Errorf("WebhookAddr(%s) allows = %v, want %v", tc.addr, got, tc.allow)
		}
	}
}

// TestWebhookRefusesInternal: with the production rule, a webhook aimed at
// loopback (a test server there) or a private address is never dialled:
// the delivery fails and is counted, and nothing reaches the server; a
// redirect is not followed even where the address is allowed.
func TestWebhookRefusesInternal(t *testing.T) {
	t.Parallel()
	w := newWorld(t, storetest.Open(t, store.SQLite, store.OrgSet))
	ctx := context.Background()
	box := newBox(t)
	hits := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		hits <- r.URL.Path
		if r.URL.Path == "/redirect" {
			http.Redirect(rw, r, "/landed", http.StatusFound)
		}
	}))
	t.Cleanup(srv.Close)
	by := audit.Actor{Type: audit.ActorUser, ID: "1", Name: "admin"}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))

	results := make(chan string, 10)
	prod := &approvals.Webhook{Box: box, Logger: logger, Counted: func(r string) { results <- r }}
	for _, target := range []string{srv.URL + "/internal", "http://10.0.0.1:9/internal"} {
		w.svc.Requested = prod.Hook(w.svc)
		if _, err := w.svc.SetWebhook(ctx, by, box, target, "webhook-secret-0123456789"); err != nil {
			t.Fatal(err)
		}
		w.request(t, w.binding("git push"))
		select {
		case r := <-results:
			if r != "error" {
				t.Fatalf("%s: delivery %s, want it refused", target, r)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no result", target)
		}
		if !strings.Contains(logs.String(), "not allowed") {
			t.Fatalf("%s: the refusal is not logged as one: %s", target, logs.String())
		}
	}
	select {
	case p := <-hits:
		t.Fatalf("the production client reached the loopback server (%s)", p)
	default:
	}

	open := &approvals.Webhook{Rule: func(netip.Addr) string { return "" }, Box: box, Logger: logger, Counted: func(r string) { results <- r }}
	w.svc.Requested = open.Hook(w.svc)
	if _, err := w.svc.SetWebhook(ctx, by, box, srv.URL+"/redirect", "webhook-secret-0123456789"); err != nil {
		t.Fatal(err)
	}
	w.request(t, w.binding("git push"))
	if r := <-results; r != "error" {
		t.Fatalf("redirect: delivery %s, want error", r)
	}
	if p := <-hits; p != "/redirect" {
		t.Fatalf("hit %s", p)
	}
	select {
	case p := <-hits:
		t.Fatalf("the redirect was followed to %s", p)
	default:
	}
}

// TestWebhookURLHidden: a webhook URL's path (often its credential) is
// stored sealed and appears neither in what GetWebhook answers, nor in the
// audit event, nor in the log of a failed delivery, nor in clear in the
// database.
func TestWebhookURLHidden(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, storetest.Open(t, d, store.OrgSet))
		ctx := context.Background()
		box := newBox(t)
		logs := &syncBuffer{}
		results := make(chan string, 4)
		// The production rule: the delivery to 127.0.0.1 fails with a
		// *url.Error, which names the whole URL.
		hook := &approvals.Webhook{Box: box, Logger: slog.New(slog.NewTextHandler(logs, nil)), Counted: func(r string) { results <- r }}
		w.svc.Requested = hook.Hook(w.svc)
		const path = "services/T0SECRETPATH/B0XXX"
		by := audit.Actor{Type: audit.ActorUser, ID: "1", Name: "admin"}
		cfg, err := w.svc.SetWebhook(ctx, by, box, "http://127.0.0.1:9/"+path+"?token=QUERYSECRET", "webhook-secret-0123456789")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.URL != "http://127.0.0.1:9" || !cfg.PathSet {
			t.Fatalf("set answers %+v", cfg)
		}
		if got, err := w.svc.GetWebhook(ctx); err != nil || got.URL != "http://127.0.0.1:9" || !got.PathSet {
			t.Fatalf("get answers %+v %v", got, err)
		}
		w.request(t, w.binding("git push"))
		if r := <-results; r != "error" {
			t.Fatalf("delivery %s", r)
		}
		if !strings.Contains(logs.String(), "127.0.0.1") {
			t.Fatalf("the failure log does not name the host: %s", logs.String())
		}
		var audited, stored []string
		if err := w.db.Raw("SELECT target_name || ' ' || details FROM audit_events WHERE action = 'approval.webhook_update'").Scan(&audited).Error; err != nil {
			t.Fatal(err)
		}
		if err := w.db.Raw("SELECT url || ' ' || url_sealed FROM approval_webhooks").Scan(&stored).Error; err != nil {
			t.Fatal(err)
		}
		for where, text := range map[string]string{"log": logs.String(), "audit": strings.Join(audited, "\n"), "row": strings.Join(stored, "\n")} {
			for _, s := range []string{"T0SECRETPATH", "QUERYSECRET"} {
				if strings.Contains(text, s) {
					t.Errorf("%s holds the URL's %s: %s", where, s, text)
				}
			}
		}
		if len(audited) != 1 || !strings.Contains(audited[0], "127.0.0.1") {
			t.Fatalf("audit %q", audited)
		}
	})
}

// TestWebhookRuleAllow: the operator's allow-list opens the private
// networks it names, and nothing netguard.Blocked refuses.
func TestWebhookRuleAllow(t *testing.T) {
	t.Parallel()
	rule := approvals.WebhookRule([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16")})
	for _, tc := range []struct {
		addr  string
		allow bool
	}{
		{"10.20.3.4", true}, {"::ffff:10.20.3.4", true}, {"10.21.0.1", false}, {"192.168.1.1", false},
		{"127.0.0.1", false}, {"169.254.169.254", false}, {"93.184.216.34", true},
	} {
		if got := rule(netip.MustParseAddr(tc.addr)) == ""; got != tc.allow {
			t.Errorf("rule(%s) allows = %v, want %v", tc.addr, got, tc.allow)
		}
	}
}
