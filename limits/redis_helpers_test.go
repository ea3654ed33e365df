package limits

import (
	"net"
	"testing"
)

// The global rate-limit tests run real redis-server processes (internal/redistest); the one
// stand-in is silentRedis, a Redis that hangs.

// silentRedis is a TCP listener that accepts and reads but never writes: a Redis that hangs.
type silentRedis struct {
	ln   net.Listener
	Addr string
	done chan struct{}
}

func startSilentRedis(t testing.TB) *silentRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentRedis{ln: ln, Addr: ln.Addr().String(), done: make(chan struct{})}
	conns := make(chan net.Conn, 64)
	go func() {
		defer close(s.done)
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			conns <- c
		}
	}()
	readers := make(chan struct{})
	go func() {
		defer close(readers)
		for c := range conns {
			go func(c net.Conn) {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-s.done // closes every accepted connection, which ends their readers
		close(conns)
		<-readers
	})
	return s
}
