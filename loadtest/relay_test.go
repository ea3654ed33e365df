package main

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// TestTCPRelayHalfCloseAndShutdown: a half-close travels through the relay (the upstream sees
// EOF and its answer still comes back), and at the end of its lifetime the relay closes the
// connections still open and returns.
func TestTCPRelayHalfCloseAndShutdown(t *testing.T) {
	// An upstream that answers everything it read, once the client half-closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, ln, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		c.Write(b)
	})
	addr, done := startHelperForTest(t, "the tcp relay", serveTCPRelay, ln.Addr().String(), 1500*time.Millisecond)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "half-closed")
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err != nil || string(b) != "half-closed" {
		t.Errorf("after a half-close got %q, %v; want the echo and EOF", b, err)
	}

	// A connection left open is closed by the relay at the end of its lifetime.
	open, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	io.WriteString(open, "still here")
	waitHelper(t, "the tcp relay", done)
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(open); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a connection left open was not closed by the relay's shutdown: %v", err)
	}
}
