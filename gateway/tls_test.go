package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"toron/conf"
	"toron/internal/testnet"
	"toron/socket"
	up "toron/upstream"
)

// tlsServerYAML is the tls block of the server key for the given pairs (cert, key, ...).
func tlsServerYAML(extra string, files ...string) string {
	var b strings.Builder
	b.WriteString("tls:\n  certs:\n")
	for i := 0; i+1 < len(files); i += 2 {
		fmt.Fprintf(&b, "    - {cert_file: %q, key_file: %q}\n", files[i], files[i+1])
	}
	b.WriteString(indent(extra, "  "))
	return b.String()
}

// httpsClient trusts pool and names the server serverName; one connection per request unless
// keepAlive.
func httpsClient(pool *x509.CertPool, serverName string, keepAlive bool, certs ...tls.Certificate) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			// h2 offered too, as browsers and curl do: the gateway must pick http/1.1.
			TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: serverName, Certificates: certs, NextProtos: []string{"h2", "http/1.1"}},
			DisableKeepAlives: !keepAlive,
			ForceAttemptHTTP2: false,
		},
	}
}

func get(t *testing.T, c *http.Client, url string) (int, string, *http.Response) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

func TestTLSListenerForwardsHTTPS(t *testing.T) {
	pki := testnet.NewCA(t)
	_, c1, k1 := pki.IssueFiles(t, "gw", "gw.test")
	up := startUpstream(t, nil)
	gw := startGateway(t, tlsServerYAML("", c1, k1), upstreamRoute("/api", up.addr, ""))
	c := httpsClient(pki.Pool, "gw.test", true)
	defer c.CloseIdleConnections()

	code, _, resp := get(t, c, "https://"+gw.addr+"/api/x")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	if p := resp.Header.Get("X-Echo-H-X-Forwarded-Proto"); p != "https" {
		t.Errorf("X-Forwarded-Proto = %q, want https", p)
	}
	if resp.TLS == nil || resp.TLS.NegotiatedProtocol != "http/1.1" {
		t.Errorf("ALPN: %+v", resp.TLS)
	}
	if code, body, _ := get(t, c, "https://"+gw.addr+"/health"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/health over TLS: %d %s", code, body)
	}
	// A plain HTTP request to the TLS port is told to use https.
	rr := rawRequest(t, gw.addr, "GET /health HTTP/1.1\r\nHost: gw.test\r\n\r\n")
	if rr.StatusCode != 400 || !strings.Contains(string(rr.body), "https://") {
		t.Errorf("plain HTTP on the TLS port: %d %s", rr.StatusCode, rr.body)
	}
	if !strings.Contains(metricsOf(gw.g), `toron_tls_cert_expiry_timestamp_seconds{cert="`+c1+`"}`) {
		t.Errorf("no expiry gauge:\n%s", metricsOf(gw.g))
	}
}

func metricsOf(g *Gateway) string {
	var b strings.Builder
	g.Metrics().WritePrometheus(&b)
	return b.String()
}

