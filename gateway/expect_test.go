package gateway

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

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
