package gateway

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

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
