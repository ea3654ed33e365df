package gateway

import (
	"bytes"
	stdgzip "compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
	"github.com/valyala/fasthttp"

	"toron/internal/testnet"
	up "toron/upstream"
)

// TestRedirectRoute: a type: redirect route is answered at routing with its placeholders
// expanded, no upstream; a request that announced a body is answered without it and closed.
func TestRedirectRoute(t *testing.T) {
	u := startUpstream(t, nil)
	gw := startGateway(t, "", `- {type: redirect, prefix: /old, to: "https://{host}/new{uri}"}
- {type: redirect, prefix: /tmp, to: "{scheme}://{host}/t?p={path}&q={query}", status: 302}
`+upstreamRoute("/api", u.addr, ""))
	rr := rawRequest(t, gw.addr, "GET /old/x?q=1 HTTP/1.1\r\nHost: A.example.com:8080\r\n\r\n")
	if rr.StatusCode != 308 || rr.Header.Get("Location") != "https://A.example.com/new/old/x?q=1" {
		t.Fatalf("redirect: %d Location %q", rr.StatusCode, rr.Header.Get("Location"))
	}
	if rr.Header.Get("X-Request-Id") == "" || len(rr.body) != 0 || rr.closed {
		t.Errorf("redirect answer: id %q, body %q, closed %v", rr.Header.Get("X-Request-Id"), rr.body, rr.closed)
	}
	rr = rawRequest(t, gw.addr, "GET /tmp/a%20b?x=1&y HTTP/1.1\r\nHost: [::1]:99\r\n\r\n")
	if rr.StatusCode != 302 || rr.Header.Get("Location") != "http://[::1]/t?p=/tmp/a%20b&q=x=1&y" {
		t.Fatalf("302: %d Location %q", rr.StatusCode, rr.Header.Get("Location"))
	}
	// A declared body is never waited for: the answer comes at once, and the connection closes.
	// Its Location is still the request's (fasthttp resets the request when the cut pre-read
	// fails, before the answer is written).
	start := time.Now()
	rr = rawRequest(t, gw.addr, "POST /old/y?z=2 HTTP/1.1\r\nHost: a.example:8080\r\nContent-Length: 100000\r\n\r\n")
	if rr.StatusCode != 308 || !rr.closed || time.Since(start) > 3*time.Second || rr.Header.Get("Location") != "https://a.example/new/old/y?z=2" {
		t.Errorf("redirect with a body: %d Location %q closed %v after %s", rr.StatusCode, rr.Header.Get("Location"), rr.closed, time.Since(start))
	}
	// With Expect: 100-continue the answer is the route's status, not 308, and no 100 comes.
	rr = rawRequest(t, gw.addr, "POST /tmp/e HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n")
	if rr.StatusCode != 302 || rr.Header.Get("Location") != "http://a/t?p=/tmp/e&q=" {
		t.Errorf("redirect with Expect: %d Location %q", rr.StatusCode, rr.Header.Get("Location"))
	}
	if n := u.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
	if m := metricsOf(gw.g); !strings.Contains(m, `toron_requests_total{route="/old",code="308"} 2`) {
		t.Errorf("redirects not counted:\n%s", grepLines(m, "toron_requests_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestHTTPSOnly: on a plaintext listener, https_only redirects http requests; behind a
// TLS-terminating balancer (a trusted proxy saying X-Forwarded-Proto: https) the request is
// served, so there is no redirect loop; an untrusted peer's header is not believed.
func TestHTTPSOnly(t *testing.T) {
	u := startUpstream(t, nil)
	route := upstreamRoute("/app", u.addr, "https_only: true")
	gw := startGateway(t, "trusted_proxies: [127.0.0.1]", route)
	rr := rawRequest(t, gw.addr, "GET /app/x?y=1 HTTP/1.1\r\nHost: shop.example:8080\r\n\r\n")
	if rr.StatusCode != 308 || rr.Header.Get("Location") != "https://shop.example/app/x?y=1" {
		t.Fatalf("https_only: %d Location %q", rr.StatusCode, rr.Header.Get("Location"))
	}
	rr = rawRequest(t, gw.addr, "GET /app/x HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-Proto: https\r\n\r\n")
	if rr.StatusCode != 200 || u.requests.Load() != 1 {
		t.Fatalf("behind a TLS-terminating balancer: %d, upstream saw %d", rr.StatusCode, u.requests.Load())
	}
	untrusted := startGateway(t, "trusted_proxies: [192.0.2.1]", route)
	rr = rawRequest(t, untrusted.addr, "GET /app/x HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-Proto: https\r\n\r\n")
	if rr.StatusCode != 308 {
		t.Fatalf("an untrusted X-Forwarded-Proto was believed: %d", rr.StatusCode)
	}
	// A declared body that has not come: the same Location, at once, and the connection closes.
	rr = rawRequest(t, gw.addr, "POST /app/x?y=1 HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 9000\r\n\r\n")
	if rr.StatusCode != 308 || !rr.closed || rr.Header.Get("Location") != "https://shop.example/app/x?y=1" {
		t.Errorf("https_only with a body: %d Location %q closed %v", rr.StatusCode, rr.Header.Get("Location"), rr.closed)
	}
}

// TestHTTPSRedirectListener: server.tls.http_redirect opens a plaintext listener that redirects
// to the TLS port, serves the health path (draining with the main listener), and closes with it.
func TestHTTPSRedirectListener(t *testing.T) {
	_, c1, k1 := testnet.NewCA(t).IssueFiles(t, "gw", "gw.test")
	u := startUpstream(t, nil)
	port := testnet.FreePort(t)
	gw := startGateway(t, "port: 8443\n"+tlsServerYAML(fmt.Sprintf("http_redirect: {port: %d}", port), c1, k1), upstreamRoute("/api", u.addr, ""))
	rln, err := gw.g.ListenRedirect()
	if err != nil || rln == nil {
		t.Fatalf("ListenRedirect: %v %v", rln, err)
	}
	rdone := make(chan error, 1)
	go func() { rdone <- gw.g.ServeRedirect(rln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.g.shutdownRedirect(ctx)
		<-rdone
	})
	raddr := rln.Addr().String()
	rr := rawRequest(t, raddr, "GET /api/x?q=1 HTTP/1.1\r\nHost: gw.test\r\n\r\n")
	if rr.StatusCode != 308 || rr.Header.Get("Location") != "https://gw.test:8443/api/x?q=1" {
		t.Fatalf("redirect listener: %d Location %q", rr.StatusCode, rr.Header.Get("Location"))
	}
	rr = rawRequest(t, raddr, "POST /api/up?q=2 HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 9000\r\n\r\n")
	if rr.StatusCode != 308 || !rr.closed || rr.Header.Get("Location") != "https://gw.test:8443/api/up?q=2" {
		t.Errorf("redirect listener, a body announced: %d Location %q closed %v", rr.StatusCode, rr.Header.Get("Location"), rr.closed)
	}
	rr = rawRequest(t, raddr, "GET /metrics HTTP/1.1\r\nHost: gw.test:80\r\n\r\n")
	if rr.StatusCode != 308 || rr.Header.Get("Location") != "https://gw.test:8443/metrics" {
		t.Errorf("metrics path on the redirect listener: %d %q", rr.StatusCode, rr.Header.Get("Location"))
	}
	rr = rawRequest(t, raddr, "GET /health HTTP/1.1\r\nHost: gw.test\r\n\r\n")
	if rr.StatusCode != 200 || string(rr.body) != `{"status":"ok"}` {
		t.Fatalf("health on the redirect listener: %d %s", rr.StatusCode, rr.body)
	}
	// Slowloris: a client that never finishes its headers is cut at read_timeout (1s here would
	// need a reload; the default 5s is within the bound below).
	c := dialRaw(t, raddr)
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: gw.test\r\n")
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	start := time.Now()
	_, _ = io.ReadAll(c)
	if d := time.Since(start); d > 12*time.Second {
		t.Errorf("a dripping client on the redirect listener was held %s", d)
	}
	if u.requests.Load() != 0 {
		t.Error("the redirect listener forwarded a request")
	}
	gw.g.Drain()
	rr = rawRequest(t, raddr, "GET /health HTTP/1.1\r\nHost: gw.test\r\n\r\n")
	if rr.StatusCode != 503 || !rr.closed {
		t.Errorf("draining health on the redirect listener: %d closed %v", rr.StatusCode, rr.closed)
	}
}

// TestHeaderRules: request_headers and response_headers, with placeholders, after Toron's own
// headers; names in any case (x-request-id replaces the X-Request-Id Toron set).
func TestHeaderRules(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "legacy/1.0")
		w.Header().Set("X-Env-Seen", r.Header.Get("X-Env"))
		w.Header().Set("X-Client-Seen", r.Header.Get("X-Client"))
		w.Header().Set("X-Tag-Seen", strings.Join(r.Header.Values("X-Tag"), "|"))
		w.Header().Set("X-Cookie-Seen", r.Header.Get("Cookie"))
		w.Header().Set("X-Request-Id-Seen", r.Header.Get("X-Request-Id"))
		w.WriteHeader(200)
	})
	gw := startGateway(t, "", upstreamRoute("/api", u.addr, `name: api
request_headers:
  set: {X-Env: prod, X-Client: "{client_ip} via {route}", x-request-id: "overridden-{request_id}"}
  add: {X-Tag: "{host}"}
  remove: [cookie]
response_headers:
  remove: [server]
  set: {Strict-Transport-Security: max-age=63072000, X-Route: "{route}"}
  add: {X-Tag: b}`))
	rr := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: h.example:1\r\nCookie: a=b\r\nX-Tag: from-client\r\nX-Request-Id: rid-7\r\n\r\n")
	h := rr.Header
	for k, want := range map[string]string{
		"X-Env-Seen":                "prod",
		"X-Client-Seen":             "127.0.0.1 via api",
		"X-Tag-Seen":                "from-client|h.example",
		"X-Cookie-Seen":             "",
		"X-Request-Id-Seen":         "overridden-rid-7",
		"Server":                    "",
		"Strict-Transport-Security": "max-age=63072000",
		"X-Route":                   "api",
		"X-Tag":                     "b",
		"X-Request-Id":              "rid-7",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

// TestCORS: the preflight is answered 204 by Toron (no upstream), other requests from an
// allowed origin get the CORS headers with Vary: Origin.
func TestCORS(t *testing.T) {
	u := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/api", u.addr, `cors: {allow_origins: ["https://app.example.com"], allow_methods: [GET, PUT], allow_headers: [Content-Type, X-Token], expose_headers: [X-Total], allow_credentials: true, max_age: 10m}`)+
		upstreamRoute("/pub", u.addr, `cors: {allow_origins: ["*"]}`)+
		upstreamRoute("/m", u.addr, "methods: [GET, POST]\ncors: {allow_origins: [\"https://app.example.com\"]}")+
		upstreamRoute("/nocors", u.addr, "methods: [GET]")+
		upstreamRoute("/down", refusedAddr(t), `cors: {allow_origins: ["https://app.example.com"]}`)+
		upstreamRoute("/", u.addr, ""))
	pre := "OPTIONS /api/items HTTP/1.1\r\nHost: a\r\nOrigin: https://App.example.com\r\nAccess-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: content-type\r\n\r\n"
	rr := rawRequest(t, gw.addr, pre)
	h := rr.Header
	if rr.StatusCode != 204 || h.Get("Access-Control-Allow-Origin") != "https://App.example.com" || h.Get("Access-Control-Allow-Methods") != "GET, PUT" ||
		h.Get("Access-Control-Allow-Headers") != "Content-Type, X-Token" || h.Get("Access-Control-Max-Age") != "600" || h.Get("Access-Control-Allow-Credentials") != "true" ||
		!strings.Contains(h.Get("Vary"), "Origin") || len(rr.body) != 0 {
		t.Fatalf("preflight: %d %v", rr.StatusCode, h)
	}
	// A preflight that declares a body (not sent): the same CORS headers, and the connection
	// closes (fasthttp resets the request when the cut pre-read fails, before the answer).
	rr = rawRequest(t, gw.addr, strings.Replace(pre, "\r\n\r\n", "\r\nContent-Length: 20\r\n\r\n", 1))
	if rr.StatusCode != 204 || rr.Header.Get("Access-Control-Allow-Origin") != "https://App.example.com" || rr.Header.Get("Access-Control-Allow-Methods") != "GET, PUT" || !rr.closed {
		t.Fatalf("preflight with a body announced: %d closed %v %v", rr.StatusCode, rr.closed, rr.Header)
	}
	// A route restricted to methods answers the preflight of a method it allows (it would take
	// the actual request), though OPTIONS is not among them; its allowed methods are the
	// route's. A preflight of a method it does not allow, or on a route without cors, is routed
	// as any OPTIONS request (here to the catch-all route).
	rr = rawRequest(t, gw.addr, "OPTIONS /m/x HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\nAccess-Control-Request-Method: POST\r\n\r\n")
	if rr.StatusCode != 204 || rr.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" || rr.Header.Get("Access-Control-Allow-Methods") != "GET, POST" {
		t.Fatalf("preflight on a route with methods: %d %v", rr.StatusCode, rr.Header)
	}
	for _, p := range []string{"OPTIONS /m/x HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\nAccess-Control-Request-Method: DELETE\r\n\r\n",
		"OPTIONS /nocors/x HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\nAccess-Control-Request-Method: GET\r\n\r\n"} {
		if rr = rawRequest(t, gw.addr, p); rr.StatusCode != 200 || rr.Header.Get("X-Echo-Method") != "OPTIONS" || rr.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("%q: %d %v, want it forwarded by the catch-all route", strings.SplitN(p, "\r\n", 2)[0], rr.StatusCode, rr.Header)
		}
	}
	before := u.requests.Load()
	rr = rawRequest(t, gw.addr, strings.Replace(pre, "https://App.example.com", "https://evil.example", 1))
	if rr.StatusCode != 204 || rr.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight of another origin: %d %v", rr.StatusCode, rr.Header)
	}
	if n := u.requests.Load(); n != before {
		t.Fatalf("a preflight reached the upstream (%d)", n-before)
	}
	rr = rawRequest(t, gw.addr, "GET /api/items HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\n\r\n")
	h = rr.Header
	if rr.StatusCode != 200 || h.Get("Access-Control-Allow-Origin") != "https://app.example.com" || h.Get("Access-Control-Expose-Headers") != "X-Total" ||
		h.Get("Access-Control-Allow-Credentials") != "true" || h.Get("Vary") != "Origin" {
		t.Fatalf("actual request: %d %v", rr.StatusCode, h)
	}
	rr = rawRequest(t, gw.addr, "GET /api/items HTTP/1.1\r\nHost: a\r\nOrigin: https://evil.example\r\n\r\n")
	if rr.Header.Get("Access-Control-Allow-Origin") != "" || rr.Header.Get("Vary") != "Origin" {
		t.Fatalf("another origin's request: %v", rr.Header)
	}
	// OPTIONS without Access-Control-Request-Method is not a preflight: it is forwarded.
	rr = rawRequest(t, gw.addr, "OPTIONS /api/items HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\n\r\n")
	if rr.StatusCode != 200 || rr.Header.Get("X-Echo-Method") != "OPTIONS" {
		t.Fatalf("plain OPTIONS: %d %v", rr.StatusCode, rr.Header)
	}
	// Toron's own answers on a cors route carry the CORS headers too, so that a browser can
	// read them: a 413 decided from the headers with the body never read (the request is reset
	// by then), and a 502 written by the handler.
	rr = rawRequest(t, gw.addr, "POST /api/up HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\nContent-Length: 99999999\r\n\r\n")
	if rr.StatusCode != 413 || rr.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" || rr.Header.Get("Vary") != "Origin" || !rr.closed {
		t.Fatalf("413 on a cors route: %d closed %v %v", rr.StatusCode, rr.closed, rr.Header)
	}
	rr = rawRequest(t, gw.addr, "GET /down/x HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\n\r\n")
	if rr.StatusCode != 502 || rr.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" || rr.Header.Get("Vary") != "Origin" {
		t.Fatalf("502 on a cors route: %d %v", rr.StatusCode, rr.Header)
	}
	rr = rawRequest(t, gw.addr, "GET /down/x HTTP/1.1\r\nHost: a\r\nOrigin: https://evil.example\r\n\r\n")
	if rr.StatusCode != 502 || rr.Header.Get("Access-Control-Allow-Origin") != "" || rr.Header.Get("Vary") != "Origin" {
		t.Fatalf("502 on a cors route, another origin: %d %v", rr.StatusCode, rr.Header)
	}
	rr = rawRequest(t, gw.addr, "GET /pub HTTP/1.1\r\nHost: a\r\nOrigin: https://any.example\r\n\r\n")
	if rr.Header.Get("Access-Control-Allow-Origin") != "*" || rr.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Fatalf("wildcard origin: %v", rr.Header)
	}
}

