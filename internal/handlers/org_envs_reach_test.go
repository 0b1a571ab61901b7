package handlers_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gatehouse/gatehouse/internal/netguard/netguardtest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// dialAll is a client whose connections all reach target and report
// landing at landed (nil: where they really landed), as a DNS answer
// pointing there would.
func dialAll(target string, landed net.IP) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, target)
		if err != nil || landed == nil {
			return conn, err
		}
		return landedAt{conn, &net.TCPAddr{IP: landed, Port: 80}}, nil
	}}}
}

type landedAt struct {
	net.Conn
	remote net.Addr
}

func (c landedAt) RemoteAddr() net.Addr { return c.remote }

// Item 13 of issue 21: a member's private environment at the console
// host's own non-loopback address is refused when entered (400 naming
// url), and "Test connection" of one whose name resolves there sends that
// address nothing, the bearer token included.
func TestPrivateEnvironmentAtTheConsolesLANAddress(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		var hits, bearers atomic.Int64
		own := netguardtest.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			if r.Header.Get("Authorization") != "" {
				bearers.Add(1)
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"status":"ok","version":"6.6.6","active_sessions":42}`))
		}))
		ownHost := netip.MustParseAddrPort(own.Listener.Addr().String()).Addr().String()
		base := "/api/v1/orgs/acme/environments"
		laptop := map[string]any{"name": "laptop", "kind": "host", "private": true, "url": own.URL,
			"os": "linux", "deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20)}

		r := f.e.json(http.MethodPost, base, f.tokens["plain"], laptop)
		wantStatus(t, "private env at the console's own address", r, http.StatusBadRequest)
		mustContain(t, "url refusal", r.envelope(t).Error.Fields["url"], ownHost, "console's own machine")

		laptop["url"] = "http://laptop.corp.example:49984"
		r = f.e.json(http.MethodPost, base, f.tokens["plain"], laptop)
		wantStatus(t, "private env by name", r, http.StatusCreated)
		var env envOut
		r.decode(t, &env)
		r = f.e.json(http.MethodPatch, fmt.Sprintf("%s/%d", base, env.ID), f.tokens["plain"],
			map[string]any{"url": own.URL, "agentd_token": strings.Repeat("t", 20)})
		wantStatus(t, "move it to the console's own address", r, http.StatusBadRequest)
		mustContain(t, "url refusal", r.envelope(t).Error.Fields["url"], "console's own machine")

		// The name resolves to the console's own address.
		f.e.c.Server.OutboundHTTP = dialAll(own.Listener.Addr().String(), nil)
		r = f.e.json(http.MethodPost, fmt.Sprintf("%s/%d/test", base, env.ID), f.tokens["plain"], nil)
		wantStatus(t, "test connection", r, http.StatusOK)
		mustContain(t, "test connection", string(r.body), "not allowed")
		if strings.Contains(string(r.body), "6.6.6") {
			t.Errorf("test connection shows the answer of the console's own machine: %s", r.body)
		}
		if hits.Load() != 0 || bearers.Load() != 0 {
			t.Fatalf("the service on the console's own address got %d requests (%d with the token)", hits.Load(), bearers.Load())
		}
	})
}

// Item 13 of issue 21: no environment, shared ones registered by org
// admins included, may point at a link-local or metadata address (400
// naming the field), and one whose name resolves to the metadata address
// is not probed.
func TestSharedEnvironmentAtMetadataAddress(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		base := "/api/v1/orgs/acme/environments"
		host := func(url string) map[string]any {
			return map[string]any{"name": "meta", "kind": "host", "url": url, "os": "linux", "deployment": "cloud-vm",
				"agentd_token": strings.Repeat("m", 20)}
		}
		for _, target := range []string{"http://169.254.169.254", "http://169.254.169.254/latest/meta-data", "http://169.254.3.4:49984",
			"http://[fe80::1]:49984", "http://[fd00:ec2::254]", "http://100.100.100.200"} {
			r := f.e.json(http.MethodPost, base, f.tokens["admin"], host(target))
			wantStatus(t, "admin's shared env at "+target, r, http.StatusBadRequest)
			mustContain(t, target, r.envelope(t).Error.Fields["url"], "link-local or cloud metadata address")
		}
		dept := host("http://169.254.169.254")
		dept["department_id"] = f.dept1
		r := f.e.json(http.MethodPost, base, f.tokens["owner"], dept)
		wantStatus(t, "department env at the metadata address", r, http.StatusBadRequest)
		mustContain(t, "department env", r.envelope(t).Error.Fields["url"], "link-local")
		r = f.e.json(http.MethodPost, base, f.tokens["admin"], map[string]any{"name": "meta-sbx", "kind": "sandbox",
			"url": "https://api.e2b.app", "proxy_base_url": "http://169.254.169.254:3000", "sandbox_scheme": "http",
			"api_key": "k", "agentd_token": strings.Repeat("m", 20)})
		wantStatus(t, "sandbox env proxied through the metadata address", r, http.StatusBadRequest)
		mustContain(t, "sandbox env", r.envelope(t).Error.Fields["proxy_base_url"], "link-local")

		srv, hits, bearers := fakeAgentd(t)
		r = f.e.json(http.MethodPost, base, f.tokens["admin"], host("http://metadata.corp.example"))
		wantStatus(t, "shared env by name", r, http.StatusCreated)
		var env envOut
		r.decode(t, &env)
		f.e.c.Server.OutboundHTTP = dialAll(strings.TrimPrefix(srv.URL, "http://"), net.ParseIP("169.254.169.254"))
		r = f.e.json(http.MethodPost, fmt.Sprintf("%s/%d/test", base, env.ID), f.tokens["admin"], nil)
		wantStatus(t, "test connection", r, http.StatusOK)
		mustContain(t, "test connection", string(r.body), "169.254.169.254 is a link-local address", "not allowed")
		if hits.Load() != 0 || bearers.Load() != 0 {
			t.Fatalf("the service behind the metadata address got %d requests (%d with the token)", hits.Load(), bearers.Load())
		}
	})
}
