package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestKeepAliveRequestsCarryDeadlines: requests that follow each other on one keep-alive
// connection do not re-arm the client socket's deadlines per request (issue 15): the idle
// deadline, the next header deadline and the write window's deadline are carried. Before,
// each request set three (header, write, idle): 600 for these 200 requests.
func TestKeepAliveRequestsCarryDeadlines(t *testing.T) {
	up := startFastUpstream(t)
	gw := startGateway(t, "", upstreamRoute("/api", up, ""))
	hc := &fasthttp.HostClient{Addr: gw.addr, MaxConns: 1}
	defer hc.CloseIdleConnections()
	const requests = 200
	for i := range requests {
		status, _, err := hc.Get(nil, "http://"+gw.addr+"/api/users")
		if err != nil || status != 200 {
			t.Fatalf("request %d: %d %v", i, status, err)
		}
	}
	ln := gw.g.ln.Load()
	ln.mu.Lock()
	var cc *clientConn
	for c := range ln.conns {
		cc = c
	}
	n := len(ln.conns)
	ln.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d client connections, want 1", n)
	}
	// The connection's goroutine owns its counters: read them once it closed (forget, under
	// the listener's mutex, orders its writes before this goroutine's reads).
	hc.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln.mu.Lock()
		_, open := ln.conns[cc]
		ln.mu.Unlock()
		if !open {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("client connection not closed on the gateway side")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sets := cc.deadlineSets + cc.readWin.Rearms + cc.writeWin.Rearms
	t.Logf("%d requests: %d deadline sets (%d set, %d read re-arms, %d write re-arms)", requests, sets, cc.deadlineSets, cc.readWin.Rearms, cc.writeWin.Rearms)
	// Re-armed once per tolerance (250 ms for the 5 s defaults) of wall time at most, however
	// slow the machine: 200 requests under -race take well under 10 s.
	if sets > 2+2*10/0.25 {
		t.Errorf("%d deadline sets for %d keep-alive requests; want them carried", sets, requests)
	}
	if sets >= requests {
		t.Errorf("%d deadline sets for %d keep-alive requests: one or more per request", sets, requests)
	}
}

// TestCarriedWriteDeadlineShrinks: a write deadline carried from an elevated route's long
// window (30 s) is pulled in when the same keep-alive connection's next request is on a route
// with a 1 s window, so a client that stops reading that response is cut within a few
// seconds, not after the 30 s of the previous request's window.
func TestCarriedWriteDeadlineShrinks(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, bigHandler)
	gw := startGateway(t, "write_timeout: 1s\n", upstreamRoute("/legacy", up.addr, "write_timeout: 30s")+upstreamRoute("/", up.addr, ""))
	c := dialRaw(t, gw.addr)
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "GET /legacy/big?size=1000 HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != 1000 || resp.StatusCode != 200 {
		t.Fatalf("first response: %d, %d bytes, %v", resp.StatusCode, n, err)
	}
	resp.Body.Close()

	const size = 64 << 20
	fmt.Fprintf(c, "GET /big?size=%d HTTP/1.1\r\nHost: a\r\n\r\n", size)
	// Not a byte read for 6 s: with the 1 s window the gateway gives up within about two.
	time.Sleep(6 * time.Second)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := io.Copy(io.Discard, br)
	if n >= size {
		t.Fatalf("a reader that stopped for 6 s got the whole body (%d bytes, %v): the 30 s deadline was carried", n, err)
	}
}
