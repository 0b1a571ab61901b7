package agentd

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/gatehouse/gatehouse/internal/policy"
)

// serveHTTP serves a connection that starts with an HTTP request: a
// CONNECT (the session's proxy variables, or a client configured with a
// proxy), an absolute-form request (the same, for http:// URLs) or an
// origin-form request aimed at an address (in a namespace).
func (nc *netConn) serveHTTP() {
	req, err := http.ReadRequest(nc.br)
	if err != nil {
		nc.deny("The connection sent a request the proxy could not read.")
		return
	}
	if req.Method == http.MethodConnect {
		nc.serveConnect(req)
		return
	}
	nc.serveRequests(req, nc.br, nc.client, false)
}

// serveConnect opens a tunnel to the CONNECT target once the policy
// allows it (403 naming the rule otherwise); with a rule that inspects
// it, agentd terminates the tunnel's TLS itself.
func (nc *netConn) serveConnect(req *http.Request) {
	name, port := splitHostPort(req.RequestURI, 443)
	if nc.inspects(name, port) {
		if _, err := io.WriteString(nc.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err == nil {
			nc.inspect(nc.client, name, port)
		}
		return
	}
	up := nc.connect(name, port, "", "")
	if up == nil {
		writeDenied(nc.client, nc.rec)
		return
	}
	if _, err := io.WriteString(nc.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		up.Close()
		return
	}
	nc.relay(nc.client, up)
}

// upstream is the destination requests of one client connection go to.
type upstream struct {
	conn net.Conn
	br   *bufio.Reader
	name string
	port int
}

func (u *upstream) close() {
	if u.conn != nil {
		u.conn.Close()
		u.conn = nil
	}
}

// serveRequests serves HTTP requests read from br (the first is req) and
// answers on w. Every request is decided on its own (its method, path and
// destination) before it is forwarded, on plain HTTP as inside inspected
// TLS: a keep-alive connection is never relayed untouched, so a second
// request cannot reach what the first could not have. A request whose
// destination (absolute URL, else Host) differs from the connection's is
// decided as that destination and goes to a connection of its own. A
// denied request is answered 403 with a body that names the rule, and the
// connection ends.
func (nc *netConn) serveRequests(req *http.Request, br *bufio.Reader, w net.Conn, inspected bool) {
	var up upstream
	defer up.close()
	defPort := 80
	if inspected {
		defPort = int(nc.orig.Port())
		if nc.rec.Port != 0 {
			defPort = nc.rec.Port
		}
	} else if nc.orig.IsValid() {
		defPort = int(nc.orig.Port())
	}
	for {
		host := req.Host
		if req.URL.Host != "" {
			// An absolute URL names the destination, and the Host the
			// server sees must be the one decided (RFC 9112, 3.2.2).
			host = req.URL.Host
			req.Host = host
		}
		name, port := splitHostPort(host, defPort)
		nc.rec.Host = req.Host
		if !nc.sendTo(&up, req, name, port, inspected) {
			writeDenied(w, nc.rec)
			return
		}
		if !nc.exchange(&up, req, br, w) {
			return
		}
		next, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		req = next
	}
}

// sendTo makes up the destination of req (deciding it, and dialling a
// new one when it changed) and reports whether req may be sent.
func (nc *netConn) sendTo(up *upstream, req *http.Request, name string, port int, inspected bool) bool {
	path := req.URL.RequestURI()
	req.URL.Scheme, req.URL.Host = "", ""
	req.Header.Del("Proxy-Connection")
	req.Header.Del("Proxy-Authorization")
	if up.conn != nil && up.name == name && up.port == port {
		d := nc.pol.Policy.DecideConn(policy.Conn{Name: name, Addr: addrOf(up.conn), Port: port, Method: req.Method, Path: path})
		nc.rec.Method, nc.rec.Path = req.Method, path
		return nc.allowed(nc.e.ctx, d)
	}
	up.close()
	conn := nc.connect(name, port, req.Method, path)
	if conn == nil {
		return false
	}
	if inspected {
		tc := tls.Client(conn, &tls.Config{ServerName: name, RootCAs: nc.e.svc.roots, NextProtos: []string{"http/1.1"}})
		ctx, cancel := context.WithTimeout(nc.e.ctx, egressDialTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			conn.Close()
			nc.rec.Error = "TLS to " + name + ": " + err.Error()
			return false
		}
		conn = tc
	}
	*up = upstream{conn: conn, br: bufio.NewReader(conn), name: name, port: port}
	return true
}

// exchange forwards req and its answer and reports whether the
// connection may carry another request.
func (nc *netConn) exchange(up *upstream, req *http.Request, br *bufio.Reader, w net.Conn) bool {
	if up.conn == nil {
		return false
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// The request is allowed: the client may send its body. The proxy
		// answers the expectation itself, so the server's answer that
		// follows is always the final one.
		req.Header.Del("Expect")
		if _, err := io.WriteString(countWriter{w, &nc.rec.BytesIn}, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false
		}
	}
	if err := req.Write(countWriter{up.conn, &nc.rec.BytesOut}); err != nil {
		return false
	}
	nc.lookupPeer()
	resp, err := http.ReadResponse(up.br, req)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		// An interim answer (103 Early Hints): passed on, then the
		// final one is read.
		if err = writeInterim(countWriter{w, &nc.rec.BytesIn}, resp); err == nil {
			resp, err = http.ReadResponse(up.br, req)
		}
	}
	if err != nil {
		return false
	}
	err = resp.Write(countWriter{w, &nc.rec.BytesIn})
	resp.Body.Close()
	if err != nil {
		return false
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if n := up.br.Buffered(); n > 0 {
			b, _ := up.br.Peek(n)
			w.Write(b)
			nc.rec.BytesIn += int64(n)
		}
		nc.br = br
		nc.relay(w, up.conn)
		return false
	}
	return !req.Close && !resp.Close
}

// writeInterim writes a 1xx answer: its status line and header, no body.
func writeInterim(w io.Writer, resp *http.Response) error {
	if _, err := fmt.Fprintf(w, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode)); err != nil {
		return err
	}
	if err := resp.Header.Write(w); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\r\n")
	return err
}

func addrOf(c net.Conn) (a netip.Addr) {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return a
}

// countWriter counts what it writes.
type countWriter struct {
	w io.Writer
	n *int64
}

func (c countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += int64(n)
	return n, err
}

// writeDenied answers a refused request: 403, with the decision in the
// body (nothing when a dial failed rather than the policy refusing).
func writeDenied(w io.Writer, r NetRecord) {
	if r.Decision != NetDeny {
		writeStatus(w, http.StatusBadGateway, "agentd could not reach the destination: "+r.Error)
		return
	}
	writeStatus(w, http.StatusForbidden, "agentd: the session's network policy (version "+fmt.Sprint(r.PolicyVersion)+") denies this connection: "+r.Reason)
}

func writeStatus(w io.Writer, status int, body string) {
	body += "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}
