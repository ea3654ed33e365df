package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"toron/conf"
	"toron/internal/testnet"
	"toron/socket"
)

// testGateway is a gateway on 127.0.0.1:0 with its configuration.
type testGateway struct {
	g    *Gateway
	addr string
	done chan error
}

// startGateway loads serverYAML (the body of the server key, may be "") and routesYAML (the
// list under routes) and serves on a loopback port until the test ends.
func startGateway(t *testing.T, serverYAML, routesYAML string) *testGateway {
	return startGatewayB(t, serverYAML, routesYAML, false)
}

// startGatewayB is startGateway for tests and benchmarks; accessLog writes JSON access lines as
// the binary does (LogSink.JSONCore) to a file, so their cost is measured.
func startGatewayB(t testing.TB, serverYAML, routesYAML string, accessLog bool) *testGateway {
	t.Helper()
	cfg := loadConfig(t, serverYAML, routesYAML)
	var log *zap.Logger
	if accessLog {
		cfg.Log.Access = true
		// As the binary logs: JSON lines through the buffered sink, into a file (its stderr
		// redirected).
		f, err := os.Create(filepath.Join(t.TempDir(), "access.log"))
		if err != nil {
			t.Fatal(err)
		}
		sink := NewLogSink(f, LogBufferBytes, LogFlushInterval)
		t.Cleanup(func() { _ = sink.Close(); _ = f.Close() })
		log = zap.New(sink.JSONCore(zap.InfoLevel))
	}
	g, err := New(cfg, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	tg := &testGateway{g: g, done: make(chan error, 1)}
	tg.addr = serveGatewayDone(t, g, tg.done)
	return tg
}

// serveGateway serves g on a loopback port until the test ends (shutdown, then the idle
// upstream connections closed) and returns its address.
func serveGateway(t testing.TB, g *Gateway) string {
	t.Helper()
	return serveGatewayDone(t, g, make(chan error, 1))
}

// serveGatewayDone is serveGateway sending what Serve returns to done (buffered), which the
// cleanup receives from.
func serveGatewayDone(t testing.TB, g *Gateway, done chan error) string {
	t.Helper()
	ln := testnet.Listen(t)
	go func() { done <- g.Serve(ln) }()
	testnet.ShutdownAtEnd(t, func(ctx context.Context) error {
		err := g.Shutdown(ctx)
		<-done
		closeIdleUpstreams(g)
		return err
	})
	return ln.Addr().String()
}

// closeIdleUpstreams closes the idle upstream connections of every route, so goleak sees no
// cleaner goroutines left behind by a test.
func closeIdleUpstreams(g *Gateway) {
	for _, r := range g.snap.Load().routes {
		r.closeIdle()
	}
}

func loadConfig(t testing.TB, serverYAML, routesYAML string) *conf.Config {
	t.Helper()
	cy := "server:\n  host: 127.0.0.1\n" + indent(serverYAML, "  ") + "log:\n  access: false\n"
	ry := "routes:\n" + indent(routesYAML, "")
	cfg, err := conf.LoadBytes("config.yaml", []byte(cy), "routes.yaml", []byte(ry), nil)
	if err != nil {
		t.Fatalf("config: %v\n--- config\n%s--- routes\n%s", err, cy, ry)
	}
	return cfg
}

func indent(s, prefix string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(prefix + line + "\n")
	}
	return b.String()
}

// upstream is a real HTTP server on loopback that records what reached it.
type upstream struct {
	addr     string
	srv      *http.Server
	requests atomic.Int64
	conns    atomic.Int64 // opened
	closed   atomic.Int64 // connections closed
	inflight atomic.Int64
	maxSeen  atomic.Int64

	mu   sync.Mutex
	last *http.Request
	body []byte
}

// startUpstream serves h (nil: echo) with net/http, which is independent of the gateway's
// fasthttp and so a fair witness of what was forwarded.
func startUpstream(t testing.TB, h http.HandlerFunc) *upstream {
	t.Helper()
	ln := testnet.Listen(t)
	u := &upstream{addr: ln.Addr().String()}
	if h == nil {
		h = echoHandler
	}
	u.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.requests.Add(1)
			n := u.inflight.Add(1)
			defer u.inflight.Add(-1)
			for {
				m := u.maxSeen.Load()
				if n <= m || u.maxSeen.CompareAndSwap(m, n) {
					break
				}
			}
			u.mu.Lock()
			u.last = r
			u.mu.Unlock()
			h(w, r)
		}),
		ConnState: func(c net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				u.conns.Add(1)
			case http.StateClosed:
				u.closed.Add(1)
			}
		},
	}
	go func() { _ = u.srv.Serve(ln) }()
	testnet.ShutdownAtEnd(t, func(ctx context.Context) error {
		_ = u.srv.Shutdown(ctx)
		return u.srv.Close()
	})
	return u
}

