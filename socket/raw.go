// This file owns RawPath: the write-then-wait read of a plain TCP socket, for a small upstream
// request (package upstream) and for the end of a client's response (the gateway).
package socket

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
)

// A small request (a head, and a small body) goes out on a plain
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

// RawPath is the socket of a plain TCP connection, seen from below the net package: the bytes
// in Pending are written by the next WriteRead, in the same call that then waits for and reads
// the answer.
type RawPath struct {
	rc syscall.RawConn
	fn func(fd uintptr) bool // readRaw, bound once per connection (no allocation per request)
	// Pending is written by the next WriteRead before it waits (what is left of it after one).
	Pending []byte
	p       []byte // the read's buffer
	// N and Err are the result of the last WriteRead's read.
	N   int
	Err error
	// Partial says the socket took only part of Pending: the rest goes through an ordinary
	// write, then an ordinary read.
	Partial bool
	written *int64
	// claim, when set (the client side), must be cleared by the first call before pending is
	// written: a Close on another goroutine that cleared it first wrote the bytes itself.
	claim *atomic.Bool
	// Claimed says the last WriteRead cleared claim and so owned Pending.
	Claimed bool
	// Written, when set, is called once Pending was written whole, before the wait: the
	// owner of Pending's buffer may take it back then instead of holding it through the wait
	// (an idle keep-alive connection waits there for its next request: SPEC 22). Released
	// says it was called during the last WriteRead.
	Written  func()
	Released bool
	// readAfter says a read follows the write at once, without a wait first (the client side:
	// WriteRead with a claim).
	readAfter bool
	// eagain counts reads that found nothing after the wait (spurious wake-ups), for tests.
	eagain int
}

// NewRawPath returns the raw path of c, or nil when c is not a plain socket; written counts
// the bytes of Pending the socket took.
func NewRawPath(c net.Conn, written *int64) *RawPath {
	_, rc, ok := Of(c) // only the kernel's socket itself
	if !ok {
		return nil
	}
	r := &RawPath{rc: rc, written: written}
	r.fn = r.readRaw
	return r
}

// WriteRead runs one RawConn.Read: Pending written first (claimed through claim when it is not
// nil), then p read; the result is in N, Err and Partial. It returns the wait's own error.
func (r *RawPath) WriteRead(p []byte, claim *atomic.Bool) error {
	r.p, r.N, r.Err, r.Partial, r.claim, r.Claimed, r.Released = p, 0, nil, false, claim, false, false
	r.readAfter = claim != nil
	err := r.rc.Read(r.fn)
	r.p, r.claim = nil, nil
	return err
}

// readRaw is the RawConn.Read callback: the first call writes the pending request and asks to
// wait; the next ones read, asking to wait again on EAGAIN.
func (r *RawPath) readRaw(fd uintptr) bool {
	if r.claim != nil && !r.Claimed {
		if !r.claim.CompareAndSwap(true, false) {
			r.Pending = nil // a Close took the bytes
		}
		r.Claimed = r.Pending != nil
		r.claim = nil
	}
	if len(r.Pending) > 0 {
		n, again, err := WriteStep(fd, r.Pending)
		*r.written += int64(n)
		r.Pending = r.Pending[n:]
		switch {
		case err != nil:
			r.Pending = nil
			r.Err = &net.OpError{Op: "write", Net: "tcp", Err: err}
			return true
		case again, len(r.Pending) > 0:
			r.Partial = true
			return true
		}
		if r.Claimed && r.Written != nil {
			r.Pending = nil
			r.Released = true
			r.Written()
		}
		if !r.readAfter {
			// Written whole: wait for the answer, which cannot have come before its request.
			return false
		}
		// The client side: the next request (a pipelining client's) or the client's FIN may
		// be in the socket already, its readiness consumed before this RawConn.Read reset it,
		// so waiting first could wait for an edge that never comes; read now, as any read does.
	}
	if r.Partial {
		return true
	}
	n, again, err := ReadStep(fd, r.p)
	switch {
	case again:
		r.eagain++
		return false
	case err == io.EOF:
		r.Err = err
	case err != nil:
		r.Err = &net.OpError{Op: "read", Net: "tcp", Err: err}
	}
	r.N = n
	return true
}
