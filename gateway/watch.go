package gateway

import (
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"toron/conf"
	"toron/limits"
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
// To reach that connection, a watched request goes through a watchedClient, a HostClient of
// exactly one connection that records it when dialled. A goroutine, a ticker and a small
// allocation per request is why only elevated routes pay for the watch: the small-request path
// has none.
type clientWatch struct {
	wc   *watchedClient
	gone atomic.Bool
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// watchClient starts watching cc while the request goes through wc. halt must be called once
// Do returned.
func watchClient(cc *clientConn, wc *watchedClient) *clientWatch {
	w := &clientWatch{wc: wc, stop: make(chan struct{})}
	wc.watch.Store(w)
	w.wg.Add(1)
	go w.run(cc)
	return w
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
				// gone is stored before the connection is loaded, and the dial hook stores the
				// connection before it loads gone: a connection dialled meanwhile is aborted by
				// one side or the other.
				w.gone.Store(true)
				if uc := w.wc.up.Load(); uc != nil {
					uc.abort()
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
		w.wc.watch.Store(nil)
	})
}

// watchedClient is one upstream connection of an elevated route: a HostClient of at most one
// connection, whose dial hook records the connection so that the watch of the request using it
// can abort it. Between requests it waits in the route's watchedPool and its connection stays
// open (keep-alive, up to upstream_idle_timeout), like the connections of other routes.
type watchedClient struct {
	hc    *fasthttp.HostClient
	up    atomic.Pointer[upstreamConn]
	watch atomic.Pointer[clientWatch]
}

func (wc *watchedClient) onDial(uc *upstreamConn) {
	wc.up.Store(uc)
	if w := wc.watch.Load(); w != nil && w.gone.Load() {
		uc.abort()
	}
}

// watchedPool holds an elevated route's watched clients: at most max_upstream_conns in use at
// once (slots), the idle ones in a stack, so that the most recently used connection is lent
// first and the others can run out their idle time.
type watchedPool struct {
	route  *conf.Route
	server *conf.Server
	slots  *limits.WorkerPool

	mu      sync.Mutex
	idle    []*watchedClient
	retired bool
}

func newWatchedPool(r *conf.Route, s *conf.Server) *watchedPool {
	return &watchedPool{route: r, server: s, slots: limits.NewWorkerPool(r.Effective.MaxUpstreamConns)}
}

// get waits at most wait for a connection slot, then lends an idle client or a new one. It
// reports false when no slot freed up in time.
//
// A lent client's connection is checked first when it has been idle: an upstream that closed
// it (its own keep-alive timeout shorter than upstream_idle_timeout) would otherwise fail the
// request once its body has been read, when SPEC 3 forbids a retry. The client then dials anew.
func (p *watchedPool) get(wait time.Duration) (*watchedClient, bool, error) {
	if !p.slots.Acquire(wait) {
		return nil, false, nil
	}
	p.mu.Lock()
	var wc *watchedClient
	if n := len(p.idle); n > 0 {
		wc = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()
	if wc != nil {
		if uc := wc.up.Load(); uc != nil && uc.idleAndClosed() {
			wc.hc.CloseIdleConnections()
		}
		return wc, true, nil
	}
	wc = &watchedClient{}
	hc, err := newHostClient(p.route, p.server, wc.onDial)
	if err != nil {
		p.slots.Release()
		return nil, false, err
	}
	wc.hc = hc
	return wc, true, nil
}

// put takes a client back once its response was released. A client whose request was aborted
// for a departed client, whose watch is still running (a panic skipped the halt), or that
// comes back to a pool retired by a reload is not kept: its connection is closed.
func (p *watchedPool) put(wc *watchedClient, reusable bool) {
	if w := wc.watch.Load(); w != nil {
		w.halt()
		reusable = false
	}
	p.mu.Lock()
	keep := reusable && !p.retired
	if keep {
		p.idle = append(p.idle, wc)
	}
	p.mu.Unlock()
	if !keep {
		wc.hc.CloseIdleConnections()
	}
	p.slots.Release()
}

// retire closes the idle clients' connections and makes the pool close those of the clients
// still lent when they come back: a reload replaced the route.
func (p *watchedPool) retire() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.retired = nil, true
	p.mu.Unlock()
	for _, wc := range idle {
		wc.hc.CloseIdleConnections()
	}
}

// closeIdle closes the idle clients' connections (the end of a test).
func (p *watchedPool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, wc := range idle {
		wc.hc.CloseIdleConnections()
	}
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
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			p.rc = rc
		}
	}
	p.fn = p.control
	return p
}

func (p *peeker) control(fd uintptr) {
	n, _, err := syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
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
