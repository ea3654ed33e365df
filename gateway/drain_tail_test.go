package gateway

import (
	"bytes"
	"io"
	"net"
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
	client, server, cc := rawClientConn(t, "write_timeout: 2s\n")

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

// rawClientConn is the server side of a loopback TCP pair as a gateway's client connection
// with its raw path (conn.go), on a gateway started with the server lines; client is the
// other end.
func rawClientConn(t *testing.T, server string) (client, serverSide net.Conn, cc *clientConn) {
	t.Helper()
	tg := startGateway(t, server, "")
	client, serverSide = testnet.Pair(t)
	cc = &clientConn{Conn: serverSide, ln: newListener(nil, tg.g), activeAt: time.Now()}
	cc.ex()
	cc.raw = socket.NewRawPath(serverSide, &cc.rawCount)
	if cc.raw == nil {
		t.Fatal("no raw path on a TCP socket")
	}
	cc.ln.open.Add(1)
	return client, serverSide, cc
}

// A response's end that comes in several writes once the response is complete (a compressed
// body's last chunk, then the end of the chunked framing: respStream.deferEnd) is joined into
// the one write the next read makes; a write that is not the response's end writes what waits
// first, in order.
func TestDeferredResponseEndJoinsWrites(t *testing.T) {
	client, serverSide, cc := rawClientConn(t, "")
	defer cc.Close()
	_ = serverSide.SetReadDeadline(time.Now().Add(5 * time.Second)) // a lost wake-up fails, not hangs
	write := func(s string) {
		t.Helper()
		if n, err := cc.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("write %q: %d %v", s, n, err)
		}
	}
	cc.deferResponseEnd()
	write("chunk|")
	cc.deferResponseEnd()
	write("end|")
	if !cc.hasPending.Load() || cc.rawCount != 0 || string(cc.raw.Pending) != "chunk|end|" {
		t.Fatalf("pending %v %q, written %d", cc.hasPending.Load(), cc.raw.Pending, cc.rawCount)
	}
	// The next request's read writes both, in one write.
	_, _ = client.Write([]byte("x"))
	buf := make([]byte, 16)
	if n, err := cc.Read(buf); err != nil || string(buf[:n]) != "x" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if cc.rawCount != int64(len("chunk|end|")) {
		t.Errorf("the read wrote %d bytes of the joined end", cc.rawCount)
	}
	// Not the response's end: what waits goes first.
	cc.deferResponseEnd()
	write("tail|")
	write("next|")
	if cc.hasPending.Load() {
		t.Error("a write that is not the response's end left bytes waiting")
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 0, 64)
	for string(got) != "chunk|end|tail|next|" {
		n, err := client.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("client read %q: %v", got, err)
		}
	}
}
