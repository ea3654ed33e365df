package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Response queue poisoning (SPEC 7): bytes an upstream sends that belong to no request of the
// gateway's must never become another client's answer. Each upstream here misbehaves on purpose
// and answers the request it was asked for normally on a fresh connection.

const poisonBody = "PWNED!"

// TestEarlyAnswerDoesNotPoison: client A posts a body that is itself a request to an upstream
// that answers before reading the body and then reads the body as a second request. The answer
// to that smuggled request must not reach client B, whatever the gap between them.
func TestEarlyAnswerDoesNotPoison(t *testing.T) {
	smuggled := "GET /g/poison HTTP/1.1\r\nHost: x\r\n\r\n"
	addr := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) {
		// As a server that pipelines does, answers are flushed once no request is buffered:
		// the early answer and the smuggled request's go out together, as an attacker would
		// send them, not a scheduler's whim apart (bytes arriving in the microseconds between
		// the lend-time peek and the next request are the one race SPEC 7's rule leaves,
		// docs/upstream-pools.md).
		bw := bufio.NewWriter(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			switch req.URL.Path {
			case "/g/early":
				answer(bw, "early") // the body stays unread: the next ReadRequest parses it
			case "/g/poison":
				answer(bw, poisonBody)
			default:
				_, _ = io.Copy(io.Discard, req.Body)
				answer(bw, "b:"+req.URL.Path)
			}
			if br.Buffered() == 0 {
				if bw.Flush() != nil {
					return
				}
			}
		}
	})
	for _, expect := range []string{"", "Expect: 100-continue\r\n"} {
		for _, gap := range []time.Duration{0, 15 * time.Millisecond, 40 * time.Millisecond} {
			name := fmt.Sprintf("gap=%s expect=%v", gap, expect != "")
			t.Run(name, func(t *testing.T) {
				gw := startGateway(t, "", upstreamRoute("/", addr, "max_upstream_conns: 1\n"))
				a := dialRaw(t, gw.addr)
				fmt.Fprintf(a, "POST /g/early HTTP/1.1\r\nHost: a\r\n%sContent-Length: %d\r\n\r\n", expect, len(smuggled))
				if expect != "" {
					br := bufio.NewReader(a)
					line, err := br.ReadString('\n')
					if err != nil || !strings.Contains(line, "100") {
						t.Fatalf("want 100 Continue, got %q %v", line, err)
					}
					if _, err := br.ReadString('\n'); err != nil { // the blank line after it
						t.Fatal(err)
					}
					io.WriteString(a, smuggled)
					resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
					if err != nil {
						t.Fatal(err)
					}
					body, _ := io.ReadAll(resp.Body)
					if string(body) != "early" {
						t.Fatalf("client A got %q, want the early answer", body)
					}
				} else {
					io.WriteString(a, smuggled)
					if resp := readRawResponse(t, a, "POST"); string(resp.body) != "early" {
						t.Fatalf("client A got %d %q, want the early answer", resp.StatusCode, resp.body)
					}
				}
				time.Sleep(gap)
				for i := 0; i < 3; i++ {
					resp := rawRequest(t, gw.addr, "GET /g/b HTTP/1.1\r\nHost: b\r\n\r\n")
					if resp.StatusCode != 200 || string(resp.body) != "b:/g/b" {
						t.Fatalf("client B request %d got %d %q: another client's answer", i, resp.StatusCode, resp.body)
					}
				}
			})
		}
	}
}

