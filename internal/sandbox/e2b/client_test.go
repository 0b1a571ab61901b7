package e2b_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2b"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

// TestMetadataRoundTrip: values and keys with characters that need
// escaping find exactly their own sandbox through the fake, which decodes
// the filter the way E2B does.
func TestMetadataRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	c := newClient(t, f, e2bfaketest.APIKey)
	tests := []struct{ name, key, value string }{
		{"space", "gatehouse.session", "alice b"},
		{"ampersand", "gatehouse.session", "a&b"},
		{"equals", "gatehouse.session", "a=b"},
		{"pair-like", "gatehouse.session", "k=v&k2=v2"},
		{"plus", "gatehouse.session", "a+b"},
		{"plus is not space", "gatehouse.session", "a b+"},
		{"percent", "gatehouse.session", "100%"},
		{"percent escape look-alike", "gatehouse.session", "%41%zz"},
		{"slash", "gatehouse.session", "org/dept/user"},
		{"non-ASCII", "gatehouse.session", "Zoë 日本語 ✓"},
		{"everything", "gatehouse.session", "alice b&c=d/é+%"},
		{"JS-unreserved marks", "gatehouse.session", "!~*'()"},
		{"key with specials", "team name&x=y", "v"},
		{"empty value", "gatehouse.empty", ""},
	}
	ids := map[string]string{}
	for _, tt := range tests {
		sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Metadata: map[string]string{tt.key: tt.value, "gatehouse.org": "acme"}})
		if err != nil {
			t.Fatalf("create %s: %v", tt.name, err)
		}
		ids[tt.name] = sb.ID
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			list, err := c.List(ctx, sandbox.ListFilter{Metadata: map[string]string{tt.key: tt.value, "gatehouse.org": "acme"}})
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			if len(list) != 1 || list[0].ID != ids[tt.name] || list[0].Metadata[tt.key] != tt.value {
				t.Fatalf("list by %q=%q = %+v, want only %s", tt.key, tt.value, list, ids[tt.name])
			}
		})
	}
}

// TestCreateSecureAndPrivate: a private sandbox is created secure (E2B
// refuses it otherwise), and only secure sandboxes get an envd token.
func TestCreateSecureAndPrivate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	c := newClient(t, f, e2bfaketest.APIKey)
	no := false
	tests := []struct {
		name                  string
		req                   sandbox.CreateRequest
		wantEnvd, wantTraffic bool
	}{
		{"public", sandbox.CreateRequest{TemplateID: "base"}, false, false},
		{"secure", sandbox.CreateRequest{TemplateID: "base", Secure: true}, true, false},
		{"private implies secure", sandbox.CreateRequest{TemplateID: "base", AllowPublicTraffic: &no}, true, true},
	}
	for _, tt := range tests {
		sb, err := c.Create(ctx, tt.req)
		if err != nil {
			t.Fatalf("%s: create: %v", tt.name, err)
		}
		if (sb.EnvdAccessToken != "") != tt.wantEnvd || (sb.TrafficAccessToken != "") != tt.wantTraffic {
			t.Errorf("%s: envd token %q traffic token %q", tt.name, sb.EnvdAccessToken, sb.TrafficAccessToken)
		}
	}
	for _, bad := range []int{-2, 1 << 31} {
		_, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: bad})
		if !errors.Is(err, sandbox.ErrBadRequest) || sandbox.OutcomeUnknown(err) {
			t.Errorf("timeout %d: %v, want a bad request refused before sending", bad, err)
		}
	}
}

