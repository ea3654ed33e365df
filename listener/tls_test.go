package listener

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"

	"github.com/VictoriaMetrics/metrics"
)

// tlsEchoServer serves a TLS listener the way the gateway does: each connection on its own
// goroutine, whose first Read runs the handshake. Every line read is answered with the line.
type tlsEchoServer struct {
	ln   *TLS
	addr string
	errs chan error // the first error of each connection's goroutine
}

func startTLSEcho(t *testing.T, o TLSOptions, set *metrics.Set) *tlsEchoServer {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := NewTLS(raw, o, set)
	if err != nil {
		t.Fatal(err)
	}
	s := &tlsEchoServer{ln: ln, addr: raw.Addr().String(), errs: make(chan error, 100)}
	testnet.Serve(t, ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.errs <- err
				}
				return
			}
			if _, err := io.WriteString(c, line); err != nil {
				return
			}
		}
	})
	return s
}

// roundTrip dials with cfg, sends one line and returns the cert the server presented.
func roundTrip(t *testing.T, addr string, cfg *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return nil, err
	}
	if line != "hello\n" {
		t.Errorf("echo: got %q", line)
	}
	return c.ConnectionState().PeerCertificates[0], nil
}

func newStore(t *testing.T, certs ...Cert) *CertStore {
	t.Helper()
	s, err := NewCertStore(certs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTLSSNIOverTheWire(t *testing.T) {
	ca := testnet.NewCA(t)
	day := time.Now().Add(24 * time.Hour)
	store := newStore(t,
		Cert{Name: "first.pem", Certificate: ca.Issue(t, "first", []string{"first.test"}, day)},
		Cert{Name: "wild.pem", Certificate: ca.Issue(t, "wild", []string{"*.example.com"}, day)},
		Cert{Name: "exact.pem", Certificate: ca.Issue(t, "exact", []string{"api.example.com"}, day)},
	)
	s := startTLSEcho(t, TLSOptions{Certs: store, HandshakeTimeout: 5 * time.Second}, nil)
	for _, tc := range []struct{ sni, want string }{
		{"api.example.com", "exact"},
		{"www.example.com", "wild"},
		{"deep.www.example.com", "first"},
		{"", "first"},
	} {
		cfg := &tls.Config{ServerName: tc.sni, RootCAs: ca.Pool, InsecureSkipVerify: tc.sni == "" || tc.want == "first" && tc.sni != "first.test"}
		cert, err := roundTrip(t, s.addr, cfg)
		if err != nil {
			t.Fatalf("SNI %q: %v", tc.sni, err)
		}
		if cert.Subject.CommonName != tc.want {
			t.Errorf("SNI %q: got %q, want %q", tc.sni, cert.Subject.CommonName, tc.want)
		}
	}
}

func TestTLSVersionsAndALPN(t *testing.T) {
	ca := testnet.NewCA(t)
	store := newStore(t, Cert{Name: "c.pem", Certificate: ca.Issue(t, "c", []string{"c.test"}, time.Now().Add(time.Hour))})
	set := metrics.NewSet()
	s12 := startTLSEcho(t, TLSOptions{Certs: store, HandshakeTimeout: 5 * time.Second}, set)
	s13 := startTLSEcho(t, TLSOptions{Certs: store, MinVersion: tls.VersionTLS13, HandshakeTimeout: 5 * time.Second}, metrics.NewSet())
	base := tls.Config{ServerName: "c.test", RootCAs: ca.Pool}

	// TLS 1.1 is refused by default.
	c11 := base.Clone()
	c11.MinVersion, c11.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if _, err := roundTrip(t, s12.addr, c11); err == nil {
		t.Error("TLS 1.1 accepted")
	}
	// TLS 1.2 and 1.3 are accepted by default.
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		c := base.Clone()
		c.MinVersion, c.MaxVersion = v, v
		if _, err := roundTrip(t, s12.addr, c); err != nil {
			t.Errorf("version %x refused: %v", v, err)
		}
	}
	// 1.3-only refuses 1.2.
	c12 := base.Clone()
	c12.MaxVersion = tls.VersionTLS12
	if _, err := roundTrip(t, s13.addr, c12); err == nil {
		t.Error("TLS 1.2 accepted by a 1.3-only listener")
	}
	if _, err := roundTrip(t, s13.addr, base.Clone()); err != nil {
		t.Errorf("TLS 1.3 refused by a 1.3-only listener: %v", err)
	}

	// ALPN: http/1.1 is chosen over h2.
	ca2 := base.Clone()
	ca2.NextProtos = []string{"h2", "http/1.1"}
	conn, err := tls.Dial("tcp", s12.addr, ca2)
	if err != nil {
		t.Fatal(err)
	}
	if p := conn.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Errorf("ALPN: got %q, want http/1.1", p)
	}
	conn.Close()

	testnet.Eventually(t, "the TLS 1.1 attempt counted", func() bool { return s12.ln.HandshakeErrors() >= 1 })
	if !strings.Contains(metricsText(set), "toron_tls_handshake_errors_total ") {
		t.Errorf("no handshake error metric:\n%s", metricsText(set))
	}
}

