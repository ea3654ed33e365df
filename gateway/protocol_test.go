package gateway

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"
)

// TestHigherHTTP1ProcessedAsHTTP11: HTTP/1.2 keeps the connection alive like HTTP/1.1 (SPEC 7),
// unless the client sends Connection: close.
func TestHigherHTTP1ProcessedAsHTTP11(t *testing.T) {
	gw, _ := startProxied(t, "", "/api", echoHandler)
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "GET /api/a HTTP/1.2\r\nHost: a\r\n\r\nGET /api/b HTTP/1.2\r\nHost: a\r\nConnection: close\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i, path := range []string{"/api/a", "/api/b"} {
		resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatalf("response %d: %v (HTTP/1.2 must keep the connection open)", i+1, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Echo-Path") != "|"+path {
			t.Errorf("response %d: %d for %q, want 200 for %s", i+1, resp.StatusCode, resp.Header.Get("X-Echo-Path"), path)
		}
		if wantClose := i == 1; resp.Close != wantClose {
			t.Errorf("response %d: Connection: close is %v, want %v", i+1, resp.Close, wantClose)
		}
	}
}

// TestHTTP10WithoutHost: an HTTP/1.0 request may omit Host; it is forwarded with the target as
// Host and no X-Forwarded-Host, instead of failing as a 502.
func TestHTTP10WithoutHost(t *testing.T) {
	gw, up := startProxied(t, "", "/api", echoHandler)
	r := rawRequest(t, gw.addr, "GET /api/x HTTP/1.0\r\n\r\n")
	if r.StatusCode != 200 {
		t.Fatalf("HTTP/1.0 without Host: %d %s", r.StatusCode, r.body)
	}
	if h := r.Header.Get("X-Echo-Host"); h != up.addr {
		t.Errorf("the upstream saw Host %q, want the target %q", h, up.addr)
	}
	if v := r.Header.Get("X-Echo-H-X-Forwarded-Host"); v != "" {
		t.Errorf("X-Forwarded-Host %q for a request without Host", v)
	}
}

// TestNoInventedContentType: a body without Content-Type reaches the upstream without one, in
// every way a body is forwarded (buffered, normalized chunked, streamed).
func TestNoInventedContentType(t *testing.T) {
	gw, up := startProxied(t, "stream_threshold_bytes: 16\n", "/api", echoHandler)
	for name, req := range map[string]string{
		"buffered":            "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
		"streamed":            "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 20\r\n\r\n01234567890123456789",
		"chunked, normalized": "POST /api HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	} {
		r := rawRequest(t, gw.addr, req)
		if r.StatusCode != 200 {
			t.Errorf("%s: %d", name, r.StatusCode)
		}
		if ct, ok := up.lastRequest().Header["Content-Type"]; ok {
			t.Errorf("%s: the upstream saw Content-Type %q, the client sent none", name, ct)
		}
	}
}

// TestEarlyClientAbortIs499: a client that leaves before the first bytes of its body arrived is
// a client that left (499, client_abort), not a malformed request.
func TestEarlyClientAbortIs499(t *testing.T) {
	gw, _ := startProxied(t, "", "/api", echoHandler)
	before := scrape(t, gw.addr)
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n0123456789")
	time.Sleep(100 * time.Millisecond)
	c.Close()
	waitIdle(t, gw.g)
	after := scrape(t, gw.addr)
	key499 := `toron_requests_total{route="/api",code="499"}`
	key400 := `toron_requests_total{route="/api",code="400"}`
	if after[key499]-before[key499] != 1 || after[key400] != before[key400] {
		t.Errorf("499: %v -> %v, 400: %v -> %v; want one more 499 and no 400", before[key499], after[key499], before[key400], after[key400])
	}
}

// TestHeaderLevelRejectHasRequestID: the header-level 400 carries a generated X-Request-Id,
// never the client's.
func TestHeaderLevelRejectHasRequestID(t *testing.T) {
	gw, _ := startProxied(t, "", "/api", echoHandler)
	// Obsolete line folding: fasthttp joins the lines, Toron's header check refuses them.
	r := rawRequest(t, gw.addr, "GET /api HTTP/1.1\r\nHost: a\r\nX-Request-Id: mine\r\nX-A: b\r\n c\r\n\r\n")
	if r.StatusCode != 400 {
		t.Fatalf("status %d", r.StatusCode)
	}
	if id := r.Header.Get("X-Request-Id"); id == "" || id == "mine" {
		t.Errorf("X-Request-Id %q, want a generated one", id)
	}
}

