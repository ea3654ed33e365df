package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	up "toron/upstream"
)

func TestCtxOfHeader(t *testing.T) {
	ctx := &fasthttp.RequestCtx{}
	if got := ctxOfHeader(&ctx.Request.Header); got != ctx {
		t.Fatalf("ctxOfHeader stepped to %p, want %p: fasthttp's RequestCtx layout changed", got, ctx)
	}
}

func TestProxyGETAndPOST(t *testing.T) {
	gw, _ := startProxied(t, "", "/api", nil)

	resp := rawRequest(t, gw.addr, "GET /api/users?id=7&x=%2F HTTP/1.1\r\nHost: example.test\r\nX-Custom: one\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("GET status %d body %q", resp.StatusCode, resp.body)
	}
	if got := resp.Header.Get("X-Echo-URI"); got != "/api/users?id=7&x=%2F" {
		t.Errorf("upstream saw URI %q", got)
	}
	// The query is forwarded byte for byte, odd ones included.
	// (An empty query, "/x?", reaches the upstream as "/x": fasthttp's client drops it.)
	for _, target := range []string{"/api/q??a=%41&&b", "/api/./n/../q?x=/../y"} {
		r := rawRequest(t, gw.addr, "GET "+target+" HTTP/1.1\r\nHost: a\r\n\r\n")
		_, q, _ := strings.Cut(target, "?")
		if got := r.Header.Get("X-Echo-URI"); !strings.HasSuffix(got, "?"+q) {
			t.Errorf("%s: upstream saw %q, want the query %q as sent", target, got, "?"+q)
		}
	}
	if got := resp.Header.Get("X-Echo-Host"); got != "example.test" {
		t.Errorf("upstream saw Host %q, want the client's", got)
	}
	if got := resp.Header.Get("X-Echo-H-X-Custom"); got != "one" {
		t.Errorf("custom header not forwarded: %q", got)
	}
	if resp.Header.Get("X-Request-Id") == "" || resp.Header.Get("X-Echo-H-X-Request-Id") != resp.Header.Get("X-Request-Id") {
		t.Errorf("request id: client got %q, upstream got %q", resp.Header.Get("X-Request-Id"), resp.Header.Get("X-Echo-H-X-Request-Id"))
	}

	body := strings.Repeat("toron", 1000)
	resp = rawRequest(t, gw.addr, fmt.Sprintf("POST /api/items HTTP/1.1\r\nHost: example.test\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nX-Request-Id: abc-123\r\n\r\n%s", len(body), body))
	if resp.StatusCode != 200 || string(resp.body) != body {
		t.Fatalf("POST status %d, body %d bytes (want %d)", resp.StatusCode, len(resp.body), len(body))
	}
	if got := resp.Header.Get("X-Echo-CL"); got != fmt.Sprint(len(body)) {
		t.Errorf("upstream saw Content-Length %s", got)
	}
	if got := resp.Header.Get("X-Echo-H-X-Request-Id"); got != "abc-123" {
		t.Errorf("client X-Request-Id not kept: %q", got)
	}
	if got := resp.Header.Get("X-Echo-H-Content-Type"); got != "text/plain" {
		t.Errorf("content type %q", got)
	}
}

