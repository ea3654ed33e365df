package gateway

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"toron/timeouts"
)

// TestRejectionsThroughListener checks the gateway's own answers: status, exact JSON, content
// type and whether the connection closes.
func TestRejectionsThroughListener(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "max_header_bytes: 4096\n", upstreamRoute("/api", up.addr, "")+upstreamRoute("/small", up.addr, "max_body_bytes: 100"))
	bigHeader := "X-Big: " + strings.Repeat("a", 5000) + "\r\n"
	cases := []struct {
		name      string
		req       string
		status    int
		body      string
		wantClose bool
	}{
		{"no route", "GET /nothing HTTP/1.1\r\nHost: a\r\n\r\n", 404, `{"error":"404 Not Found: no route matches the request"}`, false},
		{"no route with body", "POST /nothing HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n", 404, `{"error":"404 Not Found: no route matches the request"}`, true},
		{"segment boundary", "GET /apix HTTP/1.1\r\nHost: a\r\n\r\n", 404, `{"error":"404 Not Found: no route matches the request"}`, false},
		{"header too large", "GET /api HTTP/1.1\r\nHost: a\r\n" + bigHeader + "\r\n", 431, `{"error":"431 Request Header Fields Too Large: request line and headers exceed max_header_bytes"}`, true},
		{"CL and TE", "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, `{"error":"400 Bad Request: malformed request"}`, true},
		{"duplicate CL", "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", 400, `{"error":"400 Bad Request: malformed request"}`, true},
		{"signed CL", "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello", 400, `{"error":"400 Bad Request: malformed request"}`, true},
		{"TE gzip", "POST /api HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 400, `{"error":"400 Bad Request: malformed request"}`, true},
		{"TE twice", "POST /api HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, `{"error":"400 Bad Request: malformed request"}`, true},
		{"space before colon", "GET /api HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n", 400, `{"error":"400 Bad Request: malformed request"}`, true},
		{"upgrade", "GET /api HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", 501, `{"error":"501 Not Implemented: connection upgrades are not supported"}`, true},
		{"tier-1 413", "POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", 413, `{"error":"413 Payload Too Large: request Content-Length exceeds effective route limit"}`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := rawRequest(t, gw.addr, tc.req)
			if resp.StatusCode != tc.status || string(resp.body) != tc.body {
				t.Fatalf("got %d %s, want %d %s", resp.StatusCode, resp.body, tc.status, tc.body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content type %q", ct)
			}
			if tc.wantClose && !resp.closed {
				t.Errorf("connection left open (Connection: close announced: %v)", resp.Close)
			}
			if !tc.wantClose && resp.Close {
				t.Errorf("connection closed, want keep-alive")
			}
		})
	}
	if n := up.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d requests, want 0", n)
	}
	if n := up.conns.Load(); n != 0 {
		t.Errorf("upstream saw %d connections, want 0", n)
	}
}

// TestTier1BeforeBody: a client that declares a large body and sends only the headers gets
// the 413 at once, without any body byte, and the upstream gets no connection.
func TestTier1BeforeBody(t *testing.T) {
	gw, up := startProxied(t, "", "/api", nil)
	for _, expect := range []bool{false, true} {
		resp, elapsed := headersOnly(t, gw.addr, "/api/upload", 1073741824, expect)
		if resp.StatusCode != 413 || !strings.Contains(string(resp.body), "exceeds effective route limit") {
			t.Fatalf("expect=%v: %d %s", expect, resp.StatusCode, resp.body)
		}
		if !resp.closed {
			t.Errorf("expect=%v: connection not closed", expect)
		}
		// read_timeout is 5s: an answer that waited for body bytes would take that long.
		if elapsed > time.Second {
			t.Errorf("expect=%v: 413 took %v", expect, elapsed)
		}
	}
	if up.conns.Load() != 0 {
		t.Errorf("upstream dialed")
	}
}

// TestGatewayPathsBeforeBody: /health and /metrics with a declared body that never comes are
// answered from the headers, at once, with Connection: close and no 100 Continue, as any
// answer given before the body (SPEC 3); the connection closes without reading it.
func TestGatewayPathsBeforeBody(t *testing.T) {
	gw, up := startProxied(t, "", "/api", nil)
	for _, path := range []string{"/health", "/metrics"} {
		for _, expect := range []bool{false, true} {
			resp, elapsed := headersOnly(t, gw.addr, path, 10, expect)
			if resp.StatusCode != 200 || !resp.closed {
				t.Fatalf("%s expect=%v: %d closed=%v %.80s", path, expect, resp.StatusCode, resp.closed, resp.body)
			}
			if path == "/health" && string(resp.body) != `{"status":"ok"}` || path == "/metrics" && !strings.Contains(string(resp.body), "toron_workers_max") {
				t.Errorf("%s expect=%v: body %.80s", path, expect, resp.body)
			}
			// read_timeout is 5s: an answer that waited for body bytes would take that long.
			if elapsed > time.Second {
				t.Errorf("%s expect=%v: answered after %v", path, expect, elapsed)
			}
		}
	}
	if up.conns.Load() != 0 {
		t.Errorf("upstream dialed")
	}
}

func TestExpectContinueAccepted(t *testing.T) {
	gw, _ := startProxied(t, "", "/api", nil)
	c := dialRaw(t, gw.addr)
	fmt.Fprintf(c, "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 100 Continue") {
		t.Fatalf("want 100 Continue, got %q %v", buf[:n], err)
	}
	io.WriteString(c, "hello")
	resp := readRawResponse(t, c, "POST")
	if resp.StatusCode != 200 || string(resp.body) != "hello" {
		t.Fatalf("status %d body %q", resp.StatusCode, resp.body)
	}
}

// TestSilentNewConnectionClosedQuietly: a connection that never sends a byte is closed after
// read_timeout without an answer and without a counted request.
func TestSilentNewConnectionClosedQuietly(t *testing.T) {
	gw, _ := startProxied(t, "read_timeout: 1s\n", "/", nil)
	c := dialRaw(t, gw.addr)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(c)
	if len(got) != 0 {
		t.Errorf("silent connection got an answer: %q", got)
	}
	m := scrape(t, gw.addr)
	if v := m[`toron_rejected_total{route="none",reason="read_timeout"}`]; v != 0 {
		t.Errorf("read_timeout rejections %v, want 0", v)
	}
	// A client that started a request and stalled is still answered 408 and counted.
	c2 := dialRaw(t, gw.addr)
	io.WriteString(c2, "GET / HTTP/1.1\r\nHost: a\r\n")
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ = io.ReadAll(c2)
	if !strings.Contains(string(got), " 408 ") {
		t.Errorf("stalled headers: %q, want 408", got)
	}
	m = scrape(t, gw.addr)
	if v := m[`toron_rejected_total{route="none",reason="read_timeout"}`]; v != 1 {
		t.Errorf("read_timeout rejections %v, want 1", v)
	}
}

// TestRefusedRequestClosesWithoutReset: fasthttp refuses these before the header hook, with
// request bytes still unread in the socket; the gateway's close must drain them (lingering), or
// the kernel answers them with a reset, which on a real network can destroy the response
// before the client reads it. On loopback the reset shows as ECONNRESET after the response.
func TestRefusedRequestClosesWithoutReset(t *testing.T) {
	gw, _ := startProxied(t, "max_header_bytes: 4096\n", "/api", nil)
	tail := strings.Repeat("X-Pad: "+strings.Repeat("p", 100)+"\r\n", 200) + "\r\n"
	cases := []struct {
		name   string
		req    string
		status int
	}{
		{"header too large", "GET /api HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("a", 20000) + "\r\n\r\n", 431},
		{"malformed header", "GET /api HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n" + tail, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, gw.addr)
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("the connection ended with %v after %q, want a clean close", err, got)
			}
			if want := fmt.Sprintf("HTTP/1.1 %d ", tc.status); !strings.HasPrefix(string(got), want) {
				t.Fatalf("got %q, want %s", got, want)
			}
		})
	}
}

// TestLingerOnlyForRefusals: the close lingers after a refusal that may leave request bytes
// unread, never after cutting a client for being slow (a timeout or a body below the minimum
// rate), whose connection must close at once.
func TestLingerOnlyForRefusals(t *testing.T) {
	cases := []struct {
		err    error
		linger bool
	}{
		{errors.New("error when reading request headers: small read buffer"), true},
		{errors.New("cannot parse request line"), true},
		{os.ErrDeadlineExceeded, false},
		{fmt.Errorf("body: %w", timeouts.ErrSlowClient), false},
	}
	for _, tc := range cases {
		var cc clientConn
		lingerUnlessTimeout(&cc, tc.err)
		if got := cc.linger.Load(); got != tc.linger {
			t.Errorf("%v: linger %v, want %v", tc.err, got, tc.linger)
		}
	}
}
