package gateway

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
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
	c, s := tcpPair(t)
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
	if !waitUntil(5*time.Second, func() bool {
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
	if !waitUntil(5*time.Second, func() bool {
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
