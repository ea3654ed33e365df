package gateway

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"toron/internal/testnet"
	"toron/socket"
)

// proxyV2 builds a PROXY protocol v2 header by hand: PROXY over TCP/IPv4 from src, or LOCAL
// (the balancer's own health check) when src is not valid.
func proxyV2(src netip.AddrPort) []byte {
	b := []byte("\r\n\r\n\x00\r\nQUIT\n")
	if !src.IsValid() {
		return append(b, 0x20, 0x00, 0, 0)
	}
	b = append(b, 0x21, 0x11, 0, 12)
	s4 := src.Addr().As4()
	b = append(b, s4[:]...)
	b = append(b, 10, 0, 0, 1)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	return binary.BigEndian.AppendUint16(b, 8080)
}

// proxiedRequest writes header and req in one segment on a new connection, as a balancer does,
// and reads the answer.
func proxiedRequest(t *testing.T, addr string, header []byte, req string) rawResponse {
	t.Helper()
	c := dialRaw(t, addr)
	if _, err := c.Write(append(append([]byte{}, header...), req...)); err != nil {
		t.Fatal(err)
	}
	return readRawResponse(t, c, "GET")
}

// readsNothing reports whether the gateway closed c without sending a byte.
func readsNothing(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	return len(b) == 0 && (err == nil || !socket.IsTimeout(err))
}

func proxyRejections(g *Gateway) string {
	var b bytes.Buffer
	g.Metrics().WritePrometheus(&b)
	for _, line := range bytes.Split(b.Bytes(), []byte("\n")) {
		if bytes.HasPrefix(line, []byte(`toron_rejected_total{route="none",reason="proxy_protocol"} `)) {
			return string(line[bytes.LastIndexByte(line, ' ')+1:])
		}
	}
	return "missing"
}

