package gateway

import (
	"bytes"
	"io"
	"testing"
	"time"

	"toron/internal/testnet"
	"toron/socket"
)

// TestCloseWithResponseEndWaitingNeverBlocks (SPEC 9): the end of an answered response that
// waits for the next read (deferResponseEnd, plain TCP) is still owed to the client when a
// shutdown closes the connection as idle. fasthttp does that close while holding the lock that
// every connection's start and end take, so Close must not write there: it returns at once, and
// the bytes still reach a client that is slow to read, before the socket closes. Nothing of the
// answered response is lost.
func TestCloseWithResponseEndWaitingNeverBlocks(t *testing.T) {
	tg := startGateway(t, "write_timeout: 2s\n", "")
	client, server := testnet.Pair(t)
	cc := &clientConn{Conn: server, ln: newListener(nil, tg.g), activeAt: time.Now()}
	cc.ex()
	cc.raw = socket.NewRawPath(server, &cc.rawCount)
	if cc.raw == nil {
		t.Fatal("no raw path on a TCP socket")
	}
	cc.ln.open.Add(1)

	// The client reads nothing for now: fill the socket's buffers, as a response body does.
	var sent bytes.Buffer
	chunk := bytes.Repeat([]byte("b"), 64<<10)
	for {
		_ = server.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := server.Write(chunk)
		sent.Write(chunk[:n])
		if err != nil {
			break
		}
	}
	_ = server.SetWriteDeadline(time.Time{})
	// The response's last write waits for the next read.
	tail := bytes.Repeat([]byte("TAIL"), 2<<10)
	cc.deferResponseEnd()
	if n, err := cc.Write(tail); err != nil || n != len(tail) || !cc.hasPending.Load() {
		t.Fatalf("deferred write: %d %v, pending %v", n, err, cc.hasPending.Load())
	}
	sent.Write(tail)

	// The shutdown closes the connection as idle, from its own goroutine.
	start := time.Now()
	done := make(chan struct{})
	go func() {
		_ = cc.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still blocked after 5s")
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("Close took %s with a response end waiting for a slow client: it blocks the shutdown and every other connection", d)
	}
	// The client now reads: it gets every byte of the response, then the close.
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(client)
	if err != nil {
		t.Errorf("reading the response: %v", err)
	}
	if !bytes.Equal(got, sent.Bytes()) {
		t.Errorf("the client read %d bytes of %d: the response's end was lost", len(got), sent.Len())
	}
	if !testnet.WaitUntil(5*time.Second, func() bool { return cc.ln.open.Load() == 0 }) {
		t.Error("the connection was never forgotten by the listener")
	}
}
