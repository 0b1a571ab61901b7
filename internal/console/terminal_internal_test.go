package console

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/netguard"
)

// TestPrivateAgentdClientRefusesBeforeConnecting: the client the gateway
// uses for private environments refuses the console's own machine before
// a TCP handshake, so a private environment cannot probe its ports (a
// check after connecting would complete one).
func TestPrivateAgentdClientRefusesBeforeConnecting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = agentdClient(netguard.Blocked).Get("http://" + ln.Addr().String() + "/healthz")
	if !errors.Is(err, netguard.ErrBlocked) {
		t.Fatalf("a private environment's call to the console's own machine: %v, want it blocked", err)
	}
	// A completed handshake would wait in the backlog: Accept returns it
	// at once. None is there.
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Fatal("the refused call connected to the console's own machine first")
	}
}
