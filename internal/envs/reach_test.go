package envs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/netguard/netguardtest"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// ownAgentd is a fake agentd on this machine's non-loopback address (its
// LAN address), counting the requests it is sent.
func ownAgentd(t *testing.T) (url, hostPort string, hits *atomic.Int64) {
	t.Helper()
	hits = new(atomic.Int64)
	srv := netguardtest.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		agentdHealthz(w, r)
	}))
	return srv.URL, srv.Listener.Addr().String(), hits
}

// landingAt is a client whose connections reach srv but report landing at
// landed, as a name resolving to landed would; what it sends arrives.
func landingAt(srv string, landed net.IP) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, srv)
		if err != nil {
			return nil, err
		}
		return landedConn{conn, &net.TCPAddr{IP: landed, Port: 80}}, nil
	}}}
}

type landedConn struct {
	net.Conn
	remote net.Addr
}

func (c landedConn) RemoteAddr() net.Addr { return c.remote }

// TestPrivateEnvironmentAtTheConsolesOwnAddress is item 13's first half:
// a member's private environment may not point at the console host's own
// non-loopback address, when entered (a field error on url) nor when
// dialled (an environment stored before the rule, or a name resolving
// there): "Test connection" then sends that machine nothing, no bearer
// token included.
func TestPrivateEnvironmentAtTheConsolesOwnAddress(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		w := newAccessWorld(t, d)
		alice := w.person(t, rbac.RoleMember+"@A")
		owner := w.person(t, rbac.RoleDeptOwner+"@A")
		own, hostPort, hits := ownAgentd(t)
		ownHost := netip.MustParseAddrPort(hostPort).Addr().String()

		t.Run("registering one is refused on url", func(t *testing.T) {
			in := hostInput("my-lan-console", own, token("o"))
			in.Private = true
			_, err := w.envs.Create(ctx, alice, in)
			wantField(t, err, "url", ownHost+" is an address of the console's own machine")
		})
		in := hostInput("alice-laptop", "http://10.1.2.3:49984", token("p"))
		in.Private = true
		laptop, err := w.envs.Create(ctx, alice, in)
		if err != nil {
			t.Fatal(err)
		}
		t.Run("moving one there is refused on url", func(t *testing.T) {
			_, _, err := w.envs.Update(ctx, alice, laptop.ID, envs.Input{URL: ptr(own), AgentdToken: ptr(token("p"))})
			wantField(t, err, "url", "console's own machine")
		})
		t.Run("one stored before the rule is not called", func(t *testing.T) {
			if err := w.db.Exec("UPDATE environments SET url = ? WHERE id = ?", own, laptop.ID).Error; err != nil {
				t.Fatal(err)
			}
			_, h, err := w.envs.Test(ctx, alice, laptop.ID, nil, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if h.Status != envs.HealthUnreachable || !strings.Contains(h.Error, "not allowed") || h.Version != "" {
				t.Fatalf("test connection = %+v, want unreachable, address not allowed, nothing of the answer", h)
			}
			e, err := w.envs.Get(ctx, alice, laptop.ID)
			if err != nil {
				t.Fatal(err)
			}
			c, err := w.envs.Agentd(e)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Stat(ctx, "."); !errors.Is(err, netguard.ErrBlocked) {
				t.Fatalf("a later call: %v, want the address refused", err)
			}
		})
		t.Run("a name resolving there is not called", func(t *testing.T) {
			svc := *w.envs
			svc.HTTPClient = resolvingTo(hostPort)
			in := hostInput("workstation", "http://workstation.example.net:49984", token("w"))
			in.Private = true
			e, err := svc.Create(ctx, alice, in)
			if err != nil {
				t.Fatal(err)
			}
			_, h, err := svc.Test(ctx, alice, e.ID, nil, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if h.Status != envs.HealthUnreachable || !strings.Contains(h.Error, "not allowed") {
				t.Fatalf("test connection = %+v, want the address refused", h)
			}
		})
		if n := hits.Load(); n != 0 {
			t.Fatalf("the service on the console's own address got %d requests", n)
		}
		t.Run("a shared environment there is reached", func(t *testing.T) {
			in := hostInput("lan-agentd", own, token("s"))
			in.DepartmentID = &w.deptA
			e, err := w.envs.Create(ctx, owner, in)
			if err != nil {
				t.Fatal(err)
			}
			if _, h, err := w.envs.Test(ctx, owner, e.ID, nil, 5*time.Second); err != nil || h.Version != "9.9.9" {
				t.Fatalf("shared environment on the console's machine: %+v, %v; want it reached", h, err)
			}
		})
	})
}