// A client that connects and sends nothing, or drips its ClientHello, is closed at the
// handshake timeout, while other clients are served meanwhile: the handshake never blocks
// Accept.
func TestTLSHandshakeTimeout(t *testing.T) {
	ca := testnet.NewCA(t)
	store := newStore(t, Cert{Name: "c.pem", Certificate: ca.Issue(t, "c", []string{"c.test"}, time.Now().Add(time.Hour))})
	const timeout = 1500 * time.Millisecond
	s := startTLSEcho(t, TLSOptions{Certs: store, HandshakeTimeout: timeout}, nil)

	silent, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	drip, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer drip.Close()
	start := time.Now()
	dripDone := make(chan struct{})
	go func() {
		defer close(dripDone)
		// A ClientHello record header, one byte every 200ms, never complete.
		for _, b := range []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} {
			if _, err := drip.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()

	// Real clients are served while both wait.
	for i := 0; i < 3; i++ {
		if _, err := roundTrip(t, s.addr, &tls.Config{ServerName: "c.test", RootCAs: ca.Pool}); err != nil {
			t.Fatalf("client %d during the silent handshakes: %v", i, err)
		}
	}
	for name, c := range map[string]net.Conn{"silent": silent, "dripping": drip} {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := io.ReadAll(c)
		elapsed := time.Since(start)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s client: the server never closed it", name)
		}
		if elapsed < timeout-100*time.Millisecond || elapsed > timeout+5*time.Second {
			t.Errorf("%s client closed after %v, want about %v", name, elapsed, timeout)
		}
	}
	<-dripDone
	testnet.Eventually(t, "two handshake errors", func() bool { return s.ln.HandshakeErrors() == 2 })
}

// Deadlines the layer above sets right after the accept apply once the handshake finished,
// shifted by the time it took.
func TestTLSDeadlinesAfterHandshake(t *testing.T) {
	ca := testnet.NewCA(t)
	store := newStore(t, Cert{Name: "c.pem", Certificate: ca.Issue(t, "c", []string{"c.test"}, time.Now().Add(time.Hour))})
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := NewTLS(raw, TLSOptions{Certs: store, HandshakeTimeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	res := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- err
			return
		}
		defer c.Close()
		// The upper layer's deadline, 1s after the accept; the handshake comes 1.5s later.
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 10)
		_, err = c.Read(buf) // handshake, then waits for data that never comes
		res <- err
	}()
	conn, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	start := time.Now()
	tc := tls.Client(conn, &tls.Config{ServerName: "c.test", RootCAs: ca.Pool})
	defer tc.Close()
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake after 1.5s failed: the upper layer's 1s deadline cut it: %v", err)
	}
	err = <-res
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read: got %v, want a timeout", err)
	}
	if d := time.Since(start); d < 500*time.Millisecond || d > 5*time.Second {
		t.Errorf("the read deadline passed %v after the handshake, want about 1s", d)
	}
}