// TestCreateEgress: the backend is asked to enforce what it can of an
// egress policy (network.allowOut/denyOut, allow_internet_access) and
// the fake records it; a host that is not an address, a CIDR or a name
// is refused.
func TestCreateEgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	c := newClient(t, f, e2bfaketest.APIKey)
	want := &sandbox.Egress{AllowInternetAccess: true, AllowOut: []string{"github.com", "*.pypi.org", "10.0.0.0/8"}, DenyOut: []string{"0.0.0.0/0"}}
	sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Egress: want})
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := f.Inspect(sb.ID)
	if snap.Egress == nil || !snap.Egress.AllowInternetAccess || strings.Join(snap.Egress.AllowOut, ",") != "github.com,*.pypi.org,10.0.0.0/8" ||
		strings.Join(snap.Egress.DenyOut, ",") != "0.0.0.0/0" {
		t.Errorf("the backend recorded %+v, want %+v", snap.Egress, want)
	}
	sb, err = c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Egress: &sandbox.Egress{}})
	if err != nil {
		t.Fatal(err)
	}
	if snap, _ := f.Inspect(sb.ID); snap.Egress == nil || snap.Egress.AllowInternetAccess {
		t.Errorf("no internet access asked, the backend recorded %+v", snap.Egress)
	}
	if sb, err = c.Create(ctx, sandbox.CreateRequest{TemplateID: "base"}); err != nil {
		t.Fatal(err)
	}
	if snap, _ := f.Inspect(sb.ID); snap.Egress != nil {
		t.Errorf("a create without egress settings recorded %+v", snap.Egress)
	}
	_, err = c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Egress: &sandbox.Egress{AllowOut: []string{"not a host!"}}})
	if !errors.Is(err, sandbox.ErrBadRequest) {
		t.Errorf("a bad host: %v, want a bad request", err)
	}
}

// TestLifecycleAnswers: pause twice is ErrAlreadyPaused (and ErrConflict),
// connect says whether it resumed (201) or not (200; CubeSandbox always
// 200), kill of a gone sandbox is ErrNotFound.
func TestLifecycleAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, cube := range []bool{false, true} {
		f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, CubeSandbox: cube})
		c := newClient(t, f, e2bfaketest.APIKey)
		sb, err := c.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: 60, AutoPause: true, AutoResume: true})
		if err != nil {
			t.Fatal(err)
		}
		if info, err := c.Get(ctx, sb.ID); err != nil || info.Lifecycle == nil || *info.Lifecycle != (sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutPause, AutoResume: true}) {
			t.Errorf("cube=%v lifecycle = %+v, %v", cube, info.Lifecycle, err)
		}
		if err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatalf("cube=%v pause: %v", cube, err)
		}
		err = c.Pause(ctx, sb.ID)
		if !errors.Is(err, sandbox.ErrAlreadyPaused) || !errors.Is(err, sandbox.ErrConflict) {
			t.Errorf("cube=%v second pause = %v, want ErrAlreadyPaused", cube, err)
		}
		got, err := c.Connect(ctx, sb.ID, time.Minute)
		if err != nil || got.ID != sb.ID || got.Resumed == cube {
			t.Errorf("cube=%v connect paused = %+v, %v; want Resumed %v", cube, got, err, !cube)
		}
		if info, err := c.Get(ctx, sb.ID); err != nil || info.State != sandbox.StateRunning {
			t.Errorf("cube=%v after connect = %+v, %v", cube, info, err)
		}
		if got, err := c.Connect(ctx, sb.ID, time.Minute); err != nil || got.Resumed {
			t.Errorf("cube=%v connect running = %+v, %v; want not resumed", cube, got, err)
		}
		if err := c.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.Kill(ctx, sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cube=%v kill twice = %v, want ErrNotFound", cube, err)
		}
		if _, err := c.Connect(ctx, sb.ID, time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cube=%v connect gone = %v, want ErrNotFound", cube, err)
		}
	}
}

// TestCubeNeverTimesOut: NoTimeout is -1, which CubeSandbox accepts and
// E2B refuses.
func TestCubeNeverTimesOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cube := newClient(t, e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, CubeSandbox: true}), e2bfaketest.APIKey)
	sb, err := cube.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: sandbox.NoTimeoutSeconds})
	if err != nil {
		t.Fatalf("cube create never: %v", err)
	}
	if info, err := cube.Get(ctx, sb.ID); err != nil || !info.EndAt.IsZero() {
		t.Errorf("never-expiring sandbox = %+v, %v; want no endAt", info, err)
	}
	if err := cube.SetTimeout(ctx, sb.ID, sandbox.NoTimeout); err != nil {
		t.Errorf("cube set timeout never: %v", err)
	}
	e2bc := newClient(t, e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}}), e2bfaketest.APIKey)
	if _, err := e2bc.Create(ctx, sandbox.CreateRequest{TemplateID: "base", TimeoutSeconds: sandbox.NoTimeoutSeconds}); !errors.Is(err, sandbox.ErrBadRequest) {
		t.Errorf("E2B create never = %v, want ErrBadRequest", err)
	}
}

