package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/recorder"
)

// landedConn is a connection that reports landing at another address, as
// a name resolved elsewhere would.
type landedConn struct {
	net.Conn
	remote net.Addr
}

func (c landedConn) RemoteAddr() net.Addr { return c.remote }

// TestPrivateEnvironmentClientReusesConnections: calls to a private
// environment's agentd (every keystroke, poll and recorded batch) share
// kept-alive connections, from the gateway and the followers alike, while
// every new connection still passes netguard's check.
func TestPrivateEnvironmentClientReusesConnections(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	var dials atomic.Int64
	base := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		conn, err := (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
		if err != nil {
			return nil, err
		}
		landed := &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 80}
		if host, _, _ := net.SplitHostPort(addr); host == "metadata.test" {
			landed = &net.TCPAddr{IP: net.ParseIP("169.254.169.254"), Port: 80}
		}
		return landedConn{conn, landed}, nil
	}}}
	f := &recorder.Followers{HTTP: base}
	g := &Gateway{HTTP: base, Followers: f}
	owner := int64(7)
	private := envs.Environment{ID: 3, OwnerUserID: &owner}

	get := func(hc *http.Client, url string) error {
		res, err := hc.Get(url)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		_, err = io.ReadAll(res.Body)
		return err
	}
	clients := []*http.Client{g.agentdHTTP(private), f.HTTPFor(private), g.agentdHTTP(private)}
	for i, hc := range clients {
		if hc.CheckRedirect == nil {
			t.Fatal("the private environment's client follows redirects")
		}
		if err := get(hc, "http://agentd.test/v1/healthz"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections opened for %d sequential calls to one private environment, want 1 kept alive", n, len(clients))
	}
	// The check still applies to every new connection.
	if err := get(g.agentdHTTP(private), "http://metadata.test/"); !errors.Is(err, netguard.ErrBlocked) {
		t.Fatalf("a private environment's call landing on the metadata service: %v, want it blocked", err)
	}
	// An environment of the org goes through the base transport as it is.
	if hc := g.agentdHTTP(envs.Environment{ID: 4}); hc.Transport != base.Transport {
		t.Fatal("a shared environment's client does not use the base transport")
	}
}
