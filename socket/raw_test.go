package socket

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// rawPair returns a client *net.TCPConn with its raw path and the server's side of it.
func rawPair(t *testing.T) (*net.TCPConn, *RawPath, *int64, net.Conn) {
	t.Helper()
	c, s := testnet.Pair(t)
	written := new(int64)
	r := NewRawPath(c, written)
	if r == nil {
		t.Fatal("no raw path on a *net.TCPConn")
	}
	return c.(*net.TCPConn), r, written, s
}

// readRawOnce runs one write-then-wait read of pending into p.
func readRawOnce(r *RawPath, pending, p []byte) (int, error) {
	r.Pending = pending
	if err := r.WriteRead(p, nil); err != nil {
		return 0, err
	}
	return r.N, r.Err
}

// The request is written, the wait comes before the read: an answer that comes 50 ms later is
// read by a single read, not found missing by one first (the EAGAIN read this path saves).
func TestRawPathWritesThenWaitsThenReads(t *testing.T) {
	c, r, written, s := rawPair(t)
	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 64)
		n, _ := s.Read(buf)
		got <- buf[:n]
		time.Sleep(50 * time.Millisecond)
		_, _ = s.Write([]byte("answer"))
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	p := make([]byte, 64)
	n, err := readRawOnce(r, []byte("GET / HTTP/1.1\r\n\r\n"), p)
	if err != nil || string(p[:n]) != "answer" {
		t.Fatalf("read %q, %v; want answer", p[:n], err)
	}
	if req := <-got; string(req) != "GET / HTTP/1.1\r\n\r\n" {
		t.Fatalf("upstream got %q", req)
	}
	if *written != int64(len("GET / HTTP/1.1\r\n\r\n")) {
		t.Fatalf("written = %d", *written)
	}
	if r.eagain > 0 { // the wait came first: the one read after it finds the answer
		t.Fatalf("%d reads found nothing: the path read before it waited", r.eagain)
	}
}

// On the client side (a claim given) the next request may be in the socket before the response
// end is written: a pipelining client's, or a client's FIN. Its readiness was consumed by the
// poller before the raw read reset it (the 20 ms idle lets the poller take the edge), so the path
// must read at once after the write instead of waiting for an edge that never comes.
func TestRawPathClientSideReadsWhatCameBefore(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(s net.Conn)
		want string
	}{
		{"pipelined request", func(s net.Conn) { _, _ = s.Write([]byte("GET /2 HTTP/1.1\r\n\r\n")) }, "GET /2 HTTP/1.1\r\n\r\n"},
		{"half-close", func(s net.Conn) { _ = s.(*net.TCPConn).CloseWrite() }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, r, _, s := rawPair(t)
			tc.send(s)
			time.Sleep(20 * time.Millisecond)
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			var claim atomic.Bool
			claim.Store(true)
			r.Pending = []byte("end of the response")
			p := make([]byte, 64)
			if err := r.WriteRead(p, &claim); err != nil {
				t.Fatalf("the read waited for an edge that never came: %v", err)
			}
			if string(p[:r.N]) != tc.want || (tc.want == "" && r.Err != io.EOF) {
				t.Fatalf("read %q, %v; want %q", p[:r.N], r.Err, tc.want)
			}
		})
	}
}

// A request larger than the socket takes at once is left partly to the caller's Write.
func TestRawPathPartialWriteIsHandedBack(t *testing.T) {
	c, r, written, _ := rawPair(t) // the server side never reads
	_ = c.SetWriteBuffer(4 << 10)
	big := bytes.Repeat([]byte{'x'}, 16<<20)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := readRawOnce(r, big, make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	if !r.Partial || *written <= 0 || *written >= int64(len(big)) || len(r.Pending) != len(big)-int(*written) {
		t.Fatalf("partial %v, written %d of %d, %d left", r.Partial, *written, len(big), len(r.Pending))
	}
}

// An upstream that closes answers the write with a reset or an end of file, at once; one
// that never answers ends at the read deadline.
func TestRawPathPeerClosedAndDeadline(t *testing.T) {
	c, r, _, s := rawPair(t)
	_ = s.(*net.TCPConn).SetLinger(0)
	_ = s.Close()
	time.Sleep(20 * time.Millisecond)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err := readRawOnce(r, []byte("GET / HTTP/1.1\r\n\r\n"), make([]byte, 64))
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("closed peer: err %v after %v", err, time.Since(start))
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && err != io.EOF {
		t.Fatalf("closed peer: %v is not a reset", err)
	}

	c2, r2, _, _ := rawPair(t) // the server reads nothing and answers nothing
	_ = c2.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err = readRawOnce(r2, []byte("GET / HTTP/1.1\r\n\r\n"), make([]byte, 64))
	if !IsTimeout(err) {
		t.Fatalf("silent peer: %v, want the read deadline", err)
	}
}

// TestPeekerLeft: Left sees a FIN behind unread bytes (a pipelined request, a stray CRLF), where
// Peek sees only the bytes; bytes alone, or nothing, are not leaving.
func TestPeekerLeft(t *testing.T) {
	client, server := testnet.Pair(t)
	p := NewPeeker(server)
	if p.Left() || p.Peek() != PeekNothing {
		t.Fatal("an idle open connection counts as left")
	}
	if _, err := client.Write([]byte("\r\n")); err != nil {
		t.Fatal(err)
	}
	if !testnet.WaitUntil(5*time.Second, func() bool { return p.Peek() == PeekData }) {
		t.Fatal("the bytes never arrived")
	}
	if p.Left() {
		t.Fatal("bytes waiting on an open connection count as left")
	}
	_ = client.Close()
	if !testnet.WaitUntil(5*time.Second, p.Left) {
		t.Fatal("a FIN behind unread bytes is not seen as leaving")
	}
	if p.Peek() != PeekData {
		t.Errorf("Peek: %v, want PeekData (it cannot see past the bytes)", p.Peek())
	}
}

// The owner of a claimed Pending gets it back (Written) once it was written whole, before the
// wait for the answer: an idle keep-alive connection, which waits there for its next request,
// holds no copy of its last response (SPEC 22). The answer is still read by the same call.
func TestWriteReadReleasesBeforeWait(t *testing.T) {
	c, r, _, s := rawPair(t)
	var claim atomic.Bool
	claim.Store(true)
	released := make(chan struct{})
	r.Written = func() { close(released) }
	r.Pending = []byte("last bytes of a response")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	p := make([]byte, 64)
	go func() { done <- r.WriteRead(p, &claim) }()
	buf := make([]byte, 64)
	n, _ := s.Read(buf)
	if string(buf[:n]) != "last bytes of a response" {
		t.Fatalf("peer got %q", buf[:n])
	}
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("the buffer was not given back while the read waits")
	}
	select {
	case err := <-done:
		t.Fatalf("WriteRead returned before the next request came: %v", err)
	default:
	}
	_, _ = s.Write([]byte("GET"))
	if err := <-done; err != nil || r.Err != nil || string(p[:r.N]) != "GET" {
		t.Fatalf("read %q, %v, %v; want GET", p[:r.N], err, r.Err)
	}
	if !r.Claimed || !r.Released || r.Pending != nil {
		t.Fatalf("claimed %v, released %v, pending %q", r.Claimed, r.Released, r.Pending)
	}
}