// TestListStopsOnRepeatedPage: a backend that ignores nextToken cannot
// make List loop, whether it repeats its token or hands out new ones.
func TestListStopsOnRepeatedPage(t *testing.T) {
	t.Parallel()
	page := `[{"sandboxID":"a","templateID":"t","clientID":"c","startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:01:00Z","cpuCount":1,"memoryMB":128,"diskSizeMB":0,"state":"running","envdVersion":"0.2.0"}]`
	tests := []struct {
		name  string
		token func(n int64) string
	}{
		{"same token every time", func(int64) string { return "t1" }},
		{"fresh token, same page", func(n int64) string { return "t" + string(rune('0'+n)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := calls.Add(1)
				w.Header().Set("X-Next-Token", tt.token(n))
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(page))
			}))
			defer srv.Close()
			c, err := e2b.New(srv.URL, "k", srv.Client())
			if err != nil {
				t.Fatal(err)
			}
			list, err := c.List(context.Background(), sandbox.ListFilter{})
			if err != nil || len(list) != 1 || list[0].ID != "a" {
				t.Fatalf("list = %+v, %v", list, err)
			}
			if n := calls.Load(); n != 2 {
				t.Errorf("%d calls, want 2 (the repeat ends the walk)", n)
			}
		})
	}
}

// TestNoRedirects: a redirect is an error naming where it pointed, and the
// API key never reaches the other host, whatever the caller's client does.
func TestNoRedirects(t *testing.T) {
	t.Parallel()
	var leaked atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != "" {
			leaked.Add(1)
		}
		_, _ = w.Write([]byte(`[]`))
	}))
	defer other.Close()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/v2/sandboxes", http.StatusTemporaryRedirect)
	}))
	defer front.Close()
	followAll := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
	c, err := e2b.New(front.URL, "e2b_secret", followAll)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.List(context.Background(), sandbox.ListFilter{})
	if !errors.Is(err, sandbox.ErrRedirect) || !strings.Contains(err.Error(), other.URL) || sandbox.OutcomeUnknown(err) {
		t.Errorf("list through a redirect = %v, want ErrRedirect naming %s", err, other.URL)
	}
	if strings.Contains(err.Error(), "e2b_secret") {
		t.Errorf("error repeats the key: %v", err)
	}
	if n := leaked.Load(); n != 0 {
		t.Errorf("the key reached the other host %d times", n)
	}
	if followAll.CheckRedirect == nil {
		t.Error("New changed the caller's client")
	}
}

