package testnet

import (
	"net"
	"net/http"
	"testing"
)

// Listen returns a TCP listener on 127.0.0.1:0, closed when the test ends (closing it earlier
// is harmless).
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// ServeHTTP serves srv on a listener of Listen until the test ends, when srv is closed, and
// returns the listener's address.
func ServeHTTP(t testing.TB, srv *http.Server) string {
	t.Helper()
	ln := Listen(t)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// Dial opens a TCP connection to addr, closed when the test ends (closing it earlier is
// harmless).
func Dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