func TestProxyLargeStreamedBody(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/up", up.addr, "max_body_bytes: 8MiB\nmax_concurrency: 2"))
	body := bytes.Repeat([]byte("0123456789abcdef"), 200_000) // 3.2 MB: streamed
	resp, err := http.Post("http://"+gw.addr+"/up/x", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Equal(got, body) {
		t.Fatalf("status %d, echoed %d bytes of %d", resp.StatusCode, len(got), len(body))
	}
}

// TestHopByHop: the hop-by-hop headers (RFC 9110 7.6.1: the fixed ones and those a Connection
// header names) are removed both ways, and end-to-end ones kept. Several Connection lines are
// one list (RFC 9110 5.3), so a header named on any of them is hop-by-hop.
func TestHopByHop(t *testing.T) {
	for _, c := range []struct {
		name     string
		headers  string      // the request's header lines
		response http.Header // the upstream's response headers
		// Request headers the upstream must not see, and those it must (echoed as X-Echo-H-*).
		reqGone  []string
		reqKept  map[string]string
		respGone []string
		respKept map[string]string
	}{
		{
			name:     "removed both ways",
			headers:  "Connection: keep-alive, X-Foo\r\nX-Foo: 1\r\nX-Bar: 2\r\nKeep-Alive: 300\r\nTE: trailers\r\nProxy-Connection: keep-alive\r\n",
			response: http.Header{"Connection": {"X-Secret"}, "X-Secret": {"hidden"}, "Keep-Alive": {"timeout=5"}, "Proxy-Connection": {"keep-alive"}, "X-Kept": {"yes"}},
			reqGone:  []string{"Keep-Alive", "X-Foo", "Te", "Proxy-Connection", "Upgrade"},
			reqKept:  map[string]string{"X-Bar": "2"},
			respGone: []string{"X-Secret", "Keep-Alive", "Proxy-Connection"},
			respKept: map[string]string{"X-Kept": "yes"},
		},
		{
			name:     "named on several Connection lines",
			headers:  "Connection: X-A\r\nConnection: keep-alive\r\nConnection: X-B, x-c\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\nX-D: 4\r\n",
			response: http.Header{"Connection": {"X-R1", "X-R2"}, "X-R1": {"1"}, "X-R2": {"2"}, "X-R3": {"3"}},
			reqGone:  []string{"X-A", "X-B", "X-C"},
			reqKept:  map[string]string{"X-D": "4"},
			respGone: []string{"X-R1", "X-R2"},
			respKept: map[string]string{"X-R3": "3"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := proxyOnce(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range c.response {
					w.Header()[k] = v
				}
				echoHandler(w, r)
			}, "GET /h HTTP/1.1\r\nHost: a\r\n"+c.headers+"\r\n")
			var seenGone []string
			seenKept := map[string]string{}
			for _, h := range c.reqGone {
				seenGone = append(seenGone, "X-Echo-H-"+h)
			}
			for h, v := range c.reqKept {
				seenKept["X-Echo-H-"+h] = v
			}
			checkHeaderSplit(t, resp.Header, "hop-by-hop request header", seenGone, seenKept)
			checkHeaderSplit(t, resp.Header, "hop-by-hop response header", c.respGone, c.respKept)
		})
	}
}

func TestXForwardedHeaders(t *testing.T) {
	gw, _ := startProxied(t, "", "/", nil)
	resp := rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n\r\n")
	if got := resp.Header.Get("X-Echo-H-X-Forwarded-For"); got != "203.0.113.9, 127.0.0.1" {
		t.Errorf("X-Forwarded-For %q", got)
	}
	if got := resp.Header.Get("X-Echo-H-X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto %q", got)
	}
	if got := resp.Header.Get("X-Echo-H-X-Forwarded-Host"); got != "shop.example" {
		t.Errorf("X-Forwarded-Host %q", got)
	}
	resp = rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-For: 198.51.100.2, 192.0.2.1\r\n\r\n")
	if got := resp.Header.Get("X-Echo-H-X-Forwarded-For"); got != "203.0.113.9, 198.51.100.2, 192.0.2.1, 127.0.0.1" {
		t.Errorf("X-Forwarded-For from several lines %q", got)
	}
	resp = rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n")
	if got := resp.Header.Get("X-Echo-H-X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For without a previous hop %q", got)
	}
}

func TestPathNormalizedAndForwarded(t *testing.T) {
	up := startUpstream(t, nil)
	other := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/legacy/reports", up.addr, "max_concurrency: 4")+upstreamRoute("/", other.addr, ""))
	resp := rawRequest(t, gw.addr, "GET /x/../legacy//reports/q?a=1 HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp.StatusCode != 200 || up.requests.Load() != 1 || other.requests.Load() != 0 {
		t.Fatalf("status %d, reports upstream %d, other %d", resp.StatusCode, up.requests.Load(), other.requests.Load())
	}
	if got := resp.Header.Get("X-Echo-URI"); got != "/legacy/reports/q?a=1" {
		t.Errorf("forwarded %q, want the normalized path", got)
	}
}

// staleUpstream answers each request on a connection and then closes that connection without
// announcing it, as an upstream whose keep-alive timeout is shorter than ours does.
func startStaleUpstream(t *testing.T) (addr string, served func() int) {
	t.Helper()
	return startOneShotUpstream(t, func() { time.Sleep(20 * time.Millisecond) })
}

// startOneShotUpstream answers the first request of each connection, keeps the connection open
// while hold runs, then closes it without announcing it. served counts the requests answered.
func startOneShotUpstream(t *testing.T, hold func()) (addr string, served func() int) {
	t.Helper()
	var n atomic.Int64
	addr = startScriptedUpstream(t, func(c net.Conn, _ *bufio.Reader) {
		buf := make([]byte, 4096)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(buf); err != nil {
			return
		}
		n.Add(1)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		hold()
	})
	return addr, func() int { return int(n.Load()) }
}