// jsonDoc is about n bytes of JSON.
func jsonDoc(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, `{"id":%d,"name":"item-%d","price":%d.99},`, i, i, i%97)
	}
	b.Truncate(b.Len() - 1)
	b.WriteString("]}")
	return b.Bytes()
}

// compressUpstream answers per query: size (bytes of JSON), cl=1 (a Content-Length, else
// chunked), status, ct (Content-Type), ce (Content-Encoding), cc (Cache-Control).
func compressUpstream(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	size, _ := strconv.Atoi(q.Get("size"))
	body := jsonDoc(size)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if v := q.Get("ct"); v != "" {
		h.Set("Content-Type", v)
	}
	if v := q.Get("ce"); v != "" {
		h.Set("Content-Encoding", v)
	}
	if v := q.Get("cc"); v != "" {
		h.Set("Cache-Control", v)
	}
	h.Set("ETag", `"v1"`)
	h.Set("Accept-Ranges", "bytes")
	status := 200
	if v := q.Get("status"); v != "" {
		status, _ = strconv.Atoi(v)
	}
	if q.Get("cl") == "1" {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	if q.Get("cl") == "1" {
		_, _ = w.Write(body)
		return
	}
	for len(body) > 0 { // chunked, in pieces
		n := min(len(body), 7000)
		_, _ = w.Write(body[:n])
		w.(http.Flusher).Flush()
		body = body[n:]
	}
}

// decodeBody decodes a response body of coding ce with an independent decoder.
func decodeBody(t *testing.T, ce string, body []byte) []byte {
	t.Helper()
	var r io.Reader
	switch ce {
	case "gzip":
		zr, err := stdgzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	case "br":
		r = brotli.NewReader(bytes.NewReader(body))
	default:
		return body
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s body does not decode: %v", ce, err)
	}
	return out
}

// TestCompress: SPEC 20's compression rules on real sockets, the bodies decoded and compared
// byte for byte.
func TestCompress(t *testing.T) {
	u := startUpstream(t, compressUpstream)
	gw := startGateway(t, "", upstreamRoute("/c", u.addr, "compress: true")+
		upstreamRoute("/g", u.addr, "compress: {encodings: [gzip, br], min_bytes: 100, types: [application/json, text/event-stream]}"))
	cases := []struct {
		name, method, path, accept string
		wantCE                     string // "" identity
		wantVary                   bool
		size                       int
	}{
		{"chunked zstd", "GET", "/c?size=100000", "gzip, br, zstd", "zstd", true, 100000},
		{"content-length gzip", "GET", "/c?size=100000&cl=1", "gzip", "gzip", true, 100000},
		{"content-length br", "GET", "/c?size=5000&cl=1", "br", "br", true, 5000},
		{"q-values", "GET", "/c?size=5000", "zstd;q=0.5, gzip;q=0.8, br;q=0.1", "gzip", true, 5000},
		{"q=0 refuses", "GET", "/c?size=5000", "gzip;q=0, zstd;q=0", "", true, 5000},
		{"star", "GET", "/c?size=5000", "*", "zstd", true, 5000},
		{"star with a refusal", "GET", "/c?size=5000", "*, zstd;q=0", "br", true, 5000},
		{"route order breaks ties", "GET", "/g?size=5000", "br, gzip", "gzip", true, 5000},
		{"no accept-encoding", "GET", "/c?size=5000", "", "", true, 5000},
		{"below min_bytes", "GET", "/c?size=500&cl=1", "gzip", "", true, 500},
		{"chunked below min_bytes", "GET", "/c?size=500", "gzip", "gzip", true, 500},
		{"route min_bytes", "GET", "/g?size=200&cl=1", "gzip", "gzip", true, 200},
		{"already encoded", "GET", "/c?size=5000&ce=identity2", "gzip", "identity2", true, 5000},
		{"no-transform", "GET", "/c?size=5000&cc=no-transform", "gzip", "", true, 5000},
		{"not compressible", "GET", "/c?size=5000&ct=image/png", "gzip", "", false, 5000},
		{"event stream off by default", "GET", "/c?size=5000&ct=text/event-stream", "gzip", "", false, 5000},
		{"event stream listed", "GET", "/g?size=5000&ct=text/event-stream", "gzip", "gzip", true, 5000},
		{"HEAD", "HEAD", "/c?size=5000&cl=1", "gzip", "", true, 0},
		{"204", "GET", "/c?size=0&status=204", "gzip", "", false, 0},
		{"206", "GET", "/c?size=5000&status=206&cl=1", "gzip", "", false, 5000},
		{"304", "GET", "/c?size=0&status=304", "gzip", "", false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := c.method + " " + c.path + " HTTP/1.1\r\nHost: a\r\n"
			if c.accept != "" {
				req += "Accept-Encoding: " + c.accept + "\r\n"
			}
			conn := dialRaw(t, gw.addr)
			if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
				t.Fatal(err)
			}
			rr := readRawResponse(t, conn, c.method)
			ce := rr.Header.Get("Content-Encoding")
			if ce != c.wantCE {
				t.Fatalf("Content-Encoding %q, want %q (status %d)", ce, c.wantCE, rr.StatusCode)
			}
			vary := strings.Contains(strings.Join(rr.Header.Values("Vary"), ","), "Accept-Encoding")
			if vary != c.wantVary {
				t.Errorf("Vary: Accept-Encoding %v, want %v (%q)", vary, c.wantVary, rr.Header.Values("Vary"))
			}
			compressed := c.wantCE == "gzip" || c.wantCE == "br" || c.wantCE == "zstd"
			if compressed {
				if rr.ContentLength != -1 || rr.Header.Get("Accept-Ranges") != "" || rr.Header.Get("ETag") != `W/"v1"` {
					t.Errorf("compressed answer headers: length %d, Accept-Ranges %q, ETag %q", rr.ContentLength, rr.Header.Get("Accept-Ranges"), rr.Header.Get("ETag"))
				}
			} else if rr.Header.Get("ETag") != `"v1"` && rr.StatusCode != 204 && rr.StatusCode != 304 {
				t.Errorf("an uncompressed answer's ETag changed: %q", rr.Header.Get("ETag"))
			}
			if c.method == "HEAD" {
				if rr.ContentLength != int64(len(jsonDoc(5000))) {
					t.Errorf("HEAD Content-Length %d", rr.ContentLength)
				}
				return
			}
			want := jsonDoc(c.size)
			if c.size == 0 {
				want = nil
			}
			got := decodeBody(t, c.wantCE, rr.body)
			if !bytes.Equal(got, want) {
				t.Fatalf("body: %d bytes decoded, want %d", len(got), len(want))
			}
			if compressed && c.size >= 5000 && len(rr.body) > len(want)/2 {
				t.Errorf("%d bytes for %d of JSON: not compressed", len(rr.body), len(want))
			}
		})
	}
}