// TestHTTP10ClientGetsNoChunked: an HTTP/1.0 client cannot read chunked framing (RFC 9112 6.1),
// so a response of unknown length reaches it raw, ended by the close of the connection; one
// with a Content-Length keeps it, and an HTTP/1.1 client still gets chunked.
func TestHTTP10ClientGetsNoChunked(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/sized" {
			io.WriteString(w, "sized body")
			return
		}
		for _, part := range []string{"first part, ", "second part"} {
			io.WriteString(w, part)
			w.(http.Flusher).Flush() // unknown length: the upstream answers chunked
		}
	})
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, ""))
	raw := func(req string) string {
		c := dialRaw(t, gw.addr)
		io.WriteString(c, req)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("%q: %v after %q (the connection must close cleanly)", req, err, b)
		}
		return string(b)
	}
	got := raw("GET /api/stream HTTP/1.0\r\nHost: a\r\n\r\n")
	head, body, _ := strings.Cut(got, "\r\n\r\n")
	lower := strings.ToLower(head)
	if !strings.HasPrefix(head, "HTTP/1.1 200 ") || strings.Contains(lower, "transfer-encoding") || strings.Contains(lower, "content-length") ||
		!strings.Contains(lower, "connection: close") || !strings.Contains(lower, "x-request-id: ") {
		t.Errorf("HTTP/1.0, unknown length: header %q, want 200 with Connection: close, an X-Request-Id and no framing header", head)
	}
	if body != "first part, second part" {
		t.Errorf("HTTP/1.0, unknown length: body %q, want the upstream's bytes as they are", body)
	}

	// HTTP/1.0 with keep-alive asked: the body still ends with the connection.
	got = raw("GET /api/stream HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
	head, body, _ = strings.Cut(got, "\r\n\r\n")
	if body != "first part, second part" || !strings.Contains(strings.ToLower(head), "connection: close") {
		t.Errorf("HTTP/1.0 keep-alive, unknown length: %q, want Connection: close and the body", got)
	}

	got = raw("GET /api/sized HTTP/1.0\r\nHost: a\r\n\r\n")
	if !strings.Contains(strings.ToLower(got), "content-length: 10\r\n") || !strings.HasSuffix(got, "\r\n\r\nsized body") {
		t.Errorf("HTTP/1.0, known length: %q, want Content-Length: 10", got)
	}

	got = raw("GET /api/stream HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	if !strings.Contains(strings.ToLower(got), "transfer-encoding: chunked") {
		t.Errorf("HTTP/1.1, unknown length: %q, want chunked", got)
	}
}

// TestNoDefaultResponseContentType: a response without a Content-Type reaches the client without
// one; fasthttp's default (text/plain) is not invented, on a 204 least of all.
func TestNoDefaultResponseContentType(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil // no sniffing: the upstream sends none
		if r.URL.Path == "/api/empty" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		io.WriteString(w, "untyped")
	})
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, ""))
	for _, path := range []string{"/api/empty", "/api/body"} {
		resp := rawRequest(t, gw.addr, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n")
		if ct, ok := resp.Header["Content-Type"]; ok {
			t.Errorf("%s: Content-Type %q added", path, ct)
		}
	}
}

// TestAbsoluteFormNamesTheHost: with an absolute-form target the Host header is ignored and
// replaced by the target's authority, for routing and forwarding (RFC 9112 3.2.2); a target
// with an empty host or with userinfo is invalid.
func TestAbsoluteFormNamesTheHost(t *testing.T) {
	named := startUpstream(t, echoHandler)
	other := startUpstream(t, echoHandler)
	gw := startGateway(t, "", upstreamRoute("/h", named.addr, "host: example.com")+upstreamRoute("/h", other.addr, ""))
	for _, proto := range []string{"HTTP/1.1\r\nHost: other.test", "HTTP/1.0"} {
		resp := rawRequest(t, gw.addr, "GET http://Example.com:8080/h/x?q=1 "+proto+"\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d %q", proto, resp.StatusCode, resp.body)
		}
		if named.requests.Load() == 0 {
			t.Fatalf("%s: routed by the Host header, not by the target's authority", proto)
		}
		if h := resp.Header.Get("X-Echo-Host"); h != "Example.com:8080" {
			t.Errorf("%s: upstream Host %q, want the target's authority", proto, h)
		}
		if h := resp.Header.Get("X-Echo-H-X-Forwarded-Host"); h != "Example.com:8080" {
			t.Errorf("%s: X-Forwarded-Host %q, want the target's authority", proto, h)
		}
		if u := resp.Header.Get("X-Echo-URI"); u != "/h/x?q=1" {
			t.Errorf("%s: upstream request-target %q, want /h/x?q=1", proto, u)
		}
		named.requests.Store(0)
	}
	if n := other.requests.Load(); n != 0 {
		t.Errorf("the route without a host got %d requests", n)
	}
	for _, target := range []string{"http:///h/x", "http://user@example.com/h/x", "http://?q/h", "http://:8080/h/x", "http://[]/h/x"} {
		resp := rawRequest(t, gw.addr, "GET "+target+" HTTP/1.1\r\nHost: example.com\r\n\r\n")
		if resp.StatusCode != 400 {
			t.Errorf("%s: status %d, want 400", target, resp.StatusCode)
		}
	}
}

