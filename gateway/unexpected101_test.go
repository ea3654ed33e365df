package gateway

import (
	"bufio"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestUnexpected101Is502 (RFC 9110 15.2.2: a server sends 101 only to a request that asked to
// upgrade): an upstream that answers 101 to a plain request gets the client a 502, and its
// connection is closed, never pooled (what follows on it is another protocol).
func TestUnexpected101Is502(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	closed := make(chan struct{}, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					if _, err := readHead(br); err != nil {
						closed <- struct{}{}
						return
					}
					if _, err := c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	gw := startGateway(t, "", upstreamRoute("/api", ln.Addr().String(), ""))
	for i := 0; i < 2; i++ {
		rr := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: example.test\r\n\r\n")
		if rr.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: status %d, want 502", i, rr.StatusCode)
		}
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d: the upstream connection that answered 101 is still open", i)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("the upstream saw %d connections for 2 requests, want 2 (never reused)", n)
	}
}