// TestFaultHandling: each injected backend fault reaches the caller as a
// typed error, says whether the call may have taken effect, and a create
// whose answer was lost is found by its tag instead of being repeated.
func TestFaultHandling(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	c := newClient(t, f, e2bfaketest.APIKey)
	short := newClientWith(t, f, &http.Client{Timeout: 300 * time.Millisecond})
	tests := []struct {
		name        string
		fault       e2bfake.Fault
		client      *e2b.Client
		ctxTimeout  time.Duration
		want        error
		unknown     bool
		retryAfter  time.Duration
		wantCreated int
	}{
		{"500", e2bfake.Fault{Route: "POST /sandboxes", Status: 500}, c, 0, sandbox.ErrServer, true, 0, 0},
		{"503 with Retry-After", e2bfake.Fault{Route: "POST /sandboxes", Status: 503, RetryAfter: 7 * time.Second}, c, 0, sandbox.ErrUnavailable, true, 7 * time.Second, 0},
		{"429", e2bfake.Fault{Route: "POST /sandboxes", Status: 429, RetryAfter: time.Second}, c, 0, sandbox.ErrRateLimited, false, time.Second, 0},
		{"502 HTML page", e2bfake.Fault{Route: "POST /sandboxes", Status: 502, Body: "<html>bad gateway</html>"}, c, 0, sandbox.ErrUnavailable, true, 0, 0},
		{"504 after the create happened", e2bfake.Fault{Route: "POST /sandboxes", Status: 504, AfterHandler: true}, c, 0, sandbox.ErrUnavailable, true, 0, 1},
		{"created, answer malformed", e2bfake.Fault{Route: "POST /sandboxes", Body: `{"sandboxID":`, AfterHandler: true}, c, 0, sandbox.ErrMalformed, true, 0, 1},
		{"created, answer without sandboxID", e2bfake.Fault{Route: "POST /sandboxes", Body: `{}`, AfterHandler: true}, c, 0, sandbox.ErrMalformed, true, 0, 1},
		{"created, no answer before the deadline", e2bfake.Fault{Route: "POST /sandboxes", Hang: true, AfterHandler: true}, c, 300 * time.Millisecond, sandbox.ErrTimeout, true, 0, 1},
		{"created, no answer before the client's timeout", e2bfake.Fault{Route: "POST /sandboxes", Hang: true, AfterHandler: true}, short, 0, sandbox.ErrTimeout, true, 0, 1},
		{"slow backend, caller gives up first", e2bfake.Fault{Route: "POST /sandboxes", Delay: time.Minute}, c, 300 * time.Millisecond, sandbox.ErrTimeout, true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.ctxTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctxTimeout)
				defer cancel()
			}
			tag := map[string]string{"gatehouse.session": tt.name}
			remove := f.InjectFault(tt.fault)
			_, err := tt.client.Create(ctx, sandbox.CreateRequest{TemplateID: "base", Metadata: tag})
			remove()
			if !errors.Is(err, tt.want) {
				t.Fatalf("create = %v, want %v", err, tt.want)
			}
			if got := sandbox.OutcomeUnknown(err); got != tt.unknown {
				t.Errorf("OutcomeUnknown = %v, want %v (%v)", got, tt.unknown, err)
			}
			var ae *sandbox.APIError
			isAPI := errors.As(err, &ae)
			if tt.retryAfter > 0 && !isAPI {
				t.Errorf("create = %v (%T), want a *sandbox.APIError carrying Retry-After %v", err, err, tt.retryAfter)
			} else if isAPI && ae.RetryAfter != tt.retryAfter {
				t.Errorf("RetryAfter = %v, want %v", ae.RetryAfter, tt.retryAfter)
			}
			list, lerr := c.List(context.Background(), sandbox.ListFilter{Metadata: tag})
			if lerr != nil || len(list) != tt.wantCreated {
				t.Errorf("sandboxes tagged after the fault = %d (%v), want %d", len(list), lerr, tt.wantCreated)
			}
		})
	}

	// A malformed list page is an error, never a short list.
	remove := f.InjectFault(e2bfake.Fault{Route: "GET /v2/sandboxes", Body: `[{"sandboxID": 7}]`, Status: 200})
	_, err := c.List(context.Background(), sandbox.ListFilter{})
	remove()
	if !errors.Is(err, sandbox.ErrMalformed) {
		t.Errorf("malformed list = %v, want ErrMalformed", err)
	}
}

func newClientWith(t *testing.T, f *e2bfake.Server, hc *http.Client) *e2b.Client {
	t.Helper()
	c, err := e2b.New(f.URL(), e2bfaketest.APIKey, hc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// BenchmarkList1000 lists one org's 1,000 tagged sandboxes (ten pages)
// among 200 others, the read a reclaim round starts with.
func BenchmarkList1000(b *testing.B) {
	f := e2bfaketest.New(b, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	specs := make([]e2bfake.SeedSandbox, 1200)
	for i := range specs {
		org := "acme"
		if i%6 == 5 {
			org = "globex"
		}
		specs[i] = e2bfake.SeedSandbox{State: sandbox.StatePaused, Metadata: map[string]string{"gatehouse.org": org, "gatehouse.session": "s"}}
	}
	if _, err := f.Seed(specs...); err != nil {
		b.Fatal(err)
	}
	c, err := e2b.New(f.URL(), e2bfaketest.APIKey, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		list, err := c.List(ctx, sandbox.ListFilter{Metadata: map[string]string{"gatehouse.org": "acme"}})
		if err != nil || len(list) != 1000 {
			b.Fatalf("list = %d, %v", len(list), err)
		}
	}
}
