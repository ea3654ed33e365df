// This file owns the liveness peek: a look at an idle socket, without blocking or consuming,
// for a client watched while its upstream works (the gateway) and for an idle upstream
// connection about to be lent (package upstream).
package socket

import (
	"net"
	"syscall"
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
	rc    syscall.RawConn
	fn    func(fd uintptr)
	buf   [1]byte
	state PeekState
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
	p.fn = p.control
	return p
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
// request) mean it is alive.
func PeerGone(c any) bool { return Peek(c) == PeekClosed }