// Silent TLS clients (connected, no ClientHello) hold no worker: with worker_pool_size 4 and
// 40 of them open, real clients are served, and the silent ones are closed at
// handshake_timeout.
func TestTLSSilentClientsHoldNoWorker(t *testing.T) {
	pki := testnet.NewCA(t)
	_, c1, k1 := pki.IssueFiles(t, "gw", "gw.test")
	up := startUpstream(t, nil)
	const timeout = 2 * time.Second
	gw := startGateway(t, "worker_pool_size: 4\n"+tlsServerYAML("handshake_timeout: 2s\n", c1, k1), upstreamRoute("/api", up.addr, ""))

	start := time.Now()
	silent := make([]net.Conn, 40)
	for i := range silent {
		silent[i] = dialRaw(t, gw.addr)
	}
	c := httpsClient(pki.Pool, "gw.test", false)
	for i := 0; i < 12; i++ {
		for _, path := range []string{"/api/x", "/health"} {
			if code, body, _ := get(t, c, "https://"+gw.addr+path); code != 200 {
				t.Fatalf("request %d %s during 40 silent handshakes: %d %s", i, path, code, body)
			}
		}
	}
	served := time.Since(start)
	var wg sync.WaitGroup
	closedAt := make([]time.Duration, len(silent))
	for i, s := range silent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, _ = io.ReadAll(s)
			closedAt[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, d := range closedAt {
		if d < timeout-200*time.Millisecond || d > timeout+8*time.Second {
			t.Errorf("silent client %d closed after %v, want about %v", i, d, timeout)
		}
	}
	t.Logf("24 requests served in %v while 40 handshakes were pending", served)
	if !strings.Contains(metricsOf(gw.g), "toron_tls_handshake_errors_total 40") {
		t.Errorf("handshake errors not counted:\n%s", metricsOf(gw.g))
	}
}

func TestTLSReloadCertificates(t *testing.T) {
	pki := testnet.NewCA(t)
	_, c1, k1 := pki.IssueFiles(t, "one", "gw.test")
	up := startUpstream(t, nil)
	routes := upstreamRoute("/api", up.addr, "")
	gw := startGateway(t, tlsServerYAML("", c1, k1), routes)
	url := "https://" + gw.addr + "/api/x"
	servedBy := func(c *http.Client) string {
		t.Helper()
		code, _, resp := get(t, c, url)
		if code != 200 {
			t.Fatalf("status %d", code)
		}
		return resp.TLS.PeerCertificates[0].Subject.CommonName
	}
	keep := httpsClient(pki.Pool, "gw.test", true)
	defer keep.CloseIdleConnections()
	if cn := servedBy(keep); cn != "one" {
		t.Fatalf("served by %q", cn)
	}

	// A new pair under the same file names, then a reload.
	_, c2, k2 := pki.IssueFiles(t, "two", "gw.test")
	for _, f := range [][2]string{{c2, c1}, {k2, k1}} {
		if err := os.Rename(f[0], f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := gw.g.Reload(loadConfig(t, tlsServerYAML("", c1, k1), routes)); err != nil {
		t.Fatal(err)
	}
	if cn := servedBy(httpsClient(pki.Pool, "gw.test", false)); cn != "two" {
		t.Errorf("new connection after the reload served by %q, want two", cn)
	}
	// The keep-alive connection opened before keeps working with its certificate.
	if cn := servedBy(keep); cn != "one" {
		t.Errorf("open connection after the reload: %q, want one", cn)
	}

	// A mismatched pair is refused at load; the reload counts as failed, the old pair serves.
	_, c3, _ := pki.IssueFiles(t, "three", "gw.test")
	if err := os.Rename(c3, c1); err != nil {
		t.Fatal(err)
	}
	cy := "server:\n  host: 127.0.0.1\n" + indent(tlsServerYAML("", c1, k1), "  ")
	_, err := conf.LoadBytes("config.yaml", []byte(cy), "routes.yaml", []byte("routes:\n"+routes), nil)
	if err == nil || !strings.Contains(err.Error(), "server.tls: certs[0]: cert_file "+c1+" and key_file "+k1+" do not load as a pair") {
		t.Fatalf("mismatched pair: err = %v", err)
	}
	gw.g.ReloadFailed()
	if cn := servedBy(httpsClient(pki.Pool, "gw.test", false)); cn != "two" {
		t.Errorf("after the refused reload served by %q, want two", cn)
	}
	if !strings.Contains(metricsOf(gw.g), "toron_config_reload_errors_total 1") {
		t.Errorf("refused reload not counted")
	}
	// TLS cannot be turned off by a reload.
	if err := gw.g.Reload(loadConfig(t, "", routes)); err == nil || !strings.Contains(err.Error(), "server.tls: cannot change on reload") {
		t.Errorf("TLS off on reload: err = %v", err)
	}
}

func TestTLSMutualClients(t *testing.T) {
	pki := testnet.NewCA(t)
	clients := testnet.NewCA(t)
	_, c1, k1 := pki.IssueFiles(t, "gw", "gw.test")
	gw := startGateway(t, tlsServerYAML("client_ca_file: "+clients.CAFile+"\n", c1, k1), "")
	good, _, _ := clients.IssueFiles(t, "client")
	if code, _, _ := get(t, httpsClient(pki.Pool, "gw.test", false, good), "https://"+gw.addr+"/health"); code != 200 {
		t.Errorf("client with a certificate of client_ca_file: %d", code)
	}
	stranger, _, _ := pki.IssueFiles(t, "stranger")
	for name, certs := range map[string][]tls.Certificate{"no certificate": nil, "another CA": {stranger}} {
		if resp, err := httpsClient(pki.Pool, "gw.test", false, certs...).Get("https://" + gw.addr + "/health"); err == nil {
			resp.Body.Close()
			t.Errorf("%s: accepted with %d", name, resp.StatusCode)
		}
	}
}

// startTLSUpstream serves h (nil: echo) over TLS with cert on loopback.
func startTLSUpstream(t *testing.T, cert tls.Certificate, h ...http.HandlerFunc) string {
	t.Helper()
	raw := testnet.Listen(t)
	handler := http.HandlerFunc(echoHandler)
	if len(h) > 0 {
		handler = h[0]
	}
	srv := &http.Server{Handler: handler, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(tls.NewListener(raw, &tls.Config{Certificates: []tls.Certificate{cert}})) }()
	testnet.ShutdownAtEnd(t, srv.Shutdown)
	return raw.Addr().String()
}

func TestUpstreamTLS(t *testing.T) {
	pki := testnet.NewCA(t)
	upCert, _, _ := pki.IssueFiles(t, "up", "up.test", "127.0.0.1")
	addr := startTLSUpstream(t, upCert)
	route := func(prefix, extra string) string { return httpsRoute(prefix, addr, extra) }
	routes := route("/ca", "tls_ca_file: "+pki.CAFile) +
		route("/named", "tls_ca_file: "+pki.CAFile+"\ntls_server_name: up.test") +
		route("/wrong", "tls_ca_file: "+pki.CAFile+"\ntls_server_name: other.test") +
		route("/system", "") +
		route("/insecure", "tls_insecure_skip_verify: true")
	cfg := loadConfig(t, "", routes)
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "(/insecure): tls_insecure_skip_verify") {
		t.Errorf("warnings: %q", cfg.Warnings)
	}
	gw := startGateway(t, "", routes)
	for _, tc := range []struct {
		path string
		code int
		body string
	}{
		{"/ca", 200, ""},       // private CA, name = the target's IP
		{"/named", 200, ""},    // private CA, tls_server_name
		{"/insecure", 200, ""}, // not verified
		{"/wrong", 502, `{"error":"502 Bad Gateway: upstream TLS handshake failed"}`},
		{"/system", 502, `{"error":"502 Bad Gateway: upstream TLS handshake failed"}`},
	} {
		rr := rawRequest(t, gw.addr, "GET "+tc.path+"/x HTTP/1.1\r\nHost: gw.test\r\n\r\n")
		if rr.StatusCode != tc.code || (tc.body != "" && string(rr.body) != tc.body) {
			t.Errorf("%s: %d %s, want %d %s", tc.path, rr.StatusCode, rr.body, tc.code, tc.body)
		}
		if tc.code == 200 && rr.Header.Get("X-Echo-H-X-Forwarded-Proto") != "http" {
			t.Errorf("%s: X-Forwarded-Proto %q on a plain listener", tc.path, rr.Header.Get("X-Echo-H-X-Forwarded-Proto"))
		}
	}
	// Keep-alive: a second request on the same route reuses the verified connection.
	for i := 0; i < 3; i++ {
		if rr := rawRequest(t, gw.addr, "GET /named/again HTTP/1.1\r\nHost: gw.test\r\n\r\n"); rr.StatusCode != 200 {
			t.Fatalf("reuse %d: %d %s", i, rr.StatusCode, rr.body)
		}
	}
}

// An upstream that accepts TCP and never answers the ClientHello is a 502 within
// connect_timeout, not a request stuck forever (fasthttp issue #2237).
func TestUpstreamTLSHandshakeTimeout(t *testing.T) {
	// The ClientHello is read and never answered; the connection stays open until the test ends.
	addr := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) { _, _ = io.Copy(io.Discard, br) })
	gw := startGateway(t, "", httpsRoute("/", addr, "connect_timeout: 1s\ntls_insecure_skip_verify: true"))
	start := time.Now()
	rr := rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: gw.test\r\n\r\n")
	if d := time.Since(start); rr.StatusCode != 502 || d < 900*time.Millisecond || d > 6*time.Second {
		t.Errorf("silent TLS upstream: %d %s after %v, want 502 after about 1s", rr.StatusCode, rr.body, d)
	}
	if !strings.Contains(string(rr.body), "TLS handshake failed") {
		t.Errorf("body %s", rr.body)
	}
}