// TestCompressStreamsPauses: a compressed stream whose upstream pauses reaches the client in
// pieces: what came before the pause is decoded while the upstream is still silent.
func TestCompressStreamsPauses(t *testing.T) {
	first := jsonDoc(3000)
	second := []byte(`{"done":true}`)
	// The upstream pauses after the first piece until the client has it, or for at most 3 s:
	// inOrder counts the streams whose first piece arrived during the pause.
	arrived := make(chan struct{}, 1)
	var inOrder atomic.Int64
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(first)
		w.(http.Flusher).Flush()
		select {
		case <-arrived:
			inOrder.Add(1)
		case <-time.After(3 * time.Second):
		}
		_, _ = w.Write(second)
	})
	gw := startGateway(t, "", upstreamRoute("/s", u.addr, "compress: true"))
	for _, enc := range []string{"gzip", "br", "zstd"} {
		t.Run(enc, func(t *testing.T) {
			before := inOrder.Load()
			req, _ := http.NewRequest("GET", "http://"+gw.addr+"/s", nil)
			req.Header.Set("Accept-Encoding", enc)
			resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.Header.Get("Content-Encoding") != enc {
				t.Fatalf("Content-Encoding %q", resp.Header.Get("Content-Encoding"))
			}
			var dr io.Reader
			switch enc {
			case "gzip":
				zr, err := stdgzip.NewReader(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				dr = zr
			case "br":
				dr = brotli.NewReader(resp.Body)
			case "zstd":
				zr, err := zstd.NewReader(resp.Body, zstd.WithDecoderConcurrency(1))
				if err != nil {
					t.Fatal(err)
				}
				defer zr.Close()
				dr = zr
			}
			got := make([]byte, len(first))
			if _, err := io.ReadFull(dr, got); err != nil || !bytes.Equal(got, first) {
				t.Fatalf("first piece: %v", err)
			}
			arrived <- struct{}{}
			rest, err := io.ReadAll(dr)
			if err != nil || !bytes.Equal(rest, second) {
				t.Fatalf("rest %q: %v", rest, err)
			}
			if inOrder.Load() != before+1 {
				<-arrived
				t.Fatal("the first piece arrived only after the upstream's pause: the stream was not flushed")
			}
		})
	}
}

