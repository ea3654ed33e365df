package gateway

import (
	"io"
	"net"
	"testing"
	"time"
)

const rateLimitedBody = `{"error":"429 Too Many Requests: Rate limit exceeded"}`

// getOn sends a GET on an open keep-alive connection and reads the answer.
func getOn(t *testing.T, c net.Conn, path, extra string) rawResponse {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: a\r\n"+extra+"\r\n"); err != nil {
		t.Fatal(err)
	}
	return readRawResponse(t, c, "GET")
}

func TestRateLimit429(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 0.5, burst: 2}"))
	c := dialRaw(t, gw.addr)
	for i := range 2 {
		if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 200 {
			t.Fatalf("request %d of the burst: %d", i+1, rr.StatusCode)
		}
	}
	rr := getOn(t, c, "/api/x", "")
	if rr.StatusCode != 429 || string(rr.body) != rateLimitedBody {
		t.Fatalf("third request: %d %s", rr.StatusCode, rr.body)
	}
	if ra := rr.Header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After %q, want 2 (a token every 2s)", ra)
	}
	if ct := rr.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if rr.Close {
		t.Error("a 429 without a body closed the keep-alive connection")
	}
	if n := up.requests.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want 2: the 429 was forwarded", n)
	}
	m := scrape(t, gw.addr)
	if v := m[`toron_rejected_total{route="/api",reason="rate_limited"}`]; v != 1 {
		t.Errorf("rate_limited rejections = %v, want 1", v)
	}
	if v := m[`toron_requests_total{route="/api",code="429"}`]; v != 1 {
		t.Errorf("429 requests = %v, want 1", v)
	}
	if v, ok := m[`toron_ratelimit_keys{route="/api"}`]; !ok || v != 1 {
		t.Errorf("toron_ratelimit_keys = %v (present %v), want 1", v, ok)
	}
}

func TestRateLimitRetryAfterWholeSeconds(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 0.25}"))
	c := dialRaw(t, gw.addr)
	getOn(t, c, "/api/x", "")
	rr := getOn(t, c, "/api/x", "")
	// One token every 4s: the next one is 3 to 4 seconds away.
	if ra := rr.Header.Get("Retry-After"); rr.StatusCode != 429 || (ra != "4" && ra != "3") {
		t.Errorf("%d Retry-After %q, want 429 and 4 (or 3 on a slow machine)", rr.StatusCode, ra)
	}
}

func TestRateLimitRefill(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 2, burst: 1}"))
	c := dialRaw(t, gw.addr)
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 200 {
		t.Fatalf("first: %d", rr.StatusCode)
	}
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 429 {
		t.Fatalf("second at once: %d, want 429", rr.StatusCode)
	}
	time.Sleep(time.Second) // a token every 500ms
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 200 {
		t.Errorf("after the refill: %d, want 200", rr.StatusCode)
	}
}

func TestRateLimitIndependentKeys(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, `rate_limit: {requests_per_second: 0.1, key: "header:X-Api-Key"}`))
	c := dialRaw(t, gw.addr)
	if rr := getOn(t, c, "/api/x", "X-Api-Key: a\r\n"); rr.StatusCode != 200 {
		t.Fatalf("key a: %d", rr.StatusCode)
	}
	if rr := getOn(t, c, "/api/x", "X-Api-Key: a\r\n"); rr.StatusCode != 429 {
		t.Fatalf("key a again: %d, want 429", rr.StatusCode)
	}
	if rr := getOn(t, c, "/api/x", "X-Api-Key: b\r\n"); rr.StatusCode != 200 {
		t.Errorf("key b: %d, want 200: keys share a bucket", rr.StatusCode)
	}
	// Without the header the request is keyed by its client IP, a bucket of its own.
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 200 {
		t.Errorf("no header: %d, want 200", rr.StatusCode)
	}
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 429 {
		t.Errorf("no header again: %d, want 429", rr.StatusCode)
	}
}

func TestRateLimitIPv6Per64(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "trusted_proxies: [127.0.0.1]\n", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 0.1}"))
	c := dialRaw(t, gw.addr)
	for _, tc := range []struct {
		xff  string
		want int
	}{
		{"2001:db8:1:2::1", 200},
		{"2001:db8:1:2:ffff:ffff:ffff:fffe", 429}, // the same /64
		{"2001:db8:1:3::1", 200},                  // the next /64
		{"198.51.100.1", 200},
		{"198.51.100.2", 200}, // IPv4 per address
		{"198.51.100.1", 429},
	} {
		if rr := getOn(t, c, "/api/x", "X-Forwarded-For: "+tc.xff+"\r\n"); rr.StatusCode != tc.want {
			t.Errorf("client %s: %d, want %d", tc.xff, rr.StatusCode, tc.want)
		}
	}
}

// TestRateLimitBeforeBody: a POST over the limit that sends only its headers (announcing 1 GiB)
// is answered 429 from the headers, with Connection: close, without waiting for the body; with
// Expect: 100-continue it gets no 100 Continue.
func TestRateLimitBeforeBody(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 0.01}\nmax_body_bytes: 2GiB\nmax_concurrency: 4"))
	if rr := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n"); rr.StatusCode != 200 {
		t.Fatalf("first: %d", rr.StatusCode)
	}
	for _, expect := range []bool{false, true} {
		// The best of three tries (the machine is shared and loaded): an answer that waited for
		// the body would take read_timeout (5s) every time.
		best := time.Hour
		for range 3 {
			rr, took := headersOnly(t, gw.addr, "/api/upload", 1<<30, expect)
			best = min(best, took)
			if rr.StatusCode != 429 || string(rr.body) != rateLimitedBody {
				t.Fatalf("expect=%v: %d %s", expect, rr.StatusCode, rr.body)
			}
			if !rr.Close || !rr.closed {
				t.Errorf("expect=%v: Connection: close %v, closed %v; want both", expect, rr.Close, rr.closed)
			}
		}
		if best > 100*time.Millisecond {
			t.Errorf("expect=%v: the 429 took %v at best, want within 100ms", expect, best)
		}
	}
	if n := up.requests.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1", n)
	}
}

// TestRateLimitSurvivesReload: the buckets of a route that keeps its name survive a reload, and
// the reload's new rate applies to them.
func TestRateLimitSurvivesReload(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 0.1}"))
	c := dialRaw(t, gw.addr)
	getOn(t, c, "/api/x", "")
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 429 {
		t.Fatalf("second: %d, want 429", rr.StatusCode)
	}
	cfg := loadConfig(t, "", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 0.1}\nmax_concurrency: 10"))
	if err := gw.g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 429 {
		t.Errorf("after the reload: %d, want 429: the bucket was reset", rr.StatusCode)
	}
	// A reload that removes the limit lets the route through.
	cfg = loadConfig(t, "", upstreamRoute("/api", up.addr, ""))
	if err := gw.g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 200 {
		t.Errorf("without rate_limit: %d", rr.StatusCode)
	}
}
