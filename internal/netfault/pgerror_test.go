package netfault_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/netfault"
)

// A refusing forwarder answers like a Postgres server refusing the
// connection: SSL declined ('N'), the startup message answered with the
// ErrorResponse, the connection closed; the target is never dialled.
// Restore forwards again.
func TestRefuseAnswersAsPostgres(t *testing.T) {
	t.Parallel()
	target := echoServer(t, "target")
	f, err := netfault.NewForwarder(target.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	e := netfault.PGError{Code: "57P03", Message: "the database system is starting up"}
	f.Refuse(e)

	c, err := net.Dial("tcp", f.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	ssl := make([]byte, 8)
	binary.BigEndian.PutUint32(ssl, 8)
	binary.BigEndian.PutUint32(ssl[4:], 80877103)
	if _, err := c.Write(ssl); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'N' {
		t.Fatalf("answer to SSLRequest: %q %v, want N", b, err)
	}
	params := []byte("user\x00postgres\x00\x00")
	startup := make([]byte, 8, 8+len(params))
	binary.BigEndian.PutUint32(startup, uint32(8+len(params)))
	binary.BigEndian.PutUint32(startup[4:], 196608)
	if _, err := c.Write(append(startup, params...)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, e.Packet()) || !bytes.Contains(got, []byte("C57P03\x00")) || got[0] != 'E' {
		t.Fatalf("answer to the startup: %q, want the ErrorResponse %q", got, e.Packet())
	}

	f.Restore()
	c2, err := net.Dial("tcp", f.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c2.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("target hello\n"))
	if _, err := io.ReadFull(c2, line); err != nil || string(line) != "target hello\n" {
		t.Fatalf("after Restore: %q %v, want the target's answer", line, err)
	}
}
