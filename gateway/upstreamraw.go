package gateway

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
)

// A small request (a head, and a body of at most upstreamHeadInline bytes) goes out on a plain
// TCP upstream connection in the same call that then waits for the answer: one write and one
// read system call per exchange, as nginx makes them.
//
// Why: Go's net.Conn.Read tries the socket before it waits for it. Right after the request was
// written the upstream has not answered yet, so that first read always fails with EAGAIN: a
// system call per request that an event loop, which waits before it reads, never makes
// (profile of the peer comparison: 4 reads per request where nginx makes 2 recvfrom). Reading
// through the socket's RawConn lets the wait come first, but only safely so: RawConn.Read
// forgets any readiness seen before it was called, so a response that arrived between a
// separate write and the wait would be waited for until the header timeout. Writing inside the
// same RawConn.Read call, before the wait, closes that window: every byte of the answer arrives
// after the write, hence after the wait began.
//
// Anything else (a TLS connection, a write the socket takes only in part, a streamed body)
// takes the ordinary path: the bytes left go through Write under the write window.

// rawPath is the socket of a plain TCP upstream connection, seen from below the net package.
type rawPath struct {
	rc      syscall.RawConn
	fn      func(fd uintptr) bool // readRaw, bound once per connection (no allocation per request)
	pending []byte                // the request, written by the first read (deferWrite)
	p       []byte                // the read's buffer
	n       int
	err     error
	partial bool // the socket took only part of pending: the rest goes through Write
	written *int64
	// claim, when set (the client side), must be cleared by the first call before pending is
	// written: a Close on another goroutine that cleared it first wrote the bytes itself.
	claim   *atomic.Bool
	claimed bool
	// eagain counts reads that found nothing after the wait (spurious wake-ups), for tests.
	eagain int
}

// newRawPath returns the raw path of c, or nil when c is not a plain socket.
func newRawPath(c net.Conn, written *int64) *rawPath {
	_, rc, ok := socketOf(c) // only the kernel's socket itself
	if !ok {
		return nil
	}
	r := &rawPath{rc: rc, written: written}
	r.fn = r.readRaw
	return r
}

// deferWrite keeps b (which stays valid until the response head was read) to be written by the
// next read. It reports false when the connection has no raw path.
func (c *upstreamConn) deferWrite(b []byte) bool {
	if c.raw == nil || len(b) == 0 {
		return false
	}
	c.raw.pending = b
	return true
}

// readWithPending writes the deferred request, waits for the socket and reads into p.
func (c *upstreamConn) readWithPending(p []byte) (int, error) {
	r := c.raw
	err := r.read(p, nil)
	if err != nil {
		// The wait failed: the header deadline passed (or abort moved it), or the socket closed.
		r.pending = nil
		return 0, err
	}
	if r.partial {
		// The socket's buffer took part of the request: the rest under the write window, then
		// the ordinary read.
		rest := r.pending
		r.pending = nil
		if _, err := c.Write(rest); err != nil {
			return 0, err
		}
		return c.Conn.Read(p)
	}
	r.pending = nil
	return r.n, r.err
}

// read runs one RawConn.Read: pending written first (claimed through claim when it is not
// nil), then p read; the result is in n, err and partial. It returns the wait's own error.
func (r *rawPath) read(p []byte, claim *atomic.Bool) error {
	r.p, r.n, r.err, r.partial, r.claim, r.claimed = p, 0, nil, false, claim, false
	err := r.rc.Read(r.fn)
	r.p, r.claim = nil, nil
	return err
}

// readRaw is the RawConn.Read callback: the first call writes the pending request and asks to
// wait; the next ones read, asking to wait again on EAGAIN.
func (r *rawPath) readRaw(fd uintptr) bool {
	if r.claim != nil && !r.claimed {
		if !r.claim.CompareAndSwap(true, false) {
			r.pending = nil // a Close took the bytes
		}
		r.claimed = r.pending != nil
		r.claim = nil
	}
	if len(r.pending) > 0 {
		n, again, err := nbWriteStep(fd, r.pending)
		*r.written += int64(n)
		r.pending = r.pending[n:]
		switch {
		case err != nil:
			r.pending = nil
			r.err = &net.OpError{Op: "write", Net: "tcp", Err: err}
			return true
		case again, len(r.pending) > 0:
			r.partial = true
			return true
		}
		return false // written whole: wait for the answer
	}
	if r.partial {
		return true
	}
	n, again, err := nbReadStep(fd, r.p)
	switch {
	case again:
		r.eagain++
		return false
	case err == io.EOF:
		r.err = err
	case err != nil:
		r.err = &net.OpError{Op: "read", Net: "tcp", Err: err}
	}
	r.n = n
	return true
}