// TestNoEnvironmentAtMetadataAddresses is item 13's second half: no
// environment, shared ones set up by admins included, host or sandbox
// backend, may point at a link-local or cloud metadata address, when
// entered nor when dialled.
func TestNoEnvironmentAtMetadataAddresses(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		w := newAccessWorld(t, d)
		admin := w.person(t, rbac.RoleOrgAdmin+"@"+rbac.DomainOrg)
		targets := []string{"http://169.254.169.254", "http://169.254.1.2:49984", "http://[fe80::1]:49984", "http://[fe80::1%25eth0]:49984",
			"http://[fd00:ec2::254]", "http://100.100.100.200", "http://[::ffff:169.254.169.254]", "http://[64:ff9b::a9fe:a9fe]"}
		for i, target := range targets {
			t.Run("shared host at "+target, func(t *testing.T) {
				_, err := w.envs.Create(ctx, admin, hostInput(fmt.Sprintf("meta-%d", i), target, token("m")))
				wantField(t, err, "url", "no environment may point at a link-local or cloud metadata address")
			})
		}
		t.Run("sandbox backend addresses", func(t *testing.T) {
			_, err := w.envs.Create(ctx, admin, sandboxInput("meta-api", "http://169.254.169.254/v1", "e2b.app", token("m"), "k"))
			wantField(t, err, "url", "link-local")
			in := sandboxInput("meta-proxy", "https://api.e2b.app", "", token("m"), "k")
			in.SandboxDomain, in.ProxyBaseURL = nil, ptr("http://169.254.169.254:3000")
			_, err = w.envs.Create(ctx, admin, in)
			wantField(t, err, "proxy_base_url", "link-local")
			_, err = w.envs.Create(ctx, admin, sandboxInput("meta-domain", "https://api.e2b.app", "100.100.100.200:8080", token("m"), "k"))
			wantField(t, err, "sandbox_domain", "metadata")
		})
		shared := w.hostIn(t, nil)
		t.Run("moving a shared host there is refused", func(t *testing.T) {
			_, _, err := w.envs.Update(ctx, admin, shared.ID, envs.Input{URL: ptr("http://169.254.169.254"), AgentdToken: ptr(token("h"))})
			wantField(t, err, "url", "link-local")
		})
		t.Run("one stored before the rule is not dialled", func(t *testing.T) {
			if err := w.db.Exec("UPDATE environments SET url = ? WHERE id = ?", "http://169.254.169.254", shared.ID).Error; err != nil {
				t.Fatal(err)
			}
			_, h, err := w.envs.Test(ctx, admin, shared.ID, nil, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if h.Status != envs.HealthUnreachable || !strings.Contains(h.Error, "169.254.169.254 is a link-local address") || !strings.Contains(h.Error, "not allowed") {
				t.Fatalf("test connection = %+v, want the metadata address refused", h)
			}
			e, err := w.envs.Get(ctx, admin, shared.ID)
			if err != nil {
				t.Fatal(err)
			}
			c, err := w.envs.Agentd(e)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Stat(ctx, "."); !errors.Is(err, netguard.ErrBlocked) {
				t.Fatalf("a later call: %v, want the address refused", err)
			}
			sb, _ := w.sandboxIn(t, nil)
			if err := w.db.Exec("UPDATE environments SET url = ? WHERE id = ?", "http://[fd00:ec2::254]", sb.ID).Error; err != nil {
				t.Fatal(err)
			}
			if sb, err = w.envs.Get(ctx, admin, sb.ID); err != nil {
				t.Fatal(err)
			}
			b, err := w.envs.Backend(sb)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Health(ctx); !errors.Is(err, netguard.ErrBlocked) {
				t.Fatalf("the sandbox backend's call: %v, want the address refused", err)
			}
		})
		t.Run("a name resolving there is not probed", func(t *testing.T) {
			srv, hits, bearers := countingServer(t, agentdHealthz)
			svc := *w.envs
			svc.HTTPClient = landingAt(strings.TrimPrefix(srv.URL, "http://"), net.ParseIP("169.254.169.254"))
			e, err := svc.Create(ctx, admin, hostInput("metadata-by-name", "http://metadata.example.net", token("n")))
			if err != nil {
				t.Fatal(err)
			}
			_, h, err := svc.Test(ctx, admin, e.ID, nil, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if h.Status != envs.HealthUnreachable || !strings.Contains(h.Error, "not allowed") || h.Version != "" {
				t.Fatalf("test connection = %+v, want the address refused", h)
			}
			if hits.Load() != 0 || bearers.Load() != 0 {
				t.Fatalf("the service behind the metadata address got %d requests (%d with the token)", hits.Load(), bearers.Load())
			}
		})
	})
}
