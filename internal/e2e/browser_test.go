package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

const (
	adminEmail    = "root@example.com"
	adminPassword = "correct horse battery staple"
	// chromiumPath is where Debian's chromium package puts the browser.
	chromiumPath = "/usr/bin/chromium"
)

// chromium finds the browser or fails the test saying how to install it.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("GATEHOUSE_CHROMIUM"); p != "" {
		return p
	}
	if _, err := os.Stat(chromiumPath); err == nil {
		return chromiumPath
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("the browser tests need Chromium at %s; install it with: apt-get install -y chromium (or set GATEHOUSE_CHROMIUM to a Chrome binary)", chromiumPath)
	return ""
}

// newBrowser starts a private headless Chromium for one test and returns a
// tab context bounded by a deadline of 3 minutes: a guard against a hang,
// not a speed check (a walk of every page takes seconds on a quiet
// machine, and minutes with the cores oversubscribed many times).
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	return newBrowserFor(t, 3*time.Minute)
}

// newBrowserFor is newBrowser with the whole test's deadline given.
func newBrowserFor(t *testing.T, deadline time.Duration) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 800),
	)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(bcancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start Chromium (%s): %v", chromium(t), err)
	}
	return bctx
}

// server is the console assembled as main does, served over HTTP.
type server struct {
	c   *console.Console
	url string
	// hijacked are the connections the console took over (its
	// WebSockets), for tests that drop them.
	hijacked *connSet
}

// connSet is a set of connections a server handed over to its handlers.
type connSet struct {
	mu    sync.Mutex
	conns []net.Conn
}

// dropAll closes every connection of the set abruptly, as a lost network
// does, and says how many were still open.
func (s *connSet) dropAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.conns {
		if c.Close() == nil {
			n++
		}
	}
	s.conns = nil
	return n
}

// newServer builds the console on dialect d. With Postgres the catalog is a
// fresh test database and every org database it creates carries a per-test
// prefix and is dropped at cleanup.
func newServer(t *testing.T, d store.Dialect, opts ...func(*config.Config)) *server {
	t.Helper()
	return newServerLog(t, d, io.Discard, opts...)
}

// newServerLog is newServer with the console's log written to logw.
func newServerLog(t *testing.T, d store.Dialect, logw io.Writer, opts ...func(*config.Config)) *server {
	t.Helper()
	cfg := config.Config{DataDir: t.TempDir(), AdminEmail: adminEmail, AdminPassword: adminPassword,
		TokenTTL: time.Hour, OrgDBPrefix: storetest.NewName("gh_test_org_") + "_",
		// Cheap password hashes: the production cost makes every account
		// and sign-in take 60 ms under the race detector.
		PasswordCost: auth.PasswordCost{Time: 1, MemoryKiB: 64}}
	for _, o := range opts {
		o(&cfg)
	}
	if d == store.Postgres {
		cfg.DatabaseURL = storetest.DSN(t, store.Postgres)
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		cfg.MasterKey = hex.EncodeToString(key)
		storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
	}
	c, err := console.New(context.Background(), cfg, slog.New(slog.NewTextHandler(logw, nil)))
	if err != nil {
		t.Fatalf("console.New: %v", err)
	}
	c.Platform.Sleep = func(context.Context, time.Duration) {}
	hijacked := &connSet{}
	srv := httptest.NewUnstartedServer(c.Handler())
	srv.Config.ConnState = func(nc net.Conn, st http.ConnState) {
		if st == http.StateHijacked {
			hijacked.mu.Lock()
			hijacked.conns = append(hijacked.conns, nc)
			hijacked.mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		c.Close()
	})
	return &server{c: c, url: srv.URL, hijacked: hijacked}
}

// testid selects an element by its data-testid.
func testid(id string) chromedp.CSS { return chromedp.CSS(`[data-testid="` + id + `"]`) }

// css is a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// do runs browser steps, failing the test with what was being done and
// where the browser was.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		t.Fatalf("%s: %v (page: %s)", what, err, loc)
	}
}

// get runs one action that returns a value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		t.Fatalf("%s: %v (page: %s)", what, err, loc)
	}
	return v
}

// text waits for an element and returns its visible text.
func text(t *testing.T, ctx context.Context, sel chromedp.CSS) string {
	t.Helper()
	do(t, ctx, "wait for "+string(sel), chromedp.WaitVisible(sel))
	return get(t, ctx, "read "+string(sel), chromedp.Text(sel))
}

// waitText waits until the element's trimmed text is want. Unlike
// WaitVisible it does not stop at the page a click is leaving, and it
// retries while that page goes away.
func waitText(sel chromedp.CSS, want string) chromedp.Action[chromedp.Void] {
	js := `document.querySelector(` + strconv.Quote(string(sel)) + `)?.textContent.trim() ?? ""`
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		last := ""
		for {
			if got, err := chromedp.Evaluate[string](js)(ctx, tg); err == nil {
				if got == want {
					return chromedp.Void{}, nil
				}
				last = got
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("%s never read %q (last %q): %w", sel, want, last, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// submits runs steps that make the page load a new document (a link, a
// form post) and returns once that document has loaded. Every click that
// navigates goes through it: a wait that follows must not be met by the
// page being left, and a reload or navigation that follows must not abort
// the one still under way.
func submits(steps ...chromedp.Action[chromedp.Void]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		mark := strconv.Quote(hex.EncodeToString(b[:]))
		if _, err := chromedp.Evaluate[bool](`(window.__e2eLeaving = `+mark+`, true)`)(ctx, tg); err != nil {
			return chromedp.Void{}, fmt.Errorf("mark the page being left: %w", err)
		}
		if _, err := chromedp.Steps(steps...)(ctx, tg); err != nil {
			return chromedp.Void{}, err
		}
		loaded := `window.__e2eLeaving !== ` + mark + ` && document.readyState === "complete"`
		for {
			// Errors are the old page's context going away: ask again.
			if ok, err := chromedp.Evaluate[bool](loaded)(ctx, tg); err == nil && ok {
				return chromedp.Void{}, nil
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("the page never loaded a new document: %w", ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// signIn fills and submits the login form, returning once the page it
// leads to has loaded.
func signIn(email, password string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(css(`#email`)),
		chromedp.Clear(css(`#email`)),
		chromedp.SendKeys(css(`#email`), email),
		chromedp.SendKeys(css(`#password`), password),
		submits(chromedp.Click(testid("login-submit"))),
	)
}

// choose sets the select at sel to value as a person picking it does: the
// change event fires, so scripts that follow the choice see it.
func choose(sel, value string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		js := `(() => { const s = document.querySelector(` + strconv.Quote(sel) + `); if (!s) return false; s.value = ` + strconv.Quote(value) +
			`; s.dispatchEvent(new Event("change", {bubbles: true})); return s.value === ` + strconv.Quote(value) + ` })()`
		ok, err := chromedp.Evaluate[bool](js)(ctx, tg)
		if err == nil && !ok {
			err = fmt.Errorf("%s has no choice %q", sel, value)
		}
		return chromedp.Void{}, err
	}
}
