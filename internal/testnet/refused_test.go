package testnet

import (
	"net"
	"testing"
)

func TestRefusedAddrRefusesAndHolds(t *testing.T) {
	a := RefusedAddr(t)
	if c, err := net.Dial("tcp", a); err == nil {
		c.Close()
		t.Fatal("dial answered")
	}
	if ln, err := net.Listen("tcp", a); err == nil {
		ln.Close()
		t.Fatal("another listener could take the port")
	}
}