// tlsBigGET starts a TLS gateway with write_timeout writeTimeout in front of bigHandler and
// sends GET /big for size bytes on a TLS connection whose socket receives into rcvbuf bytes; the
// connection is closed when the test ends.
func tlsBigGET(t *testing.T, writeTimeout string, rcvbuf, size int) (*testGateway, *tls.Conn) {
	t.Helper()
	pki := testnet.NewCA(t)
	_, c1, k1 := pki.IssueFiles(t, "gw", "gw.test")
	up := startUpstream(t, bigHandler)
	gw := startGateway(t, "write_timeout: "+writeTimeout+"\n"+tlsServerYAML("", c1, k1), upstreamRoute("/", up.addr, ""))
	raw := dialRaw(t, gw.addr)
	_ = raw.(*net.TCPConn).SetReadBuffer(rcvbuf)
	c := tls.Client(raw, &tls.Config{RootCAs: pki.Pool, ServerName: "gw.test"})
	fmt.Fprintf(c, "GET /big?size=%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", size)
	return gw, c
}

// TestTLSSlowReaderWithFullSendBufferCompletes is TestSlowReaderWithFullSendBufferCompletes over
// TLS: the sliding write window runs below the TLS layer (socket.Windowed), where a write blocked
// past its deadline can go on while the client acknowledges bytes; above it, crypto/tls would
// have to give up at the first timeout.
func TestTLSSlowReaderWithFullSendBufferCompletes(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	_, c := tlsBigGET(t, "500ms", 64<<10, size)
	// At most 16 KiB every 15 ms, about 1 MB/s: the kernel wakes a blocked write of the
	// gateway only after much more than a window's worth of that drained.
	buf := make([]byte, 16<<10)
	total := 0
	start := time.Now()
	for {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := c.Read(buf)
		total += n
		if err != nil {
			break
		}
		time.Sleep(15 * time.Millisecond)
	}
	// The head is a few hundred bytes: a cut body leaves far less than size.
	if total < size {
		t.Fatalf("a steady TLS reader (%.0f KB/s) was cut after %d of %d bytes",
			float64(total)/time.Since(start).Seconds()/1e3, total, size)
	}
}