// TestBytesPastResponseDoNotPoison: an upstream that sends bytes nobody asked for (a body on a
// HEAD answer, bytes past a Content-Length, at once or a little later) has that connection
// closed; the next client on the route (one upstream connection) gets its own answer.
func TestBytesPastResponseDoNotPoison(t *testing.T) {
	stray := "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n" + poisonBody
	cases := []struct {
		name   string
		method string
		first  string // the misbehaving answer
		delay  time.Duration
	}{
		{"HEAD with a body, same write", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n" + stray, 0},
		{"HEAD with a body, later", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n", 5 * time.Millisecond},
		{"past Content-Length, same write", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" + stray, 0},
		{"past Content-Length, later", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 5 * time.Millisecond},
		{"204 with a body", "GET", "HTTP/1.1 204 No Content\r\n\r\n" + stray, 0},
		{"past the last chunk", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + stray, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) {
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.URL.Path == "/first" {
						io.WriteString(c, tc.first)
						if tc.delay > 0 {
							time.Sleep(tc.delay)
							io.WriteString(c, stray)
						}
						continue
					}
					answer(c, "second")
				}
			})
			gw := startGateway(t, "", upstreamRoute("/", addr, "max_upstream_conns: 1\n"))
			fc := dialRaw(t, gw.addr)
			io.WriteString(fc, tc.method+" /first HTTP/1.1\r\nHost: a\r\n\r\n")
			first := readRawResponse(t, fc, tc.method)
			if first.StatusCode != 200 && first.StatusCode != 204 {
				t.Fatalf("first request: %d", first.StatusCode)
			}
			for _, gap := range []time.Duration{15 * time.Millisecond, 40 * time.Millisecond} {
				time.Sleep(gap)
				resp := rawRequest(t, gw.addr, "GET /second HTTP/1.1\r\nHost: b\r\n\r\n")
				if resp.StatusCode != 200 || string(resp.body) != "second" {
					t.Fatalf("after %s the next client got %d %q: the stray bytes", gap, resp.StatusCode, resp.body)
				}
			}
		})
	}
}

// TestKeepAliveReusesConnection: a well-behaved upstream's connection carries every request of a
// sequence (the check that protects against stray bytes does not cost keep-alive).
func TestKeepAliveReusesConnection(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	gw := startGateway(t, "", upstreamRoute("/", up.addr, ""))
	c := dialRaw(t, gw.addr)
	for i := 0; i < 50; i++ {
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
		if resp := readRawResponse(t, c, "POST"); resp.StatusCode != 200 || string(resp.body) != "ok" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, resp.body)
		}
	}
	if n := up.conns.Load(); n != 1 {
		t.Errorf("upstream saw %d connections for 50 sequential requests, want 1", n)
	}
}

// TestIdleDeadlineDuringLongUpload: a reused connection that carries an upload longer than
// upstream_idle_timeout is not cut by the idle timeout (it applies only while the connection
// waits in the pool): the response is read under the header deadline armed after the body.
func TestIdleDeadlineDuringLongUpload(t *testing.T) {
	addr := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, req.Body)
			answer(c, fmt.Sprint(n))
		}
	})
	gw := startGateway(t, "upstream_idle_timeout: 1s\nstream_threshold_bytes: 16\n", upstreamRoute("/", addr, ""))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp := readRawResponse(t, c, "GET"); resp.StatusCode != 200 {
		t.Fatalf("warm-up: %d", resp.StatusCode)
	}
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 30000\r\n\r\n")
	for i := 0; i < 10; i++ { // 2 s in all, past the 1 s idle deadline of the reused connection
		c.Write(make([]byte, 3000))
		time.Sleep(200 * time.Millisecond)
	}
	resp := readRawResponse(t, c, "POST")
	if resp.StatusCode != 200 || string(resp.body) != "30000" {
		t.Fatalf("long upload on a reused connection: %d %q", resp.StatusCode, resp.body)
	}
}

// TestIdleConnectionsClosedAfterIdleTimeout: a pooled connection that waits longer than
// upstream_idle_timeout is closed by the pool (its sweep), without any further request.
func TestIdleConnectionsClosedAfterIdleTimeout(t *testing.T) {
	closed := make(chan struct{}, 1)
	addr := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				closed <- struct{}{}
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			answer(c, "ok")
		}
	})
	gw := startGateway(t, "upstream_idle_timeout: 1s\n", upstreamRoute("/", addr, ""))
	if resp := rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	start := time.Now()
	select {
	case <-closed:
		if d := time.Since(start); d < 900*time.Millisecond {
			t.Errorf("the idle connection was closed after %s, before upstream_idle_timeout", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the idle upstream connection was not closed after upstream_idle_timeout")
	}
}
