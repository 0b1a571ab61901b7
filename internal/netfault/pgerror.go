package netfault

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"
)

// PGError is an error a Postgres server sends in an ErrorResponse.
type PGError struct {
	Severity string // FATAL unless set
	Code     string // the SQLSTATE, e.g. 57P03
	Message  string
}

// sslRequestCode and gssEncRequestCode are the protocol numbers of the
// requests a client may send before its startup message.
const (
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
)

// answer reads the client's startup message (declining SSL and GSS
// encryption first, as a server without them does), answers it with e and
// closes the connection.
func (e PGError) answer(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dialTimeout))
	for {
		code, err := readStartup(c)
		if err != nil {
			return
		}
		if code != sslRequestCode && code != gssEncRequestCode {
			break
		}
		if _, err := c.Write([]byte{'N'}); err != nil {
			return
		}
	}
	_, _ = c.Write(e.Packet())
}

// readStartup reads one untyped startup-phase message and returns its
// protocol code.
func readStartup(r io.Reader) (uint32, error) {
	var head [8]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(head[:4])
	if n < 8 || n > 10000 {
		return 0, errors.New("netfault: not a startup message")
	}
	if _, err := io.CopyN(io.Discard, r, int64(n-8)); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(head[4:]), nil
}

// Packet is e as an ErrorResponse message on the wire.
func (e PGError) Packet() []byte {
	sev := e.Severity
	if sev == "" {
		sev = "FATAL"
	}
	var body []byte
	for _, f := range []struct {
		tag byte
		v   string
	}{{'S', sev}, {'V', sev}, {'C', e.Code}, {'M', e.Message}} {
		body = append(body, f.tag)
		body = append(body, f.v...)
		body = append(body, 0)
	}
	body = append(body, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(body)))
	return append(msg, body...)
}