// TestShutdownWaitsForHTTP10Stream: a body streamed to an HTTP/1.0 client runs on a hijacked
// connection, which fasthttp no longer counts; shutdown still lets it finish.
func TestShutdownWaitsForHTTP10Stream(t *testing.T) {
	release, releaseUp := newGate()
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first, ")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "last")
	})
	t.Cleanup(releaseUp) // runs before the upstream's own cleanup, even after a Fatal
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, ""))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "GET /api/slow HTTP/1.0\r\nHost: a\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("status line %q, %v", line, err)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- gw.g.Shutdown(ctx)
	}()
	select {
	case err := <-shut:
		t.Fatalf("shutdown returned (%v) while a response was still streaming", err)
	case <-time.After(300 * time.Millisecond):
	}
	releaseUp()
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "\r\n\r\nfirst, last") {
		t.Errorf("after shutdown began the client read %q, %v; want the whole body", rest, err)
	}
	if err := <-shut; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestHTTP10StreamNeverStartedIs499: when the connection is gone before fasthttp starts the
// hijack of an HTTP/1.0 stream (a shutdown timeout closed it while the upstream was slow), the
// request is counted as a client that left, not as a 200 nobody received.
func TestHTTP10StreamNeverStartedIs499(t *testing.T) {
	release, releaseUp := newGate()
	arrived := make(chan struct{}, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "late")
		w.(http.Flusher).Flush()
	})
	t.Cleanup(releaseUp)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, ""))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "GET /api/slow HTTP/1.0\r\nHost: a\r\n\r\n")
	select {
	case <-arrived: // the request is with the upstream
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = gw.g.Shutdown(ctx) // times out and closes every client connection
	releaseUp()            // the upstream answers only now, to a client that is gone
	want := `toron_requests_total{route="/api",code="499"} 1`
	deadline := time.Now().Add(10 * time.Second)
	for {
		var b strings.Builder
		gw.g.Metrics().WritePrometheus(&b)
		if strings.Contains(b.String(), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack %s:\n%s", want, b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExpectNeverForwarded: Toron answers Expect: 100-continue itself (SPEC 3 step 7) and the
// upstream never sees the header, whatever its case; an upstream that did could answer before
// the body and then read the body as a request (issue 14).
func TestExpectNeverForwarded(t *testing.T) {
	gw, up := startProxied(t, "", "/", nil)
	for _, v := range []string{"100-continue", "100-Continue"} {
		c := dialRaw(t, gw.addr)
		if _, err := io.WriteString(c, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: "+v+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("Expect: %s: first line %q (%v), want 100 Continue", v, line, err)
		}
		if _, err := br.ReadString('\n'); err != nil { // the empty line ending the 100
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "hello"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Echo-Body-Len") != "5" {
			t.Errorf("Expect: %s: %d, body length %s upstream", v, resp.StatusCode, resp.Header.Get("X-Echo-Body-Len"))
		}
		if got := up.lastRequest().Header.Values("Expect"); len(got) > 0 {
			t.Errorf("Expect: %s reached the upstream as %q", v, got)
		}
	}
}

// TestExpectOtherIs417: an expectation other than 100-continue, the obfuscated "y 100-continue"
// included, is answered 417 with the gateway's JSON before any body byte (SPEC 7), and nothing
// reaches the upstream.
func TestExpectOtherIs417(t *testing.T) {
	gw, up := startProxied(t, "", "/", nil)
	for _, v := range []string{"y 100-continue", "100-continue, foo", "foo", "100-continued", "\"100-continue\""} {
		for _, body := range []bool{true, false} {
			req := "POST /x HTTP/1.1\r\nHost: a\r\nExpect: " + v + "\r\n"
			if body {
				// The headers only, of a body that never comes: the answer must not wait for it.
				req += "Content-Length: 1000000\r\n"
			}
			start := time.Now()
			resp := rawRequest(t, gw.addr, req+"\r\n")
			if resp.StatusCode != 417 || !strings.HasPrefix(string(resp.body), `{"error":"417 Expectation Failed: `) {
				t.Errorf("Expect: %s (body %v): %d %s, want 417 with the gateway's JSON", v, body, resp.StatusCode, resp.body)
			}
			if body && (!resp.closed || time.Since(start) > 3*time.Second) {
				t.Errorf("Expect: %s with a body announced: closed %v after %v; want a close without waiting for the body", v, resp.closed, time.Since(start))
			}
		}
	}
	if n := up.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests, want 0", n)
	}
}

// The end of a response waits for the next request's read (conn.go, deferResponseEnd). The
// idle deadline armed after it counts from now, not from the response's previous write: a
// response whose last write came more than idle_timeout after its first one (here a 100
// Continue, then an upstream slower than idle_timeout) still reaches its client, whole.
func TestDeferredResponseEndAfterSlowUpstream(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		time.Sleep(500 * time.Millisecond) // longer than idle_timeout
		_, _ = w.Write([]byte("hello"))
	})
	gw := startGateway(t, "idle_timeout: 200ms\n", upstreamRoute("/", u.addr, ""))
	c := dialRaw(t, gw.addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, "100") {
		t.Fatalf("interim answer %q, %v", line, err)
	}
	_, _ = br.ReadString('\n')
	_, _ = io.WriteString(c, "abc")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the final response was lost: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "hello" {
		t.Fatalf("body %q, %v", body, err)
	}
}

