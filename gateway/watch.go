package gateway

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// watchInterval is how often a watched client's socket is checked while its request waits for
// the upstream: SPEC 5 wants a client that left noticed within 1 s.
const watchInterval = 200 * time.Millisecond

// clientWatch notices, on elevated routes, a client that closes its connection while Toron
// waits for the upstream (a 60 s report whose user gave up), so that the upstream request is
// aborted and the route's slots are freed at once instead of after response_header_timeout.
//
// fasthttp has no per-request cancellation (RequestCtx.Done closes only at shutdown, SPEC 12),
// so the watch is ours: a goroutine peeks at the client socket every watchInterval without
// consuming bytes, and on a FIN or a reset interrupts the upstream connection of the request.
// The request's upstream connection is attached to the watch when it is lent (forward): that is
// how the watch reaches it. A goroutine, a ticker and a small
// allocation per request is why only elevated routes pay for the watch: the small-request path
// has none.
type clientWatch struct {
	up   atomic.Pointer[upstreamConn]
	gone atomic.Bool
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// watchClient starts watching cc while its request goes upstream. halt must be called once the
// response headers arrived or the exchange failed.
func watchClient(cc *clientConn) *clientWatch {
	w := &clientWatch{stop: make(chan struct{})}
	w.wg.Add(1)
	go w.run(cc)
	return w
}

// attach names the upstream connection the request is sent on: the one aborted when the
// client leaves.
func (w *clientWatch) attach(c *upstreamConn) {
	w.up.Store(c)
	// gone is stored before the connection is loaded (run), and the connection is stored here
	// before gone is loaded: a connection attached meanwhile is aborted by one side or the other.
	if w.gone.Load() {
		c.abort()
	}
}

func (w *clientWatch) run(cc *clientConn) {
	defer w.wg.Done()
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			if peerGone(cc.Conn) {
				w.gone.Store(true)
				if c := w.up.Load(); c != nil {
					c.abort()
				}
				return
			}
		}
	}
}

// halt stops the watch and waits for its goroutine. It may be called more than once.
func (w *clientWatch) halt() {
	w.once.Do(func() {
		close(w.stop)
		w.wg.Wait()
	})
}

// peekState is what a non-blocking peek at an idle socket found.
type peekState uint8

const (
	peekNothing peekState = iota // no bytes, connection open
	peekData                     // bytes are waiting
	peekClosed                   // FIN or an error: the peer is gone
)

// peeker looks at a connection without blocking, consuming or taking the read lock. It uses
// RawConn.Control, not RawConn.Read, because Read checks the read deadline first, and a deadline
// that passed while nobody was reading (the client's, while the upstream works) says nothing
// about the peer. A peeker is reused for every peek at its connection: no allocation per peek.
type peeker struct {
	rc    syscall.RawConn
	fn    func(fd uintptr)
	buf   [1]byte
	state peekState
}

func newPeeker(c any) *peeker {
	p := &peeker{}
	if nc, ok := c.(net.Conn); ok {
		c = rawConn(nc) // below TLS: the kernel's view of the peer
	}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			p.rc = rc
		}
	}
	p.fn = p.control
	return p
}

func (p *peeker) control(fd uintptr) {
	n, err := nbPeek(fd, p.buf[:])
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		p.state = peekNothing
	case err != nil, n == 0:
		p.state = peekClosed
	default:
		p.state = peekData
	}
}

// peek reports what is waiting on the connection.
func (p *peeker) peek() peekState {
	if p.rc == nil {
		return peekNothing
	}
	if err := p.rc.Control(p.fn); err != nil {
		return peekClosed
	}
	return p.state
}

// peek looks once at a connection (see peeker).
func peek(c any) peekState { return newPeeker(c).peek() }

// peerGone reports a peer that closed or reset the connection. Bytes waiting (a pipelined
// request) mean it is alive.
func peerGone(c any) bool { return peek(c) == peekClosed }