func TestTLSReloadSwapsCertificates(t *testing.T) {
	ca := testnet.NewCA(t)
	day := time.Now().Add(time.Hour)
	store := newStore(t, Cert{Name: "c.pem", Certificate: ca.Issue(t, "old", []string{"c.test"}, day)})
	s := startTLSEcho(t, TLSOptions{Certs: store, HandshakeTimeout: 5 * time.Second}, nil)
	cfg := &tls.Config{ServerName: "c.test", RootCAs: ca.Pool}

	open, err := tls.Dial("tcp", s.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := store.Swap([]Cert{{Name: "c.pem", Certificate: ca.Issue(t, "new", []string{"c.test"}, day)}}); err != nil {
		t.Fatal(err)
	}
	cert, err := roundTrip(t, s.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "new" {
		t.Errorf("new connection after the swap got %q", cert.Subject.CommonName)
	}
	// The connection opened before the swap keeps working, with its certificate.
	_ = open.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(open, "still\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(open).ReadString('\n'); err != nil || line != "still\n" {
		t.Fatalf("open connection after the swap: %q, %v", line, err)
	}
	if cn := open.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "old" {
		t.Errorf("open connection's cert: %q", cn)
	}

	// Update to 1.3-only applies to new connections.
	if err := s.ln.Update(TLSOptions{Certs: store, MinVersion: tls.VersionTLS13, HandshakeTimeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c12 := cfg.Clone()
	c12.MaxVersion = tls.VersionTLS12
	if _, err := roundTrip(t, s.addr, c12); err == nil {
		t.Error("TLS 1.2 accepted after the update to 1.3-only")
	}
}

func TestTLSMutual(t *testing.T) {
	ca := testnet.NewCA(t)
	clientCA := testnet.NewCA(t)
	day := time.Now().Add(time.Hour)
	store := newStore(t, Cert{Name: "c.pem", Certificate: ca.Issue(t, "c", []string{"c.test"}, day)})
	s := startTLSEcho(t, TLSOptions{Certs: store, ClientCAs: clientCA.Pool, HandshakeTimeout: 5 * time.Second}, nil)

	good := clientCA.Issue(t, "client", nil, day)
	if _, err := roundTrip(t, s.addr, &tls.Config{ServerName: "c.test", RootCAs: ca.Pool, Certificates: []tls.Certificate{good}}); err != nil {
		t.Errorf("client signed by client_ca refused: %v", err)
	}
	for name, certs := range map[string][]tls.Certificate{
		"no client certificate":     nil,
		"certificate of another CA": {ca.Issue(t, "stranger", nil, day)},
	} {
		if _, err := roundTrip(t, s.addr, &tls.Config{ServerName: "c.test", RootCAs: ca.Pool, Certificates: certs}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestTLSPlainHTTPGets400(t *testing.T) {
	ca := testnet.NewCA(t)
	store := newStore(t, Cert{Name: "c.pem", Certificate: ca.Issue(t, "c", []string{"c.test"}, time.Now().Add(time.Hour))})
	s := startTLSEcho(t, TLSOptions{Certs: store, HandshakeTimeout: 5 * time.Second}, nil)
	// A TCP health check (connect, close) is not a failed handshake.
	probe, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	probe.Close()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 400 Bad Request\r\n") || !strings.Contains(string(b), "use https://") {
		t.Errorf("plain HTTP on the TLS port: got %q", b)
	}
	testnet.Eventually(t, "the plain HTTP request counted", func() bool { return s.ln.HandshakeErrors() >= 1 })
	time.Sleep(200 * time.Millisecond)
	if n := s.ln.HandshakeErrors(); n != 1 {
		t.Errorf("handshake errors %d, want 1 (the plain request; not the TCP health check)", n)
	}
}
