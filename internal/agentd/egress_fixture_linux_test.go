//go:build linux

package agentd_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// egressWorld is what an egress test's sessions may try to reach: a DNS
// server of its own (the only resolver agentd asks), HTTPS and HTTP
// servers on a loopback address of their own, and a trap on another that
// must never see a connection. Nothing outside this machine is involved.
type egressWorld struct {
	dnsAddr   string
	serverIP  netip.Addr // where every test name resolves (but meta.test)
	trapIP    netip.Addr
	tlsPort   int
	httpPort  int
	caFile    string // the servers' CA, for curl --cacert
	roots     *x509.CertPool
	trapConns atomic.Int64
	udpGot    atomic.Int64
	udpAddr   string

	mu      sync.Mutex
	queries map[string]int
}

// newEgressWorld starts the servers; they stop with the test.
func newEgressWorld(t *testing.T) *egressWorld { return newEgressWorldTB(t) }

func newEgressWorldTB(t testing.TB) *egressWorld {
	t.Helper()
	w := &egressWorld{queries: map[string]int{}}
	w.serverIP = randomLoopback()
	w.trapIP = hostAddr(t)
	caCert, caKey := testCA(t)
	w.roots = x509.NewCertPool()
	w.roots.AddCert(caCert)
	w.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(w.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	leaf := testLeaf(t, caCert, caKey, "allowed.test", "other.test", "inspected.test", "meta.test")
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(rw, "hello from %s via %s %s\n", r.Host, r.Method, r.URL.Path)
	})
	mux.HandleFunc("/slow", func(rw http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond) // the client stays connected meanwhile
		fmt.Fprintln(rw, "slow hello")
	})
	mux.HandleFunc("/big", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Length", fmt.Sprint(bigSize))
		writeZeros(rw, bigSize)
	})
	tlsLn := listenTCP(t, netip.AddrPortFrom(w.serverIP, 0))
	w.tlsPort = tlsLn.Addr().(*net.TCPAddr).Port
	tlsSrv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}}}
	go tlsSrv.ServeTLS(tlsLn, "", "")
	httpLn := listenTCP(t, netip.AddrPortFrom(w.serverIP, 0))
	w.httpPort = httpLn.Addr().(*net.TCPAddr).Port
	httpSrv := &http.Server{Handler: mux}
	go httpSrv.Serve(httpLn)
	t.Cleanup(func() { tlsSrv.Close(); httpSrv.Close() })
	// The trap listens on the HTTPS server's port, so a client told to
	// connect there by name could reach it only if the proxy used the
	// client's address.
	trap := listenTCP(t, netip.AddrPortFrom(w.trapIP, uint16(w.tlsPort)))
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			w.trapConns.Add(1)
			c.Close()
		}
	}()
	w.startUDPSink(t)
	w.startDNS(t)
	return w
}

// bigSize is the download of the throughput benchmark.
const bigSize = 256 << 20

func writeZeros(w io.Writer, n int64) {
	buf := make([]byte, 256<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// hostAddr is an IPv4 address of this machine's own interfaces other than
// loopback: a session's own loopback is its own, so only such an address
// is one a session could aim at and agentd could reach.
func hostAddr(t testing.TB) netip.Addr {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() && !ip.IsLoopback() {
				return ip.Unmap()
			}
		}
	}
	t.Skip("no IPv4 address but loopback for the trap")
	return netip.Addr{}
}

// randomLoopback is an address of 127.0.0.0/8 no other test is likely to
// use.
func randomLoopback() netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(1 + mrand.IntN(250)), byte(mrand.IntN(256)), byte(2 + mrand.IntN(250))})
}

func listenTCP(t testing.TB, at netip.AddrPort) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", at.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func (w *egressWorld) startUDPSink(t testing.TB) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	w.udpAddr = pc.LocalAddr().String()
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			w.udpGot.Add(1)
		}
	}()
}

// startDNS serves the test names: meta.test at the metadata address,
// every other name under .test at the servers' address.
func (w *egressWorld) startDNS(t testing.TB) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.dnsAddr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		w.mu.Lock()
		w.queries[name]++
		w.mu.Unlock()
		ip := w.serverIP
		if name == "meta.test" {
			ip = netip.MustParseAddr("169.254.169.254")
		}
		if q.Question[0].Qtype == dns.TypeA && strings.HasSuffix(name, ".test") {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: ip.AsSlice()})
		}
		rw.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
}

func (w *egressWorld) queriesFor(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queries[name]
}

func testCA(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func testLeaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, names ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// egressRun is one finished command with its output by stream.
type egressRun struct {
	id       string
	exitCode int
	stdout   string
	stderr   string
	records  []agentd.NetRecord
}

// runEgress runs command in a session with np and follows it to its end.
func runEgress(t *testing.T, c *agentd.Client, np *agentd.NetworkPolicy, command string) egressRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: command, NetworkPolicy: np, WaitMS: 30000})
	if err != nil {
		t.Fatalf("create %q: %v", command, err)
	}
	run := egressRun{id: resp.SessionID}
	collect := func(r *agentd.SessionResponse) error {
		for _, ch := range r.Chunks {
			switch ch.Stream {
			case agentd.StreamStdout:
				run.stdout += string(ch.Data)
			case agentd.StreamStderr:
				run.stderr += string(ch.Data)
			case agentd.StreamNet:
				recs, err := agentd.ParseNetRecords(ch.Data)
				if err != nil {
					t.Errorf("net records: %v", err)
				}
				run.records = append(run.records, recs...)
			}
		}
		return nil
	}
	collect(resp)
	final := resp
	if resp.State == agentd.StateRunning || resp.More {
		if final, err = c.Follow(ctx, resp.SessionID, resp.NextCursor, collect); err != nil {
			t.Fatalf("follow %q: %v", command, err)
		}
	}
	if final.ExitCode != nil {
		run.exitCode = *final.ExitCode
	}
	return run
}

// find returns the first connect record for name.
func (r egressRun) find(typ, name string) (agentd.NetRecord, bool) {
	for _, rec := range r.records {
		if rec.Type == typ && rec.Name == name {
			return rec, true
		}
	}
	return agentd.NetRecord{}, false
}
