package gateway

import (
	"strings"
	"testing"
)

func TestValidHost(t *testing.T) {
	for _, h := range []string{"a", "example.com", "example.com.", "api.example.com:8443", "127.0.0.1", "127.0.0.1:80",
		"[::1]", "[::1]:8080", "[2001:db8::1]", "my_service.local:65535", "x:0"} {
		if !validHost([]byte(h)) {
			t.Errorf("validHost(%q) = false, want true", h)
		}
	}
	for _, h := range []string{"", "evil@127.0.0.1", "a.example.com:@b.example.com", "a b", " a", "a:", "a:x", "a:80x",
		"a:123456", "a:65536", "a:-1", "a:+80", ":80", "[::1", "[]", "[::1]x", "[::1]:", "[::g]", "a%2eb", "a/b", "a\\b",
		"a,b", "a;b", "ex\xc3\xa4mple.com", "a:80:81", "::1", "a?b", "a#b"} {
		if validHost([]byte(h)) {
			t.Errorf("validHost(%q) = true, want false", h)
		}
	}
}

func TestValidPercentEncoding(t *testing.T) {
	for _, p := range []string{"/", "/a%2Fb", "/%61%62", "/x?q=%", "/x?%zz", "http://a/%2e"} {
		if !validPercentEncoding([]byte(p)) {
			t.Errorf("validPercentEncoding(%q) = false, want true", p)
		}
	}
	for _, p := range []string{"/%", "/%2", "/%6%63egacy", "/%7%61", "/%zz", "/a%g1", "/%%41", "/x%2?q"} {
		if validPercentEncoding([]byte(p)) {
			t.Errorf("validPercentEncoding(%q) = true, want false", p)
		}
	}
}

// TestBadHostAndPercentEncodingRefused: a Host that is not host[:port] and a path with a
// malformed percent-encoding are 400 before routing (SPEC 7): nothing reaches the upstream.
func TestBadHostAndPercentEncodingRefused(t *testing.T) {
	gw, up := startProxied(t, "", "/", nil)
	for _, req := range []string{
		"GET / HTTP/1.1\r\nHost: evil@127.0.0.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.example.com:@b.example.com\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a:http\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a:\r\n\r\n",
		"GET http://evil@a/ HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http://a:@b/ HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.0\r\nHost: evil@a\r\n\r\n",
		"GET /%6%63egacy/reports HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /x%2 HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /x% HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		resp := rawRequest(t, gw.addr, req)
		if resp.StatusCode != 400 || string(resp.body) != badRequestBody || !resp.closed {
			t.Errorf("%q: got %d %s (closed %v), want the 400 and a closed connection", req, resp.StatusCode, resp.body, resp.closed)
		}
	}
	if n := up.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests, want 0", n)
	}
	// A well-formed Host with a port, and a valid percent-encoding, still pass.
	for _, req := range []string{
		"GET /%61pi HTTP/1.1\r\nHost: a.example.com:8080\r\n\r\n",
		"GET /x?q=% HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
	} {
		if resp := rawRequest(t, gw.addr, req); resp.StatusCode != 200 {
			t.Errorf("%q: got %d %s, want 200", req, resp.StatusCode, resp.body)
		}
	}
}

// TestMalformedPercentCannotSkipTheBulkhead is the reproduction of issue 14: with
// /legacy/reports (max_concurrency 1) and / on the same upstream, GET /%6%63egacy/reports was
// routed by / and forwarded as /%6cegacy/reports, which the upstream decodes to /legacy/reports:
// the bulkhead was skipped. It is a 400 now, while the bulkhead's one slot is held.
func TestMalformedPercentCannotSkipTheBulkhead(t *testing.T) {
	up, open := holdingUpstream(t, func(path string) bool { return strings.HasPrefix(path, "/legacy/reports") }, "")
	gw := startGateway(t, "", upstreamRoute("/legacy/reports", up.addr, "max_concurrency: 1")+upstreamRoute("/", up.addr, ""))
	go func() { _, _, _, _ = getStatus(gw.addr, "/legacy/reports/hold") }()
	up.awaitInflight(1)
	if s, _, _, _ := getStatus(gw.addr, "/legacy/reports/x"); s != 503 {
		t.Fatalf("the bulkhead's second request: %d, want 503", s)
	}
	resp := rawRequest(t, gw.addr, "GET /%6%63egacy/reports HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp.StatusCode != 400 {
		t.Errorf("GET /%%6%%63egacy/reports: %d %s, want 400 (the upstream decodes it to /legacy/reports)", resp.StatusCode, resp.body)
	}
	if n := up.requests.Load(); n != 1 {
		t.Errorf("the upstream saw %d requests, want only the one holding the bulkhead", n)
	}
	open()
}
