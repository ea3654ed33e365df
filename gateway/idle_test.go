package gateway

import (
	"net"
	"testing"
	"time"

	"toron/internal/testnet"
)

// An idle keep-alive connection holds none of Toron's per-request state (SPEC 22): its
// exchange went back to the pool when the response ended, and the copy of its response's last
// write was written by the read that waits for the next request (socket.TestWriteReadReleasesBeforeWait
// shows that buffer is given back before the wait).
// The next request on the connection takes an exchange again and is served as usual.
func TestIdleConnectionHoldsNoRequestState(t *testing.T) {
	tg, _ := startProxied(t, "", "/api", nil)
	c := dialRaw(t, tg.addr)
	for i := 0; i < 3; i++ {
		if _, err := c.Write([]byte("GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if r := readRawResponse(t, c, "GET"); r.StatusCode != 200 {
			t.Fatalf("request %d: status %d, want 200", i, r.StatusCode)
		}
		var cc *clientConn
		idle := testnet.WaitUntil(5*time.Second, func() bool {
			cc = onlyConn(tg.g)
			return cc != nil && cc.x.Load() == nil && !cc.hasPending.Load()
		})
		if !idle {
			if cc == nil {
				t.Fatalf("request %d: the gateway holds no client connection", i)
			}
			t.Fatalf("request %d: idle connection still holds its request state: exchange %v, pending %v",
				i, cc.x.Load() != nil, cc.hasPending.Load())
		}
	}
}

// onlyConn returns the gateway's one open client connection, or nil.
func onlyConn(g *Gateway) *clientConn {
	l := g.ln.Load()
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) != 1 {
		return nil
	}
	for c := range l.conns {
		return c
	}
	return nil
}

var _ net.Conn = (*clientConn)(nil)