// TestStaleKeepAliveRetried: a reused keep-alive connection whose first write fails (nothing of
// the request reached the upstream) is replaced once by a new connection, and the request is
// answered, sent exactly once. The idle connection's write side is shut down under the pool,
// which the lend-time peek cannot see: only the retry rule of SPEC 3 step 9 saves the request.
func TestStaleKeepAliveRetried(t *testing.T) {
	var served atomic.Int64
	done := make(chan struct{})
	addr := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				// The gateway's half-close: keep the connection open, so that only the failed
				// write can tell the gateway.
				<-done
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			served.Add(1)
			answer(c, "ok")
		}
	})
	t.Cleanup(func() { close(done) })
	gw := startGateway(t, "", upstreamRoute("/", addr, ""))
	for i := 0; i < 3; i++ {
		if i > 0 {
			idle := up.PoolOf(gw.g.snap.Load().routes[0].set.Targets()[0]).Idle()
			if len(idle) != 1 {
				t.Fatalf("request %d: %d idle upstream connections, want 1", i, len(idle))
			}
			tc := idle[0].Conn.(*net.TCPConn)
			if err := tc.CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}
		resp := rawRequest(t, gw.addr, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
		if resp.StatusCode != 200 || string(resp.body) != "ok" {
			t.Fatalf("request %d: status %d %q", i, resp.StatusCode, resp.body)
		}
	}
	if served.Load() != 3 {
		t.Errorf("upstream served %d requests, want 3 (each once)", served.Load())
	}
}

// TestStaleConnCheckedBeforeBody: an idle connection the upstream closed is noticed when the
// route's pool lends it, so a POST goes out once, on a new connection, instead of failing.
func TestStaleConnCheckedBeforeBody(t *testing.T) {
	addr, served := startStaleUpstream(t)
	gw := startGateway(t, "", upstreamRoute("/", addr, ""))
	resp := rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("warm-up status %d", resp.StatusCode)
	}
	// The upstream's FIN has arrived: the gateway's end of the idle connection is in CLOSE_WAIT.
	// The pool finds it when it lends the connection (a non-blocking peek), before the body.
	up := portOf(t, addr)
	waitSocket(t, "the upstream's FIN", func(st, _, rp int, _ int64) bool { return st == tcpCloseWait && rp == up })
	resp = rawRequest(t, gw.addr, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
	if resp.StatusCode != 200 {
		t.Fatalf("POST after the upstream closed the idle connection: status %d %s", resp.StatusCode, resp.body)
	}
	if served() != 2 {
		t.Errorf("upstream served %d requests, want 2 (the GET and the POST, once each)", served())
	}
}

// TestNoRetryOnceBodyRead: when the upstream closes a connection after it was lent, while the
// body streams from the client, the request fails with a 502 and is not sent again (SPEC 3).
func TestNoRetryOnceBodyRead(t *testing.T) {
	closeNow := make(chan struct{})
	addr, served := startOneShotUpstream(t, func() {
		select {
		case <-closeNow:
		case <-time.After(5 * time.Second):
		}
	})
	gw := startGateway(t, "stream_threshold_bytes: 16\n", upstreamRoute("/", addr, ""))
	if resp := rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("warm-up status %d", resp.StatusCode)
	}
	c := dialRaw(t, gw.addr)
	// The connection is lent (and found open) once fasthttp's pre-read of the body's first
	// 8 KiB is done; the upstream closes it while the gateway, having forwarded the first 20 kB
	// of the body, waits for the rest. Each step waits for its event
	// in the kernel's socket table, not for a sleep: the gateway read all the client sent (its
	// receive queue for the client is empty), then the upstream's FIN reached the gateway's end.
	upPort, gwPort, cPort := portOf(t, addr), portOf(t, gw.addr), portOf(t, c.LocalAddr().String())
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
	c.Write(make([]byte, 20000))
	waitSocket(t, "the gateway reading the first 20 kB", func(st, lp, rp int, q int64) bool {
		return st == tcpEstablished && lp == gwPort && rp == cPort && q == 0
	})
	close(closeNow)
	// The upstream closed it: a FIN, or a reset for the body bytes it never read; either way the
	// gateway's end is no longer established.
	waitNoSocket(t, "the upstream's close", func(st, _, rp int, _ int64) bool { return st == tcpEstablished && rp == upPort })
	c.Write(make([]byte, 80000))
	resp := readRawResponse(t, c, "POST")
	if resp.StatusCode != 502 {
		t.Fatalf("POST whose connection closed under it: status %d, want 502 (no retry once the body was read)", resp.StatusCode)
	}
	if n := served(); n != 1 {
		t.Errorf("upstream served %d requests, want 1", n)
	}
}

