package socket

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// onFD runs f on c's socket descriptor, outside any wait (RawConn.Control).
func onFD(t *testing.T, c net.Conn, f func(fd uintptr)) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(f); err != nil {
		t.Fatal(err)
	}
}

// The raw calls on a real socket: nothing waiting is EAGAIN at once (the socket is
// non-blocking, so none of them can block), bytes are peeked without being consumed, then read,
// and a closed peer is a 0-byte read and peek.
func TestNonBlockingCalls(t *testing.T) {
	c, s := testnet.Pair(t)
	buf := make([]byte, 16)
	var n int
	var err error
	onFD(t, c, func(fd uintptr) { n, err = nbRead(fd, buf) })
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("read with nothing waiting: %d, %v; want EAGAIN", n, err)
	}
	onFD(t, c, func(fd uintptr) { n, err = nbPeek(fd, buf[:1]) })
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("peek with nothing waiting: %d, %v; want EAGAIN", n, err)
	}

	onFD(t, c, func(fd uintptr) { n, err = nbWrite(fd, []byte("ping")) })
	if n != 4 || err != nil {
		t.Fatalf("write: %d, %v", n, err)
	}
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 4)
	if _, err := s.Read(got); err != nil || string(got) != "ping" {
		t.Fatalf("peer read %q, %v", got, err)
	}

	if _, err := s.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if !testnet.WaitUntil(5*time.Second, func() bool {
		onFD(t, c, func(fd uintptr) { n, err = nbPeek(fd, buf[:1]) })
		return n == 1
	}) {
		t.Fatalf("peek: %d, %v; the peer's bytes never showed", n, err)
	}
	if buf[0] != 'p' || err != nil {
		t.Fatalf("peek: %q, %v", buf[:n], err)
	}
	onFD(t, c, func(fd uintptr) { n, err = nbRead(fd, buf) })
	if string(buf[:n]) != "pong" || err != nil {
		t.Fatalf("read after the peek: %q, %v; want the peeked bytes again", buf[:n], err)
	}

	_ = s.Close()
	if !testnet.WaitUntil(5*time.Second, func() bool {
		onFD(t, c, func(fd uintptr) { n, err = nbPeek(fd, buf[:1]) })
		return err == nil && n == 0
	}) {
		t.Fatalf("peek after the peer closed: %d, %v; want 0, nil", n, err)
	}
	onFD(t, c, func(fd uintptr) { n, err = nbRead(fd, buf) })
	if n != 0 || err != nil {
		t.Fatalf("read after the peer closed: %d, %v; want 0, nil (end of stream)", n, err)
	}
}

// Conn keeps net.TCPConn's semantics: a read waits for bytes and ends at the read deadline
// with a timeout *net.OpError; a write larger than the socket buffers waits until the peer
// reads, and one the peer never reads ends at the write deadline with the bytes the socket
// took; the end of the stream is io.EOF.
func TestNonBlockingConn(t *testing.T) {
	c, s := testnet.Pair(t)
	nc, ok := NonBlocking(c).(*Conn)
	if !ok {
		t.Fatal("a *net.TCPConn did not become an Conn")
	}

	go func() {
		time.Sleep(30 * time.Millisecond)
		_, _ = s.Write([]byte("late"))
	}()
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, err := nc.Read(buf)
	if string(buf[:n]) != "late" || err != nil {
		t.Fatalf("read %q, %v; want late", buf[:n], err)
	}

	_ = nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	n, err = nc.Read(buf)
	var oe *net.OpError
	if n != 0 || !errors.As(err, &oe) || oe.Op != "read" || !oe.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %d, %v; want a read timeout", n, err)
	}

	big := make([]byte, 16<<20) // far more than both socket buffers hold
	got := make(chan int64, 1)
	go func() {
		n, _ := io.CopyN(io.Discard, s, int64(len(big)))
		got <- n
	}()
	_ = nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if n, err := nc.Write(big); n != len(big) || err != nil {
		t.Fatalf("write: %d, %v; want all %d bytes", n, err, len(big))
	}
	if n := <-got; n != int64(len(big)) {
		t.Fatalf("peer read %d bytes", n)
	}

	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err = nc.Write(big) // nobody reads now
	if n <= 0 || n >= len(big) || !errors.As(err, &oe) || oe.Op != "write" || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write nobody reads: %d, %v; want part of it and a write timeout", n, err)
	}

	// A peer that closes with nothing unread (the one above would reset): the end of stream.
	c2, s2 := testnet.Pair(t)
	nc2 := NonBlocking(c2)
	_ = s2.Close()
	_ = nc2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := nc2.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v; want io.EOF", n, err)
	}
}
