package envs_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// countingServer answers like agentd's /healthz and counts requests and
// the bearer tokens it was sent.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	var hits, bearers atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "" {
			bearers.Add(1)
		}
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits, &bearers
}

func agentdHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ok","version":"9.9.9","active_sessions":3}`))
}

// resolvingTo is a client whose dialer sends every name to addr, as a DNS
// answer (or a rebinding one) would.
func resolvingTo(addr string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}}
}

// TestPrivateEnvironmentSSRF is finding 1 of the attack run: a member's
// private host whose name resolves to loopback (or that redirects there)
// must not make the console call it, on the probe or any later call.
func TestPrivateEnvironmentSSRF(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		w := newAccessWorld(t, d)
		alice := w.person(t, rbac.RoleMember+"@A")
		loop, hits, _ := countingServer(t, agentdHealthz)
		w.envs.HTTPClient = resolvingTo(strings.TrimPrefix(loop.URL, "http://"))

		in := hostInput("workstation", "http://workstation.example.net:49984", token("p"))
		in.Private = true
		e, err := w.envs.Create(ctx, alice, in)
		if err != nil {
			t.Fatal(err)
		}
		_, h, err := w.envs.Test(ctx, alice, e.ID, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if h.Status != envs.HealthUnreachable || !strings.Contains(h.Error, "not allowed") || h.Version != "" || h.ActiveSessions != 0 {
			t.Fatalf("probe of a name resolving to loopback = %+v, want unreachable, address not allowed, nothing of the answer", h)
		}
		c, err := w.envs.Agentd(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Stat(ctx, "."); !errors.Is(err, netguard.ErrBlocked) {
			t.Fatalf("a later call: %v, want the address refused", err)
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("the loopback server answered %d requests", n)
		}
		// The same environment shared (set up by those who may) reaches
		// it: the rule is for private ones.
		shared := w.hostIn(t, &w.deptA)
		if h := w.envs.Check(ctx, shared, 5*time.Second); h.Version != "9.9.9" {
			t.Fatalf("shared environment probe = %+v, want it to reach the server", h)
		}
	})
}

// TestRedirectsAreNotFollowed is finding 2: a host environment that
// redirects must not receive the probe's bearer token at the target, and
// the error says where the redirect pointed.
func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		f := setup(t, d)
		target, targetHits, _ := countingServer(t, agentdHealthz)
		redirector, _, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
		})
		e := f.mustCreate(t, hostInput("redirects", redirector.URL, token("r")))
		h := f.envs.Check(ctx, e, 5*time.Second)
		if h.Status == envs.HealthHealthy || !strings.Contains(h.Error, "redirect to "+target.URL) {
			t.Fatalf("health = %+v, want a failure naming the redirect target", h)
		}
		c, err := f.envs.Agentd(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Stat(ctx, "."); !errors.Is(err, envs.ErrRedirect) {
			t.Fatalf("authenticated call: %v, want ErrRedirect", err)
		}
		if n := targetHits.Load(); n != 0 {
			t.Fatalf("the redirect target got %d requests", n)
		}
	})
}

// TestProbeDetailAtTheConsolesMachine: "Test connection" of a shared
// environment on the console's own machine tells a closed port from an
// open one only to those with org-wide authority; what is stored says
// neither.
func TestProbeDetailAtTheConsolesMachine(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		w := newAccessWorld(t, d)
		owner := w.person(t, rbac.RoleDeptOwner+"@A")
		admin := w.person(t, rbac.RoleOrgAdmin+"@"+rbac.DomainOrg)
		notAgentd, _, _ := countingServer(t, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "postgres?", http.StatusTeapot) })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := "http://" + ln.Addr().String()
		ln.Close()
		var shown []string
		for _, url := range []string{notAgentd.URL, closed} {
			in := hostInput("probe-"+strings.NewReplacer(":", "-", "/", "-", ".", "-").Replace(url), url, token("x"))
			in.DepartmentID = &w.deptA
			e, err := w.envs.Create(ctx, owner, in)
			if err != nil {
				t.Fatal(err)
			}
			stored, h, err := w.envs.Test(ctx, owner, e.ID, nil, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if h.Error != envs.OwnMachineError || stored.HealthError != envs.OwnMachineError {
				t.Errorf("%s: a department owner sees %q (stored %q), want the undetailed message", url, h.Error, stored.HealthError)
			}
			shown = append(shown, h.Error)
			full, h, err := w.envs.Test(ctx, admin, e.ID, nil, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if h.Error == envs.OwnMachineError || full.HealthError != h.Error {
				t.Errorf("%s: an org admin sees %q, want the detail", url, h.Error)
			}
			if again, _ := w.envs.Get(ctx, owner, e.ID); again.HealthError != envs.OwnMachineError {
				t.Errorf("%s: stored error after an admin's test = %q", url, again.HealthError)
			}
		}
		if shown[0] != shown[1] {
			t.Errorf("an open and a closed port read differently: %q", shown)
		}
	})
}

func TestWorkspaceRootIsCleaned(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		cases := []struct{ in, stored, refused string }{
			{in: "/srv/../../etc", refused: `".."`},
			{in: `C:\work\..\Windows`, refused: `".."`},
			{in: "/srv/work/..", refused: `".."`},
			{in: "srv/work", refused: "absolute"},
			{in: "/srv/\x01work", refused: "control"},
			{in: "/" + strings.Repeat("a", 2000), refused: "at most"},
			{in: "/srv//work/./x/", stored: "/srv/work/x"},
			{in: `C:\work\\.\x\`, stored: `C:\work\x`},
			{in: "/", stored: "/"},
		}
		for i, tc := range cases {
			in := hostInput("root-"+string(rune('a'+i)), "http://10.0.0.1:49984", token("w"))
			in.WorkspaceRoot = ptr(tc.in)
			e, err := f.envs.Create(context.Background(), sys, in)
			if tc.refused != "" {
				wantField(t, err, "workspace_root", tc.refused)
				continue
			}
			if err != nil {
				t.Fatalf("%q: %v", tc.in, err)
			}
			if e.WorkspaceRoot != tc.stored {
				t.Errorf("%q stored as %q, want %q", tc.in, e.WorkspaceRoot, tc.stored)
			}
		}
	})
}

// TestBackendTemplatesOfAHost: asking a host for backend templates is the
// caller's mistake (400), not a server error.
func TestBackendTemplatesOfAHost(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		e := f.mustCreate(t, hostInput("just-a-host", "http://10.0.0.2:49984", token("h")))
		_, err := f.envs.BackendTemplates(context.Background(), sys, e.ID)
		wantKind(t, err, apperr.ErrInvalid, "not_a_sandbox_environment")
	})
}