func TestBadGatewayOnDialFailures(t *testing.T) {
	// A port nobody listens on: refused.
	refused := refusedAddr(t)
	// An upstream that accepts and closes at once: reset before headers.
	reset := startScriptedUpstream(t, func(c net.Conn, _ *bufio.Reader) { resetConn(c) })

	gw := startGateway(t, "",
		upstreamRoute("/refused", refused, "")+
			upstreamRoute("/reset", reset, "")+
			upstreamRoute("/slowdial", blackholeAddr(t), "connect_timeout: 200ms"))
	for _, tc := range []struct{ path, want string }{
		{"/refused", "502 Bad Gateway: upstream connection refused"},
		{"/reset", "502 Bad Gateway: upstream closed the connection before its response headers"},
		{"/slowdial", "502 Bad Gateway: upstream connect timeout"},
	} {
		resp := rawRequest(t, gw.addr, "GET "+tc.path+" HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 502 || string(resp.body) != `{"error":"`+tc.want+`"}` {
			t.Errorf("%s: status %d body %s", tc.path, resp.StatusCode, resp.body)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: content type %q", tc.path, ct)
		}
	}
}

func TestHeadAndNoContent(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/nc" {
			w.WriteHeader(204)
			return
		}
		w.Header().Set("Content-Length", "1234")
		w.Header().Set("Content-Type", "text/plain")
		if r.Method != "HEAD" {
			w.Write(make([]byte, 1234))
		}
	})
	gw := startGateway(t, "", upstreamRoute("/", up.addr, ""))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n")
	resp := readRawResponse(t, c, "HEAD")
	if resp.StatusCode != 200 || len(resp.body) != 0 {
		t.Fatalf("HEAD: %d, %d body bytes", resp.StatusCode, len(resp.body))
	}
	if resp.Header.Get("Content-Length") != "1234" {
		t.Errorf("HEAD Content-Length %q, want the upstream's", resp.Header.Get("Content-Length"))
	}
	// The same connection stays usable: the HEAD answer carried no body bytes.
	io.WriteString(c, "GET /nc HTTP/1.1\r\nHost: a\r\n\r\n")
	resp = readRawResponse(t, c, "GET")
	if resp.StatusCode != 204 || len(resp.body) != 0 {
		t.Fatalf("204: %d, %d body bytes", resp.StatusCode, len(resp.body))
	}
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
	resp = readRawResponse(t, c, "GET")
	if resp.StatusCode != 200 || len(resp.body) != 1234 {
		t.Fatalf("GET after HEAD: %d, %d body bytes", resp.StatusCode, len(resp.body))
	}
}

func TestOptionsAsteriskForwarded(t *testing.T) {
	gw, _ := startProxied(t, "", "/", nil)
	resp := rawRequest(t, gw.addr, "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n")
	// net/http answers "OPTIONS *" itself (200, no body) without calling the handler; had it
	// received "/*", the echo handler would have answered with X-Echo-URI.
	if resp.StatusCode != 200 || resp.Header.Get("X-Echo-URI") != "" || len(resp.body) != 0 {
		t.Fatalf("OPTIONS *: %d, echo %q: the upstream did not get the asterisk-form", resp.StatusCode, resp.Header.Get("X-Echo-URI"))
	}
}

// TestUpstreamClosingInsideItsHeaders: an upstream that closes after part of its response
// headers closed the connection before its response headers, as the README's table says, and
// is not "a response that could not be read".
func TestUpstreamClosingInsideItsHeaders(t *testing.T) {
	addr := startScriptedUpstream(t, func(c net.Conn, _ *bufio.Reader) {
		buf := make([]byte, 4096)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Read(buf)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le")
	})
	gw := startGateway(t, "", upstreamRoute("/", addr, ""))
	resp := rawRequest(t, gw.addr, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
	want := `{"error":"502 Bad Gateway: upstream closed the connection before its response headers"}`
	if resp.StatusCode != 502 || string(resp.body) != want {
		t.Errorf("status %d body %s, want 502 %s", resp.StatusCode, resp.body, want)
	}
}
