package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// The upload scenario's second reference: a TCP relay that parses nothing. Each accepted
// connection gets its own upstream connection, and the bytes are copied both ways through one
// 64 KiB buffer per direction, the budget SPEC 6 gives Toron. Its ratio is what moving the
// bytes alone costs on the machine and harness of the run (a splice(2) relay was measured
// slower here, see BENCHMARKS.md): a proxy's ratio near the relay's leaves nothing to gain in
// its own code.

// relayBufferSize is the copy buffer of each direction.
const relayBufferSize = 64 << 10

// serveTCPRelay is the tcp-relay helper scenario: it listens on -listen and relays every
// connection to -upstream until SIGINT, SIGTERM or -lifetime.
func serveTCPRelay(o options) error {
	if o.upstream == "" {
		return fmt.Errorf("loadtest: tcp-relay needs -upstream host:port")
	}
	ln, err := o.listenHelper("tcp relay")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{upstream: o.upstream, ctx: ctx, conns: map[net.Conn]struct{}{}}
	served := make(chan struct{})
	go func() {
		defer close(served)
		r.serve(ln)
	}()
	fmt.Printf("loadtest tcp relay on %s -> %s (pid %d)\n", ln.Addr(), o.upstream, os.Getpid())
	_ = waitStop(nil, o.lifetime) // a signal or the lifetime: nothing else ends it
	ln.Close()
	<-served
	cancel()
	r.close()
	return nil
}

// relay owns every connection it opened or accepted, so that close ends them all and waits for
// their goroutines.
type relay struct {
	upstream string
	ctx      context.Context // cancelled at shutdown: ends dials in progress
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
}

// serve accepts until the listener is closed. Other accept errors (out of file descriptors
// under load) are retried after a pause, as net/http does, rather than ending a benchmark.
func (r *relay) serve(ln net.Listener) {
	pause := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if r.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(pause)
			pause = min(2*pause, time.Second)
			continue
		}
		pause = 5 * time.Millisecond
		if !r.track(c) {
			c.Close()
			continue
		}
		r.wg.Add(1)
		go r.pipe(c)
	}
}

// pipe relays one client connection. The upload direction runs on this goroutine, the download
// direction on a second one; a half-close is passed on, and the pair ends when both copies did.
func (r *relay) pipe(client net.Conn) {
	defer r.wg.Done()
	defer r.forget(client)
	var d net.Dialer
	up, err := d.DialContext(r.ctx, "tcp", r.upstream)
	if err != nil || !r.track(up) {
		if up != nil {
			up.Close()
		}
		return
	}
	defer r.forget(up)
	down := make(chan struct{})
	go func() {
		defer close(down)
		copyPlain(client, up)
		closeWrite(client)
	}()
	copyPlain(up, client)
	closeWrite(up)
	<-down
}

// copyPlain copies through one 64 KiB buffer with read and write: the wrappers hide
// net.TCPConn's ReadFrom, which would splice instead.
func copyPlain(dst io.Writer, src io.Reader) {
	buf := make([]byte, relayBufferSize)
	io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
		return
	}
	c.Close()
}

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) forget(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *relay) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// close ends every connection and waits for the relay's goroutines.
func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// startTCPRelay starts this program as the tcp-relay helper in front of upstream.
func startTCPRelay(dir, upstream string) (*process, error) {
	return startHelper(dir, "tcp-relay", "-upstream", upstream)
}
