package netfault_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/netfault"
)

// echoServer answers every line with its own name and the line.
func echoServer(t *testing.T, name string) net.Listener {
	t.Helper()
	return echoServerOn(t, name, "127.0.0.1:0")
}

// echoServerOn is echoServer on addr.
func echoServerOn(t *testing.T, name, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "%s %s\n", name, sc.Text())
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ask sends one line on a new connection to addr and returns the answer
// ("" when the connection was refused or closed).
func ask(t *testing.T, addr, line string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintln(c, line)
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimSpace(got)
}

// TestForwarder: a cut closes live connections and refuses new ones until
// Restore; SetTarget moves new connections to another target.
func TestForwarder(t *testing.T) {
	t.Parallel()
	a, b := echoServer(t, "a"), echoServer(t, "b")
	f, err := netfault.NewForwarder(a.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if got := ask(t, f.Addr(), "hi"); got != "a hi" {
		t.Fatalf("through the forwarder: %q", got)
	}
	live, err := net.Dial("tcp", f.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	fmt.Fprintln(live, "first")
	r := bufio.NewReader(live)
	if got, _ := r.ReadString('\n'); got != "a first\n" {
		t.Fatalf("live connection: %q", got)
	}
	f.Cut()
	_ = live.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); err != io.EOF {
		t.Errorf("a live connection after the cut read %v, want EOF", err)
	}
	if got := ask(t, f.Addr(), "cut"); got != "" {
		t.Errorf("a new connection during the cut was answered: %q", got)
	}
	f.Restore()
	if got := ask(t, f.Addr(), "back"); got != "a back" {
		t.Errorf("after Restore: %q", got)
	}
	f.SetTarget(b.Addr().String())
	if got := ask(t, f.Addr(), "moved"); got != "b moved" {
		t.Errorf("after SetTarget: %q", got)
	}
}

// TestBalancer: connections go round-robin over the backends, a backend
// that refuses is passed over, and one that returns is used again.
func TestBalancer(t *testing.T) {
	t.Parallel()
	a, b := echoServer(t, "a"), echoServer(t, "b")
	bAddr := b.Addr().String()
	lb, err := netfault.NewBalancer([]string{a.Addr().String(), bAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	seen := map[string]int{}
	for i := range 4 {
		seen[strings.Fields(ask(t, lb.Addr(), fmt.Sprint(i)))[0]]++
	}
	if seen["a"] != 2 || seen["b"] != 2 {
		t.Fatalf("round-robin over two backends answered %v", seen)
	}
	b.Close() // b refuses from now on
	for i := range 4 {
		if got := ask(t, lb.Addr(), "x"); got != "a x" {
			t.Fatalf("request %d with b down: %q", i, got)
		}
	}
	if lb.Skipped.Load() == 0 {
		t.Error("no backend was counted as skipped")
	}
	// A replica that returns listens on its old address again.
	echoServerOn(t, "b2", bAddr)
	seen = map[string]int{}
	for i := range 4 {
		seen[strings.Fields(ask(t, lb.Addr(), fmt.Sprint(i)) + " ?")[0]]++
	}
	if seen["b2"] == 0 {
		t.Errorf("the returned backend got no connection: %v", seen)
	}
}