func TestProxyProtocolClientIP(t *testing.T) {
	gw, _ := startProxied(t, "proxy_protocol: {enabled: true}\n", "/api", nil)
	get := "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n"

	// v1: the header's source is the peer, so the client IP.
	rr := proxiedRequest(t, gw.addr, []byte("PROXY TCP4 203.0.113.7 10.0.0.1 56324 8080\r\n"), get)
	if rr.StatusCode != 200 || echoed(rr, "X-Real-Ip") != "203.0.113.7" || echoed(rr, "X-Forwarded-For") != "6.6.6.6, 203.0.113.7" {
		t.Errorf("v1: %d X-Real-IP %q XFF %q", rr.StatusCode, echoed(rr, "X-Real-Ip"), echoed(rr, "X-Forwarded-For"))
	}
	// v2.
	rr = proxiedRequest(t, gw.addr, proxyV2(netip.MustParseAddrPort("198.51.100.9:40000")), get)
	if rr.StatusCode != 200 || echoed(rr, "X-Real-Ip") != "198.51.100.9" {
		t.Errorf("v2: %d X-Real-IP %q", rr.StatusCode, echoed(rr, "X-Real-Ip"))
	}
	// v2 LOCAL keeps the socket peer.
	rr = proxiedRequest(t, gw.addr, proxyV2(netip.AddrPort{}), "GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
	if rr.StatusCode != 200 {
		t.Errorf("LOCAL health check: %d", rr.StatusCode)
	}
	rr = proxiedRequest(t, gw.addr, proxyV2(netip.AddrPort{}), get)
	if echoed(rr, "X-Real-Ip") != "127.0.0.1" {
		t.Errorf("v2 LOCAL: X-Real-IP %q, want the socket peer", echoed(rr, "X-Real-Ip"))
	}
	// Keep-alive: the header comes once, the requests after it keep its source.
	c := dialRaw(t, gw.addr)
	c.Write(proxyV2(netip.MustParseAddrPort("198.51.100.10:1")))
	for range 2 {
		if rr := getOn(t, c, "/api/x", ""); echoed(rr, "X-Real-Ip") != "198.51.100.10" {
			t.Errorf("keep-alive request: X-Real-IP %q", echoed(rr, "X-Real-Ip"))
		}
	}
	if v := proxyRejections(gw.g); v != "0" {
		t.Errorf("proxy_protocol rejections = %s, want 0", v)
	}
}

// TestProxyProtocolTrustedSource: behind an L4 balancer that is itself behind a trusted proxy,
// the PROXY source is what trusted_proxies judges.
func TestProxyProtocolTrustedSource(t *testing.T) {
	gw, _ := startProxied(t, "proxy_protocol: {enabled: true, allow: [127.0.0.0/8]}\ntrusted_proxies: [10.0.0.0/8]\n", "/api", nil)
	get := "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n"
	rr := proxiedRequest(t, gw.addr, []byte("PROXY TCP4 10.0.0.5 10.0.0.1 1 8080\r\n"), get)
	if echoed(rr, "X-Real-Ip") != "203.0.113.7" {
		t.Errorf("trusted PROXY source: X-Real-IP %q, want the XFF client", echoed(rr, "X-Real-Ip"))
	}
	rr = proxiedRequest(t, gw.addr, []byte("PROXY TCP4 198.51.100.1 10.0.0.1 1 8080\r\n"), get)
	if echoed(rr, "X-Real-Ip") != "198.51.100.1" || echoed(rr, "X-Forwarded-For") != "198.51.100.1" {
		t.Errorf("untrusted PROXY source: X-Real-IP %q XFF %q", echoed(rr, "X-Real-Ip"), echoed(rr, "X-Forwarded-For"))
	}
}

// TestProxyProtocolRejections: a connection without a valid header, from outside allow, or
// silent past the header deadline, is closed without an answer and counted; the upstream never
// hears of it.
func TestProxyProtocolRejections(t *testing.T) {
	gw, up := startProxied(t, "proxy_protocol: {enabled: true, timeout: 300ms}\n", "/api", nil)
	sendUnanswered(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n", "a request without a PROXY header")
	sendUnanswered(t, gw.addr, "PROXY TCP4 nonsense\r\nGET /api/x HTTP/1.1\r\nHost: a\r\n\r\n", "a malformed PROXY header")
	// Silent: cut at the header deadline, not at read_timeout, and without a 408.
	start := time.Now()
	sendUnanswered(t, gw.addr, "", "a silent connection")
	if d := time.Since(start); d < 250*time.Millisecond || d > 4*time.Second {
		t.Errorf("the silent connection was cut after %v, want about 300ms", d)
	}
	waitForValue(t, func() string { return proxyRejections(gw.g) }, "3")
	if n := up.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}

func TestProxyProtocolAllowList(t *testing.T) {
	gw, up := startProxied(t, "proxy_protocol: {enabled: true, allow: [192.0.2.0/24]}\n", "/api", nil)
	// The header claims an allowed source: only the socket peer counts.
	sendUnanswered(t, gw.addr, "PROXY TCP4 192.0.2.1 10.0.0.1 1 8080\r\nGET /api/x HTTP/1.1\r\nHost: a\r\n\r\n", "a connection from outside allow")
	waitForValue(t, func() string { return proxyRejections(gw.g) }, "1")
	if n := up.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}

// sendUnanswered writes data (nothing when empty) on a new connection to addr and fails the
// test if the gateway answers it (what names the connection) instead of closing it.
func sendUnanswered(t *testing.T, addr, data, what string) {
	t.Helper()
	c := dialRaw(t, addr)
	if data != "" {
		io.WriteString(c, data)
	}
	if !readsNothing(t, c) {
		t.Errorf("%s was answered", what)
	}
}

func waitForValue(t *testing.T, get func() string, want string) {
	t.Helper()
	var got string
	if !testnet.WaitUntil(5*time.Second, func() bool { got = get(); return got == want }) {
		t.Fatalf("value %s, want %s", got, want)
	}
}

// TestProxyProtocolReload: the header timeout follows a reload; turning the protocol off is
// refused and the old configuration keeps serving.
func TestProxyProtocolReload(t *testing.T) {
	gw, up := startProxied(t, "proxy_protocol: {enabled: true, timeout: 5s}\n", "/api", nil)
	if err := gw.g.Reload(loadConfig(t, "", upstreamRoute("/api", up.addr, ""))); err == nil {
		t.Error("a reload turning proxy_protocol off was accepted")
	}
	if err := gw.g.Reload(loadConfig(t, "proxy_protocol: {enabled: true, timeout: 300ms}\n", upstreamRoute("/api", up.addr, ""))); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sendUnanswered(t, gw.addr, "", "a silent connection")
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("cut after %v: the reloaded 300ms timeout was not applied", d)
	}
	rr := proxiedRequest(t, gw.addr, proxyV2(netip.MustParseAddrPort("198.51.100.9:1")), "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")
	if rr.StatusCode != 200 || echoed(rr, "X-Real-Ip") != "198.51.100.9" {
		t.Errorf("after the reload: %d X-Real-IP %q", rr.StatusCode, echoed(rr, "X-Real-Ip"))
	}
}

// TestProxyProtocolConcurrencyRefusal: beyond max_connections fasthttp answers a new connection
// with its 503 on the accept goroutine, before reading it; with the PROXY protocol on that write
// must not wait for the new connection's header, or one refused client would stall every accept.
func TestProxyProtocolConcurrencyRefusal(t *testing.T) {
	gw, _ := startProxied(t, "max_connections: 1\nproxy_protocol: {enabled: true, timeout: 5s}\n", "/api", nil)
	held := dialRaw(t, gw.addr)
	held.Write(proxyV2(netip.MustParseAddrPort("198.51.100.9:1")))
	if rr := getOn(t, held, "/api/x", ""); rr.StatusCode != 200 {
		t.Fatalf("first connection: %d", rr.StatusCode)
	}
	start := time.Now()
	for i := range 2 {
		c := dialRaw(t, gw.addr)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c)
		if !bytes.HasPrefix(b, []byte("HTTP/1.1 503")) {
			t.Errorf("refused connection %d got %q, want fasthttp's 503", i, b)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("two refusals took %v: the accept loop waited for their PROXY headers (timeout 5s)", d)
	}
}