// The same for a streamed body whose tail comes after a pause longer than idle_timeout: the
// tail, written at the response's end, is not cut off.
func TestDeferredResponseEndOfPausedStream(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5010")
		_, _ = w.Write([]byte(strings.Repeat("a", 5000)))
		w.(http.Flusher).Flush()
		time.Sleep(500 * time.Millisecond)
		_, _ = w.Write([]byte(strings.Repeat("b", 10)))
	})
	gw := startGateway(t, "idle_timeout: 200ms\n", upstreamRoute("/", u.addr, ""))
	c := dialRaw(t, gw.addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ { // and the connection stays usable
		_, _ = io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || len(body) != 5010 || !strings.HasSuffix(string(body), "bbbbbbbbbb") {
			t.Fatalf("request %d: body truncated: %d bytes, %v", i, len(body), err)
		}
	}
}

// An idle keep-alive connection holds none of Toron's per-request state (SPEC 22): its
// exchange went back to the pool when the response ended, and the copy of its response's last
// write was written by the read that waits for the next request (socket.TestWriteReadReleasesBeforeWait
// shows that buffer is given back before the wait).
// The next request on the connection takes an exchange again and is served as usual.
func TestIdleConnectionHoldsNoRequestState(t *testing.T) {
	tg, _ := startProxied(t, "", "/api", nil)
	c := dialRaw(t, tg.addr)
	for i := 0; i < 3; i++ {
		if _, err := c.Write([]byte("GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if r := readRawResponse(t, c, "GET"); r.StatusCode != 200 {
			t.Fatalf("request %d: status %d, want 200", i, r.StatusCode)
		}
		var cc *clientConn
		idle := testnet.WaitUntil(5*time.Second, func() bool {
			cc = onlyConn(tg.g)
			return cc != nil && cc.x.Load() == nil && !cc.hasPending.Load()
		})
		if !idle {
			if cc == nil {
				t.Fatalf("request %d: the gateway holds no client connection", i)
			}
			t.Fatalf("request %d: idle connection still holds its request state: exchange %v, pending %v",
				i, cc.x.Load() != nil, cc.hasPending.Load())
		}
	}
}

// onlyConn returns the gateway's one open client connection, or nil.
func onlyConn(g *Gateway) *clientConn {
	l := g.ln.Load()
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) != 1 {
		return nil
	}
	for c := range l.conns {
		return c
	}
	return nil
}
