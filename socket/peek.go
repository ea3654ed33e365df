// This file owns the liveness peek: a look at an idle socket, without blocking or consuming,
// for a client watched while its upstream works (the gateway) and for an idle upstream
// connection about to be lent (package upstream).
package socket

import (
	"net"
	"syscall"
	"unsafe"
)

// PeekState is what a non-blocking peek at an idle socket found.
type PeekState uint8

// What a peek finds.
const (
	PeekNothing PeekState = iota // no bytes, connection open
	PeekData                     // bytes are waiting
	PeekClosed                   // FIN or an error: the peer is gone
)

// Peeker looks at a connection without blocking, consuming or taking the read lock. It uses
// RawConn.Control, not RawConn.Read, because Read checks the read deadline first, and a deadline
// that passed while nobody was reading (the client's, while the upstream works) says nothing
// about the peer. A Peeker is reused for every peek at its connection: no allocation per peek.
type Peeker struct {
	rc     syscall.RawConn
	fn     func(fd uintptr)
	leftFn func(fd uintptr)
	buf    [1]byte
	state  PeekState
	left   bool
}

// NewPeeker returns a Peeker of c; a net.Conn is looked at below its wrappers (Below).
func NewPeeker(c any) *Peeker {
	p := &Peeker{}
	if nc, ok := c.(net.Conn); ok {
		c = Below(nc) // below TLS: the kernel's view of the peer
	}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			p.rc = rc
		}
	}
	p.fn, p.leftFn = p.control, p.controlLeft
	return p
}

// poll(2) events (Linux): POLLRDHUP is the peer's FIN, reported whatever bytes wait before it.
const (
	pollErr   = 0x8
	pollHup   = 0x10
	pollRdHup = 0x2000
)

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

func (p *Peeker) controlLeft(fd uintptr) {
	pfd := pollFd{fd: int32(fd), events: pollRdHup}
	var zero syscall.Timespec // do not wait
	n, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	p.left = e == 0 && n == 1 && pfd.revents&(pollRdHup|pollHup|pollErr) != 0
}

// Left reports a peer that ended its side of the connection (a FIN), reset it or failed,
// whatever bytes it sent before and nobody read yet: a stray CRLF, a pipelined request, a TLS
// close_notify. Peek would see those bytes and call the peer alive (SPEC 16: a client leaves when
// its connection ends, whatever it sent before).
func (p *Peeker) Left() bool {
	if p.rc == nil {
		return false
	}
	if err := p.rc.Control(p.leftFn); err != nil {
		return true
	}
	return p.left
}

func (p *Peeker) control(fd uintptr) {
	n, err := nbPeek(fd, p.buf[:])
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		p.state = PeekNothing
	case err != nil, n == 0:
		p.state = PeekClosed
	default:
		p.state = PeekData
	}
}

// Peek reports what is waiting on the connection.
func (p *Peeker) Peek() PeekState {
	if p.rc == nil {
		return PeekNothing
	}
	if err := p.rc.Control(p.fn); err != nil {
		return PeekClosed
	}
	return p.state
}

// Peek looks once at a connection (see Peeker).
func Peek(c any) PeekState { return NewPeeker(c).Peek() }

// PeerGone reports a peer that closed or reset the connection. Bytes waiting (a pipelined
// request) mean it is alive; Peeker.Left looks past them.
func PeerGone(c any) bool { return Peek(c) == PeekClosed }