// awaitInflight waits up to 10 s until n requests at least are in u's handler.
func (u *upstream) awaitInflight(n int64) {
	testnet.WaitUntil(10*time.Second, func() bool { return u.inflight.Load() >= n })
}

// holdingUpstream starts an upstream that answers body to each request, after holding the
// requests whose path held reports until the returned open is called or their client is gone.
// open may be called more than once; it is called when the test ends, before the upstream stops.
func holdingUpstream(t *testing.T, held func(path string) bool, body string) (*upstream, func()) {
	t.Helper()
	release, open := newGate()
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if held(r.URL.Path) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, body)
	})
	t.Cleanup(open)
	return up, open
}

func (u *upstream) lastRequest() *http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}

// echoHandler answers with what it received: method, path, headers as X-Echo-* and the body.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Echo-Method", r.Method)
	w.Header().Set("X-Echo-Path", r.URL.RawPath+"|"+r.URL.Path)
	w.Header().Set("X-Echo-URI", r.RequestURI)
	w.Header().Set("X-Echo-Host", r.Host)
	w.Header().Set("X-Echo-Body-Len", fmt.Sprint(len(body)))
	w.Header().Set("X-Echo-CL", fmt.Sprint(r.ContentLength))
	w.Header().Set("X-Echo-TE", strings.Join(r.TransferEncoding, ","))
	for k, v := range r.Header {
		w.Header().Set("X-Echo-H-"+k, strings.Join(v, ","))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(body)
}

// rawResponse is what a raw client read back.
type rawResponse struct {
	*http.Response
	body   []byte
	closed bool // the gateway closed the connection after the response
}

// dialRaw opens a raw TCP connection to addr, closed when the test ends.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	return testnet.Dial(t, addr)
}

// refusedAddr is a loopback address where nothing listens.
func refusedAddr(t *testing.T) string { return testnet.RefusedAddr(t) }

// metricsText is the gateway's metrics as /metrics would serve them.
func metricsText(g *Gateway) string {
	var b bytes.Buffer
	g.Metrics().WritePrometheus(&b)
	return b.String()
}