// TestTrafficRulesAllocs: header rules and CORS headers, placeholders expanded, add no
// allocation per request. The removed names (and on the request the set ones) are dropped
// while the headers are copied (removesRequestHeader, responseRemoves); the request's set and
// add rules are header lines written with its head (x.out.Extra).
func TestTrafficRulesAllocs(t *testing.T) {
	x, ctx := trafficExchange(t)
	var out fasthttp.RequestHeader
	var head []byte
	run := func() {
		out.Reset()
		out.SetRequestURI("/api/x")
		out.Set("Accept", "*/*")
		x.applyRequestTraffic(&out)
		head = up.AppendRequestHead(head[:0], &out, x.out.Extra)
		ctx.Response.Header.Reset()
		ctx.Response.Header.Set("Content-Type", "application/json")
		x.applyResponseTraffic(ctx, -1)
	}
	run()
	if string(head) != "GET /api/x HTTP/1.1\r\nAccept: */*\r\nX-Client: 192.0.2.7\r\nX-Env: prod\r\n\r\n" || string(ctx.Response.Header.Peek("X-Route")) != "/api" ||
		string(ctx.Response.Header.Peek("Access-Control-Allow-Origin")) != "https://app.example.com" {
		t.Fatalf("rules not applied:\n%s\n%s", head, ctx.Response.Header.Header())
	}
	if !x.removesRequestHeader([]byte("Cookie")) || !x.removesRequestHeader([]byte("X-Env")) || x.removesRequestHeader([]byte("Accept")) ||
		len(x.responseRemoves()) != 1 || string(x.responseRemoves()[0]) != "Server" {
		t.Errorf("removed names: request Cookie %v, response %q", x.removesRequestHeader([]byte("Cookie")), x.responseRemoves())
	}
	if allocs := testing.AllocsPerRun(200, run); allocs != 0 {
		t.Errorf("traffic rules allocate %.1f times per request", allocs)
	}
}