// TestTLSStalledReaderCut: below TLS the window still cuts a client that stops reading.
func TestTLSStalledReaderCut(t *testing.T) {
	t.Parallel()
	gw, _ := tlsBigGET(t, "1s", 16<<10, 64<<20)
	start := time.Now()
	for connsOpen(gw.g) != 0 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("a TLS client that stopped reading still holds its connection after %v", time.Since(start))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m := metricsOf(gw.g); !strings.Contains(m, `reason="slow_client"} 1`) && !strings.Contains(m, `reason="client_abort"} 1`) {
		t.Logf("rejects: %s", m)
	}
}

func connsOpen(g *Gateway) int64 {
	if l := g.ln.Load(); l != nil {
		return l.open.Load()
	}
	return -1
}

// TestTLSSteadyUpstreamReaderBehindFullBufferNotCut is
// TestSteadyUpstreamReaderBehindFullBufferNotCut with an https:// upstream: the upstream side's
// write window runs below TLS too.
func TestTLSSteadyUpstreamReaderBehindFullBufferNotCut(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	pki := testnet.NewCA(t)
	upCert, _, _ := pki.IssueFiles(t, "up", "127.0.0.1")
	addr := startTLSUpstream(t, upCert, steadyReader(16<<10, 15*time.Millisecond)) // at most about 1 MB/s
	gw := startGateway(t, "", httpsRoute("/up", addr, "tls_ca_file: "+pki.CAFile+"\nmax_body_bytes: 64MiB\nwrite_timeout: 500ms\nread_timeout: 30s"))
	postWhole(t, "a steady TLS upstream reader", "http://"+gw.addr+"/up/x", size)
}

