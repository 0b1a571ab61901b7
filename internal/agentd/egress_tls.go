package agentd

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// peekSNI returns the server name of the TLS ClientHello at the head of
// br without consuming it ("" when the record is not a ClientHello with
// one; ECH and a hello split over records give "").
func peekSNI(br *bufio.Reader) string {
	hdr, err := br.Peek(5)
	if err != nil || hdr[0] != 0x16 {
		return ""
	}
	n := int(hdr[3])<<8 | int(hdr[4])
	rec, err := br.Peek(5 + n)
	if err != nil {
		return ""
	}
	return clientHelloSNI(rec[5:])
}

// clientHelloSNI parses a handshake message holding a ClientHello.
func clientHelloSNI(b []byte) string {
	s := cryptobyte.String(b)
	var msgType uint8
	var hello cryptobyte.String
	if !s.ReadUint8(&msgType) || msgType != 1 || !s.ReadUint24LengthPrefixed(&hello) {
		return ""
	}
	var sessionID, suites, compression, exts cryptobyte.String
	if !hello.Skip(2+32) || !hello.ReadUint8LengthPrefixed(&sessionID) ||
		!hello.ReadUint16LengthPrefixed(&suites) || !hello.ReadUint8LengthPrefixed(&compression) ||
		!hello.ReadUint16LengthPrefixed(&exts) {
		return ""
	}
	for !exts.Empty() {
		var typ uint16
		var body cryptobyte.String
		if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&body) {
			return ""
		}
		if typ != 0 { // server_name
			continue
		}
		var list cryptobyte.String
		if !body.ReadUint16LengthPrefixed(&list) {
			return ""
		}
		for !list.Empty() {
			var nameType uint8
			var name cryptobyte.String
			if !list.ReadUint8(&nameType) || !list.ReadUint16LengthPrefixed(&name) {
				return ""
			}
			if nameType == 0 {
				return strings.TrimSuffix(strings.ToLower(string(name)), ".")
			}
		}
	}
	return ""
}

// egressCA is a session's own certificate authority for inspected TLS:
// its certificate is in the session's trust (a file agentd writes), its
// key never leaves agentd, and it dies with the session.
type egressCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// maxLeaves bounds the certificates one session's CA keeps.
const maxLeaves = 256

func newEgressCA() (*egressCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "agentd session egress inspection"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(MaxTimeout + 24*time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &egressCA{cert: cert, key: key, der: der, leaves: map[string]*tls.Certificate{}}, nil
}

// leaf is a certificate for name signed by the CA.
func (ca *egressCA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[name]; c != nil {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.der}, PrivateKey: key}
	ca.leaves[name] = c
	return c, nil
}

// systemBundles are where Linux distributions keep their trusted roots
// (the list crypto/x509 reads).
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/pki/tls/cacert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// openCA makes the session's CA and writes its certificate into a
// session-private directory: ca.pem alone (NODE_EXTRA_CA_CERTS adds it)
// and bundle.pem, the system's roots plus it (SSL_CERT_FILE,
// REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE replace the roots).
func (e *sessionEgress) openCA() error {
	ca, err := newEgressCA()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "agentd-egress-")
	if err != nil {
		return err
	}
	e.ca, e.caDir = ca, dir
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	pemCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
	bundle := []byte{}
	for _, p := range append([]string{os.Getenv("SSL_CERT_FILE")}, systemBundles...) {
		if b, err := os.ReadFile(p); p != "" && err == nil {
			bundle = append(b, '\n')
			break
		}
	}
	bundle = append(bundle, pemCA...)
	caFile, bundleFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(caFile, pemCA, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(bundleFile, bundle, 0o644); err != nil {
		return err
	}
	e.env = append(e.env, "SSL_CERT_FILE="+bundleFile, "REQUESTS_CA_BUNDLE="+bundleFile,
		"CURL_CA_BUNDLE="+bundleFile, "NODE_EXTRA_CA_CERTS="+caFile)
	return nil
}

// inspect terminates the client's TLS (whose ClientHello may be buffered
// in nc.br) with a certificate for name from the session's CA, and serves
// the HTTP requests inside, each decided with its method and path and
// sent on over TLS verified as usual.
func (nc *netConn) inspect(client net.Conn, name string, port int) {
	nc.rec.Inspected, nc.rec.Name, nc.rec.Port = true, name, port
	ca := nc.e.ca
	if ca == nil {
		nc.deny("The rule inspects TLS, and the session has no inspection CA: only a policy that inspects when the session is created gives it one.")
		return
	}
	cfg := &tls.Config{
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if h.ServerName != "" {
				return ca.leaf(strings.ToLower(h.ServerName))
			}
			return ca.leaf(name)
		},
	}
	tc := tls.Server(bufferedConn{Conn: client, r: nc.br}, cfg)
	ctx, cancel := context.WithTimeout(nc.e.ctx, egressDialTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		nc.deny("The client did not complete TLS with the inspecting proxy: " + err.Error())
		return
	}
	defer tc.Close()
	br := bufio.NewReader(tc)
	req, err := http.ReadRequest(br)
	if err != nil {
		nc.deny("The inspected connection did not carry an HTTP/1.1 request.")
		return
	}
	nc.br = br
	nc.serveRequests(req, br, tc, true)
}

// bufferedConn reads what a bufio.Reader already holds first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
