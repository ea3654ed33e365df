package gateway

import (
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"toron/socket"
)

// blackholeAddr returns a loopback address whose listener never accepts and whose accept queue
// is full: the kernel drops further SYNs, so a dial to it times out (a black-holed upstream),
// without relying on a connect_timeout too small to be configured.
func blackholeAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 16 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			if socket.IsTimeout(err) {
				return addr
			}
			t.Fatalf("filling the accept queue of %s: %v", addr, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatalf("the accept queue of %s never filled", addr)
	return ""
}