// TestHeaderRulesRemoveOwn: a removed name Toron sets itself (X-Request-Id on both sides, the
// CORS Vary on a route with cors) is removed too, not only the client's and the upstream's
// (which the copy of the headers skips).
func TestHeaderRulesRemoveOwn(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "legacy/1.0")
		w.Header().Set("Vary", "Accept")
		w.Header().Set("X-Request-Id", "from-upstream")
		w.Header().Set("X-Seen", r.Header.Get("X-Request-Id")+"|"+r.Header.Get("Cookie"))
		w.WriteHeader(200)
	})
	gw := startGateway(t, "", upstreamRoute("/api", u.addr, `request_headers: {remove: [x-request-id, Cookie]}
response_headers: {remove: [X-Request-Id, vary, Server]}
cors: {allow_origins: ["https://app.example.com"]}`))
	rr := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\nCookie: a=b\r\nX-Request-Id: rid-7\r\n\r\n")
	h := rr.Header
	if rr.StatusCode != 200 || h.Get("X-Seen") != "|" || h.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Fatalf("%d %v", rr.StatusCode, h)
	}
	for _, k := range []string{"X-Request-Id", "Vary", "Server"} {
		if v, ok := h[k]; ok {
			t.Errorf("%s %q not removed", k, v)
		}
	}
}

// trafficExchange is an exchange on a route with trafficRulesRoute, without sockets: a request
// to a.example:8080 with an Origin, from 192.0.2.7, request id rid-1.
func trafficExchange(tb testing.TB) (*exchange, *fasthttp.RequestCtx) {
	cfg := loadConfig(tb, "", upstreamRoute("/api", "127.0.0.1:1", trafficRulesRoute))
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetHost("a.example:8080")
	ctx.Request.Header.Set("Origin", "https://app.example.com")
	x := &exchange{curCtx: ctx, stats: &routeStats{name: cfg.Routes[0].Name}, route: &route{traffic: newTrafficRules(&cfg.Routes[0])}}
	x.reqID = []byte("rid-1")
	x.clientIP = netip.MustParseAddr("192.0.2.7")
	return x, ctx
}
