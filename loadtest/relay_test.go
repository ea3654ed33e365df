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

func TestTCPRelayForwardsUploads(t *testing.T) {
	up := startUpstream(t)
	addr, done := startHelperForTest(t, "the tcp relay", serveTCPRelay, up.Addr(), 2*time.Second)
	for _, chunked := range []bool{false, true} {
		rs := Uploads(UploadSpec{Name: "relay", URL: "http://" + addr + "/legacy/upload", N: 2, Size: 2<<20 + 1, Chunked: chunked, Verify: true, Timeout: 10 * time.Second})
		if s := Summarize("", rs); s.OK != 2 {
			t.Errorf("chunked=%v: %d of 2 uploads through the tcp relay arrived byte-exact (%s)", chunked, s.OK, s.ErrorsText())
		}
	}
	waitRelay(t, done)
	// Once it ended, it no longer listens.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the tcp relay still accepts connections after its lifetime")
	}
}

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
	waitRelay(t, done)
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(open); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a connection left open was not closed by the relay's shutdown: %v", err)
	}
}

// waitRelay waits for the relay to end, failing the test if it hangs.
func waitRelay(t *testing.T, done <-chan error) {
	t.Helper()
	if err := testnet.Ended(t, "the tcp relay", 10*time.Second, done); err != nil {
		t.Errorf("the tcp relay ended with %v", err)
	}
}