// TestTunnelOverUpstreamTLS: a WebSocket upgrade to an https:// target goes through the route's
// TLS settings (a private CA, tls_server_name), like any request: a 101 and an echo with the
// right name, the TLS 502 with a wrong one.
func TestTunnelOverUpstreamTLS(t *testing.T) {
	pki := testnet.NewCA(t)
	addr := serveTLSScripted(t, pki, "ws.test", func(c net.Conn, br *bufio.Reader) {
		if head, err := readHead(br); err == nil {
			wsEcho(c, br, head)
		}
	})
	route := func(prefix, name string) string {
		return httpsRoute(prefix, addr, "websocket: true\ntls_ca_file: "+pki.CAFile+"\ntls_server_name: "+name)
	}
	gw := startGateway(t, "", route("/ws", "ws.test")+route("/wrong", "other.test"))
	c, br := mustTunnel(t, gw.addr, upgradeRequest("/ws"))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo through the TLS tunnel: %q %v", b, err)
	}
	c.Close()
	_, br2, resp2 := openTunnel(t, gw.addr, upgradeRequest("/wrong"))
	body, _ := io.ReadAll(br2)
	if resp2.StatusCode != 502 || !strings.Contains(string(body), "TLS handshake") {
		t.Errorf("wrong server name: %d %s, want the TLS handshake 502", resp2.StatusCode, body)
	}
}

// TestTLSBytesPastResponseDoNotPoison: over TLS, bytes an upstream sends past its response in a
// record of their own can sit inside crypto/tls (read off the socket with the response's
// record), where neither the connection's reader nor the peek at the socket sees them. They
// must not become the next client's answer either.
func TestTLSBytesPastResponseDoNotPoison(t *testing.T) {
	pki := testnet.NewCA(t)
	addr := serveTLSScripted(t, pki, "up.test", func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.URL.Path == "/first" {
				// Two writes, two TLS records, sent back to back.
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nPWNED!")
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
		}
	})
	route := httpsRoute("/", addr, "tls_ca_file: "+pki.CAFile+"\ntls_server_name: up.test\nmax_upstream_conns: 1")
	gw := startGateway(t, "", route)
	for i := 0; i < 5; i++ {
		if resp := rawRequest(t, gw.addr, "GET /first HTTP/1.1\r\nHost: a\r\n\r\n"); string(resp.body) != "hello" {
			t.Fatalf("first: %d %q", resp.StatusCode, resp.body)
		}
		time.Sleep(15 * time.Millisecond)
		if resp := rawRequest(t, gw.addr, "GET /second HTTP/1.1\r\nHost: b\r\n\r\n"); resp.StatusCode != 200 || string(resp.body) != "second" {
			t.Fatalf("round %d: the next client got %d %q: the stray bytes", i, resp.StatusCode, resp.body)
		}
	}
}

// Both places a TLS layer is set up put it on a socket.Conn: the listener's accept
// (socket.Listener) and the upstream handshake (up.Handshake).
func TestTLSSocketsAreNonBlocking(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wl := socket.Listener{Listener: ln}
	dialed := make(chan net.Conn, 1)
	go func() {
		c, _ := net.Dial("tcp", ln.Addr().String())
		dialed <- c
	}()
	c, err := wl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if cc := <-dialed; cc != nil {
		defer cc.Close()
	}
	if ws, ok := c.(*socket.Windowed); !ok {
		t.Fatalf("accepted %T, want *socket.Windowed", c)
	} else if _, ok := ws.Conn.(*socket.Conn); !ok {
		t.Fatalf("the accepted socket below TLS is %T, want *socket.Conn", ws.Conn)
	}

	pki := testnet.NewCA(t)
	cert, _, _ := pki.IssueFiles(t, "upstream", "127.0.0.1")
	addr := startTLSUpstream(t, cert)
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := up.Handshake(raw, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"}, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	ws, ok := tc.(*tls.Conn).NetConn().(*socket.Windowed)
	if !ok {
		t.Fatalf("the upstream TLS layer is on %T, want *socket.Windowed", tc.(*tls.Conn).NetConn())
	}
	if _, ok := ws.Conn.(*socket.Conn); !ok {
		t.Fatalf("the upstream socket below TLS is %T, want *socket.Conn", ws.Conn)
	}
}