// metricLine returns the value of one metric line of the gateway's set ("" when absent).
func metricLine(g *Gateway, name string) string {
	for line := range strings.SplitSeq(metricsText(g), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// headersOnly sends the headers of a POST to path declaring a body of length bytes (with
// Expect: 100-continue when expect is set) on a fresh connection, and no byte of the body; it
// returns the answer and how long it took to come.
func headersOnly(t *testing.T, addr, path string, length int64, expect bool) (rawResponse, time.Duration) {
	t.Helper()
	c := dialRaw(t, addr)
	req := "POST " + path + " HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.FormatInt(length, 10) + "\r\n"
	if expect {
		req += "Expect: 100-continue\r\n"
	}
	start := time.Now()
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp := readRawResponse(t, c, "POST")
	return resp, time.Since(start)
}

// rawRequest writes exact bytes on a fresh connection and reads one response.
func rawRequest(t *testing.T, addr, req string) rawResponse {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return readRawResponse(t, c, "GET")
}

func readRawResponse(t *testing.T, c net.Conn, method string) rawResponse {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	rr := rawResponse{Response: resp, body: body}
	if resp.Close {
		// Connection: close was announced: the gateway must also really close.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var one [1]byte
		_, err = br.Read(one[:])
		rr.closed = err != nil && !socket.IsTimeout(err)
	}
	return rr
}

// startProxied starts an upstream serving h (nil: echo) and a gateway with serverYAML whose
// one route sends prefix to it.
func startProxied(t *testing.T, serverYAML, prefix string, h http.HandlerFunc) (*testGateway, *upstream) {
	t.Helper()
	up := startUpstream(t, h)
	return startGateway(t, serverYAML, upstreamRoute(prefix, up.addr, "")), up
}

// newGate returns a channel for handlers to wait on and the function that opens it (closes the
// channel), which may be called more than once.
func newGate() (<-chan struct{}, func()) {
	c := make(chan struct{})
	return c, sync.OnceFunc(func() { close(c) })
}

// proxyOnce starts an upstream serving h (nil: echo) behind a gateway that routes / to it,
// sends the raw request req and fails the test unless the answer is 200.
func proxyOnce(t *testing.T, h http.HandlerFunc, req string) rawResponse {
	t.Helper()
	gw, _ := startProxied(t, "", "/", h)
	resp := rawRequest(t, gw.addr, req)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %q", resp.StatusCode, resp.body)
	}
	return resp
}

// checkHeaderSplit fails for each header of gone that h has, and for each of kept that h lost
// or changed; what names the headers in the messages.
func checkHeaderSplit(t *testing.T, h http.Header, what string, gone []string, kept map[string]string) {
	t.Helper()
	for _, name := range gone {
		if v := h.Get(name); v != "" {
			t.Errorf("%s forwarded: %s=%q", what, name, v)
		}
	}
	for name, want := range kept {
		if v := h.Get(name); v != want {
			t.Errorf("%s: end-to-end %s=%q, want %q", what, name, v, want)
		}
	}
}

// upstreamRoute is a minimal routes.yaml entry pointing at addr.
func upstreamRoute(prefix, addr, extra string) string {
	return fmt.Sprintf("- type: upstream\n  prefix: %s\n  target: http://%s\n%s", prefix, addr, indent(extra, "  "))
}

// httpsRoute is upstreamRoute for an https:// target.
func httpsRoute(prefix, addr, extra string) string {
	return fmt.Sprintf("- type: upstream\n  prefix: %s\n  target: https://%s\n%s", prefix, addr, indent(extra, "  "))
}

// startLoggedGateway is startGateway with the access log on, recorded: the lines it writes
// are in the returned logs (accessLines waits for them).
func startLoggedGateway(t *testing.T, serverYAML, routesYAML string) (string, *observer.ObservedLogs) {
	t.Helper()
	cfg := loadConfig(t, serverYAML, routesYAML)
	cfg.Log.Access = true
	core, logs := observer.New(zap.InfoLevel)
	g, err := New(cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	return serveGateway(t, g), logs
}

// accessLinesOf starts an echo upstream behind a gateway with serverYAML and the access log on,
// routing /api to it with the route keys extra; it sends each of reqs on a connection of its
// own and returns the n access lines they made (accessLines) and the upstream.
func accessLinesOf(t *testing.T, serverYAML, extra string, n int, reqs ...string) ([]observer.LoggedEntry, *upstream) {
	t.Helper()
	up := startUpstream(t, nil)
	addr, logs := startLoggedGateway(t, serverYAML, upstreamRoute("/api", up.addr, extra))
	for _, req := range reqs {
		rawRequest(t, addr, req)
	}
	return accessLines(t, logs, n), up
}

// accessLines waits up to 5 s for n access lines and returns them; a count other than n fails
// the test.
func accessLines(t *testing.T, logs *observer.ObservedLogs, n int) []observer.LoggedEntry {
	t.Helper()
	testnet.WaitUntil(5*time.Second, func() bool { return logs.FilterMessage(AccessLogMessage).Len() >= n })
	entries := logs.FilterMessage(AccessLogMessage).All()
	if len(entries) != n {
		t.Fatalf("%d access lines, want %d", len(entries), n)
	}
	return entries
}

// startScriptedUpstream serves every connection with serve until the test ends.
func startScriptedUpstream(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	return serveScripted(t, testnet.Listen(t), serve)
}

// serveScripted serves every connection of ln (plain or TLS) with serve until the test ends.
func serveScripted(t *testing.T, ln net.Listener, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	testnet.Serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		serve(c, bufio.NewReader(c))
	})
	return ln.Addr().String()
}

// serveTLSScripted is serveScripted over TLS, with a certificate from pki for name.
func serveTLSScripted(t *testing.T, pki *testnet.CA, name string, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	cert, _, _ := pki.IssueFiles(t, name, name)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	return serveScripted(t, ln, serve)
}

// answer writes a complete response with body.
func answer(c io.Writer, body string) {
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// resetConn closes c with SO_LINGER 0: the peer sees a reset, not an orderly end.
func resetConn(c net.Conn) {
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
}

// getStatus sends one GET with a fresh connection and returns status and body.
func getStatus(addr, path string) (int, string, http.Header, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, nil
}
