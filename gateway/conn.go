// This file owns the client connection: the gateway's listener (accounting, the close of
// what is left at shutdown), clientConn with its read and write windows, the deferred end of
// a response on a plain socket, and the lingering close.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"toron/socket"
	"toron/timeouts"
)

// listener wraps the gateway's TCP listener so that every client connection is a *clientConn:
// the one place where a request's admission state, the client socket's deadlines and the
// lingering close live. It also knows every open connection, for toron_connections_open and for
// closing what is left when shutdown_timeout runs out.
type listener struct {
	net.Listener
	g *Gateway

	mu    sync.Mutex
	conns map[*clientConn]struct{}
	open  atomic.Int64
	// redirect marks the HTTPS redirect listener (redirect.go).
	redirect bool
}

func newListener(ln net.Listener, g *Gateway) *listener {
	return &listener{Listener: ln, g: g, conns: make(map[*clientConn]struct{})}
}

// Accept wraps each accepted connection in a clientConn.
func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	for err == nil && l.g.tunnels.refuse(l.open.Load()) {
		// Open tunnels count in max_connections, and fasthttp no longer counts them (tunnel.go).
		_ = c.Close()
		c, err = l.Listener.Accept()
	}
	if err != nil {
		return nil, err
	}
	cc := &clientConn{Conn: c, ln: l, activeAt: time.Now()}
	cc.windowBelow = socket.AttachWriteWindow(c, &cc.writeWin, nil) // TLS: the window runs below it
	_, cc.unshaken = c.(interface{ ConnectionState() tls.ConnectionState })
	if !cc.windowBelow {
		cc.raw = socket.NewRawPath(c, &cc.rawCount)
		if cc.raw != nil {
			cc.raw.Written = cc.pendingWritten
		}
	}
	// The first request's line and headers must arrive within read_timeout of the accept.
	_ = cc.SetReadDeadline(cc.activeAt.Add(l.g.snap.Load().cfg.Server.ReadTimeout))
	l.mu.Lock()
	l.conns[cc] = struct{}{}
	l.mu.Unlock()
	l.open.Add(1)
	return cc, nil
}

// closeAll closes every open client connection: the end of a shutdown whose in-flight requests
// did not finish within shutdown_timeout.
func (l *listener) closeAll() {
	l.mu.Lock()
	conns := make([]*clientConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.forceClose()
	}
}

// waitClosed waits until every client connection was closed, or ctx ends.
func (l *listener) waitClosed(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for l.open.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func (l *listener) forget(c *clientConn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	l.open.Add(-1)
}

// clientConn is one client connection. fasthttp serves a connection from a single goroutine,
// one request at a time, so the exchange embedded here is the state of the request in progress:
// decided in the HeaderReceived hook, used by the handler and the error handler, and released by
// Close if nothing else did (a client that vanished before its handler ran).
type clientConn struct {
	net.Conn
	ln *listener

	// x is the exchange of the request in progress: taken from exchangePool when a request
	// begins (ex) and given back when the connection goes idle (onConnState), so that an idle
	// keep-alive connection holds none of its buffers (SPEC 22). Whoever swaps it out owns it.
	x atomic.Pointer[exchange]

	linger atomic.Bool
	closed atomic.Bool

	// bodyPhase is true while the request body is read: reads go through readWin. Writes
	// always go through writeWin. Both start over for each request in onHeaders, and keep
	// the socket's deadline across requests (timeouts.Window.Carry): readWin knows every read
	// deadline set on the socket, writeWin every write deadline (the Set*Deadline methods).
	bodyPhase bool
	headBytes int64 // bytes read since the connection went idle (or was accepted)
	// activeAt is when the current request's first byte arrived (or the connection was
	// accepted): the start of a request fasthttp refuses before any hook saw it.
	activeAt time.Time
	readWin  timeouts.Window
	writeWin timeouts.Window

	// deadlineSets counts the Set*Deadline calls on the connection, for tests; the windows'
	// own re-arms are in their Rearms.
	deadlineSets int64
	// remote is RemoteAddr().String(), made once for the connection's access lines.
	remote string
	// windowBelow: writeWin is applied below TLS, by the socket (socket.Windowed).
	windowBelow bool
	// unshaken is set on a TLS connection until its first read (which runs the handshake on
	// the connection's own goroutine). A write before it can only be fasthttp refusing the
	// connection beyond Server.Concurrency, on the accept goroutine: fasthttp skips its 503 for
	// a TLS connection but cannot see this one through clientConn, and the write would run the
	// handshake there, waiting for a silent client's ClientHello while no connection is
	// accepted (SPEC 16). Such a write fails at once and the connection is closed unanswered.
	unshaken bool
	// raw is the socket of a plain TCP client connection (socket.RawPath): the last write of a
	// response waits in pending (a pooled copy) for the read of the next request, which writes
	// it and then waits, saving the read that would find nothing (deferResponseEnd).
	raw       *socket.RawPath
	deferNext bool // the response is complete: its next write is its last
	pending   *[]byte
	// hasPending is set while pending waits; whoever clears it (the next read, or a close,
	// which may come from the shutdown's goroutine) writes the bytes and returns the buffer.
	hasPending atomic.Bool
	rawCount   int64
	// tail is held while the rest of a response end is written (readWithPending) and while the
	// socket is being closed (Close): the one never cuts the other.
	tail sync.Mutex
}

// errRefusedUnshaken is the write of a TLS connection refused before its handshake (unshaken).
var errRefusedUnshaken = errors.New("gateway: TLS connection refused before its handshake")

// clientDeferMax is the largest last write of a response that waits for the next read.
const clientDeferMax = 16 << 10

var pendingPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// deferResponseEnd says the current response is complete (exchange.finish): the write that ends
// it may wait for the next request's read, when the connection is a plain socket.
func (c *clientConn) deferResponseEnd() {
	c.deferNext = c.raw != nil
}

// flushPending writes a response end that waited for a read that is not coming (another
// write, a hijack), on the connection's own goroutine: under the write window.
func (c *clientConn) flushPending() error {
	b := c.claimPending()
	if b == nil {
		return nil
	}
	_, err := socket.WriteInWindow(c.Conn, &c.writeWin, *b, nil)
	releasePending(b)
	return err
}

// flushPendingClosing writes a waiting response end before the connection closes. Close may
// run on another goroutine (a shutdown closing idle connections, which fasthttp thinks this
// one is once it flushed), so the write window, which is the connection goroutine's, is left
// alone: the write is bounded by write_timeout instead.
func (c *clientConn) flushPendingClosing() {
	b := c.claimPending()
	if b == nil {
		return
	}
	timeout := 5 * time.Second
	if c.ln != nil {
		if s := c.ln.g.snap.Load(); s != nil && s.cfg.Server.WriteTimeout > 0 {
			timeout = s.cfg.Server.WriteTimeout
		}
	}
	if c.Conn.SetWriteDeadline(time.Now().Add(timeout)) == nil {
		_, _ = c.Conn.Write(*b)
	}
	releasePending(b)
}

// claimPending takes the waiting response end, or nil: whoever clears hasPending owns it.
func (c *clientConn) claimPending() *[]byte {
	if !c.hasPending.Load() || !c.hasPending.CompareAndSwap(true, false) {
		return nil
	}
	return c.pending
}

// pendingWritten gives the response end back to the pool as soon as the read that writes it
// has written it whole, before that read waits for the next request (socket.RawPath.Written):
// an idle connection holds no copy of its last response.
func (c *clientConn) pendingWritten() {
	b := c.pending
	c.pending = nil
	releasePending(b)
}

func releasePending(b *[]byte) {
	*b = (*b)[:0]
	pendingPool.Put(b)
}

// remoteString returns the client's address as host:port, computed once per connection.
func (c *clientConn) remoteString() string {
	if c.remote == "" {
		c.remote = c.RemoteAddr().String()
	}
	return c.remote
}

// Read reads from the client. While a request body is read, the activity window of SPEC 5
// applies: the deadline slides with progress and a dripping client is cut (timeouts.Window).
// The request line and headers are read under fasthttp's own absolute ReadTimeout.
func (c *clientConn) Read(p []byte) (int, error) {
	if c.unshaken {
		c.unshaken = false
	}
	if c.hasPending.Load() {
		return c.readWithPending(p)
	}
	if !c.bodyPhase {
		n, err := c.Conn.Read(p)
		c.headBytes += int64(n)
		return n, err
	}
	start := time.Now()
	if d, ok := c.readWin.Before(start); ok {
		if err := c.Conn.SetReadDeadline(d); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	return n, c.readWin.After(start, time.Now(), n, err)
}

// Write writes to the client under the sliding write window (the slow-read defence of SPEC 5):
// a large response to a slow but live client completes, a client that stops reading or reads a
// byte every few seconds is cut. fasthttp's own WriteTimeout is off: it would be absolute for the
// whole response, and waiting for the upstream must not count against it.
//
// A write whose deadline passes is judged by what the client acknowledged meanwhile, read from
// the kernel's send queue (timeouts.Window.Stalled): with a full send buffer one write can wait
// for longer than the window while the client reads steadily. That query is a system call made
// only when a deadline passed.
func (c *clientConn) Write(p []byte) (int, error) {
	if c.unshaken {
		return 0, errRefusedUnshaken
	}
	if c.windowBelow {
		return c.Conn.Write(p)
	}
	if c.raw != nil {
		b := c.claimPending()
		if c.deferNext && !c.closed.Load() && (b == nil && len(p) <= clientDeferMax || b != nil && len(*b)+len(p) <= clientDeferMax) {
			// The response's last write: copied (the caller's buffer is fasthttp's, pooled) and
			// written by the next read. A compressed body's last chunk waits already when the
			// chunked framing's end follows (respStream.Read): this write joins it, so that
			// the response still leaves in one write.
			c.deferNext = false
			if b == nil {
				b = pendingPool.Get().(*[]byte)
			}
			*b = append(*b, p...)
			c.pending = b
			c.raw.Pending = *b
			c.hasPending.Store(true)
			return len(p), nil
		}
		if b != nil {
			_, err := socket.WriteInWindow(c.Conn, &c.writeWin, *b, nil)
			releasePending(b)
			if err != nil {
				return 0, err
			}
		}
	}
	return socket.WriteInWindow(c.Conn, &c.writeWin, p, nil)
}

// readWithPending writes the response end that waited and reads the next request in one
// RawConn.Read call (socket.RawPath). The callback claims the bytes (hasPending) while it
// holds the socket, so that a Close from another goroutine either wrote them already or waits
// for this write before the socket closes. A socket that takes only part of them gets the rest
// under the write window, as any write; a read that fails before the callback ran (a deadline
// already past) still writes them.
func (c *clientConn) readWithPending(p []byte) (int, error) {
	r := c.raw
	err := r.WriteRead(p, &c.hasPending)
	rest := r.Pending
	r.Pending = nil
	if r.Claimed {
		if !r.Released {
			defer releasePending(c.pending)
		}
	} else if b := c.claimPending(); b != nil {
		// The callback never ran: the bytes are still to be written.
		defer releasePending(b)
		rest = *b
		r.Partial = true
		err = nil
	}
	if err != nil {
		return 0, err
	}
	if r.Partial {
		if len(rest) > 0 {
			// tail: a Close meanwhile (a shutdown's) closes the socket after this write, not
			// under it.
			c.tail.Lock()
			_, err := socket.WriteInWindow(c.Conn, &c.writeWin, rest, nil)
			c.tail.Unlock()
			if err != nil {
				return 0, err
			}
		}
		return c.Read(p)
	}
	if r.Err == nil && !c.bodyPhase {
		c.headBytes += int64(r.N)
	}
	return r.N, r.Err
}

// Close releases whatever the request in progress still holds, then closes the connection,
// lingering first when a rejection left body bytes in flight.
//
// A response end still owed to the client (deferResponseEnd's, or the rest of one that the
// connection's goroutine is writing, tail) is finished first, on a goroutine of its own, which
// then closes the socket: a shutdown closes idle connections from fasthttp's closeIdleConns,
// under the lock that every connection's start and end take, and a write there to a client slow
// to read held that lock, and every other connection, for up to write_timeout (SPEC 9: a drain
// loses no byte of an answered response and never blocks other connections).
func (c *clientConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Not back to the pool: a tunnel that ends with this Close still reads its exchange, and a
	// Close on another goroutine (a shutdown) must not hand a live one to a new request.
	if x := c.x.Swap(nil); x != nil {
		x.abandon()
	}
	if !c.tail.TryLock() {
		// The connection's goroutine is writing the rest of a response end: close after it.
		go func() {
			c.tail.Lock()
			defer c.tail.Unlock()
			_ = c.closeSocket()
		}()
		return nil
	}
	if c.hasPending.Load() {
		go func() {
			defer c.tail.Unlock()
			_ = c.closeSocket()
		}()
		return nil
	}
	defer c.tail.Unlock()
	return c.closeSocket()
}

// closeSocket writes a response end still waiting, then closes the socket (lingering when
// asked) and forgets the connection; Close's, under tail.
func (c *clientConn) closeSocket() error {
	c.flushPendingClosing()
	if c.linger.Load() {
		// The socket below TLS: a *net.TCPConn, or a connection of the PROXY protocol listener
		// over one (the half-close must not be TLS's close_notify).
		socket.LingerClose(socket.Below(c.Conn))
	}
	err := c.Conn.Close()
	c.ln.forget(c)
	return err
}

// forceClose closes the socket without lingering; the connection's goroutine sees the error and
// runs Close itself.
func (c *clientConn) forceClose() {
	// The socket itself, below TLS: crypto/tls's Close would first try to send close_notify.
	_ = socket.Below(c.Conn).Close()
}

// onConnState is fasthttp's ConnState hook, called on the connection's own goroutine. It arms
// the deadlines of SPEC 5 that fasthttp would otherwise fix at startup: a request whose first
// byte arrived (StateActive) must complete its line and headers within read_timeout (absolute,
// a client that drips header bytes is cut); a connection between requests (StateIdle) may wait
// idle_timeout for the next one. Both come from the configuration in force, so a reload
// changes them for the next request.
func (g *Gateway) onConnState(c net.Conn, state fasthttp.ConnState) {
	cc, ok := c.(*clientConn)
	if !ok {
		return
	}
	s := &g.snap.Load().cfg.Server
	switch state {
	case fasthttp.StateActive:
		cc.deferNext = false // a response end not written by now is another request's
		cc.activeAt = time.Now()
		cc.armRead(cc.activeAt.Add(s.ReadTimeout), s.ReadTimeout)
	case fasthttp.StateIdle:
		cc.bodyPhase = false
		cc.headBytes = 0
		cc.releaseExchange()
		// The response was just written: the end of its last write is now, give or take the
		// microseconds since, and saves a clock read. A pipelined request whose answer is still
		// buffered has no such write yet, and a response end that waits for the next read
		// (hasPending) was not written through the window: the clock then.
		now := cc.writeWin.Last()
		if now.Before(cc.activeAt) || cc.hasPending.Load() {
			now = time.Now()
		}
		cc.armRead(now.Add(s.IdleTimeout), s.IdleTimeout)
	}
}

// armRead sets the read deadline d of a timeout unless the deadline armed on the socket is
// already within timeouts.Tolerance of it. On a keep-alive connection whose requests follow
// each other, the idle deadline (set when a response ends) and the next header deadline (set
// when the next request's first byte arrives) are then the same deadline, re-armed only when
// the requests are spread by more than the tolerance: by default idle_timeout is
// read_timeout.
func (c *clientConn) armRead(d time.Time, timeout time.Duration) {
	if c.readWin.Near(d, timeouts.Tolerance(timeout)) {
		return
	}
	_ = c.SetReadDeadline(d)
}

// SetReadDeadline sets the socket's read deadline and records it in the read window. Every read
// deadline of a client connection goes through here (fasthttp's included), so that a carried
// deadline is the one the socket has.
func (c *clientConn) SetReadDeadline(t time.Time) error {
	c.deadlineSets++
	c.readWin.Armed(t)
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline sets the socket's write deadline and records it in the write window.
func (c *clientConn) SetWriteDeadline(t time.Time) error {
	c.deadlineSets++
	c.writeWin.Armed(t)
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline sets both deadlines and records them.
func (c *clientConn) SetDeadline(t time.Time) error {
	c.deadlineSets++
	c.readWin.Armed(t)
	c.writeWin.Armed(t)
	return c.Conn.SetDeadline(t)
}

// exchangePool holds the exchanges of connections between requests: a busy connection takes
// one back at each request without an allocation, an idle one holds none (SPEC 22).
var exchangePool = sync.Pool{New: func() any { return new(exchange) }}

// ex returns the exchange of the request in progress, taking one from the pool when the
// connection has none (its first request, or the first since it went idle). Only the
// connection's own goroutine calls it.
func (c *clientConn) ex() *exchange {
	if x := c.x.Load(); x != nil {
		return x
	}
	x := exchangePool.Get().(*exchange)
	x.conn = c
	c.x.Store(x)
	return x
}

// releaseExchange gives the exchange back to the pool when the connection goes idle: its
// request has finished (a request fasthttp answered without our handler is finished now),
// and its buffers serve the next request of any connection.
func (c *clientConn) releaseExchange() {
	x := c.x.Swap(nil)
	if x == nil {
		return
	}
	if x.active.Load() {
		x.finish()
	}
	x.conn = nil
	x.curCtx = nil
	x.snap, x.route, x.stats = nil, nil, nil
	exchangePool.Put(x)
}

// connOf returns the clientConn of a request. Every connection the gateway serves comes from
// its listener, so anything else is a programming error.
func connOf(ctx *fasthttp.RequestCtx) *clientConn {
	cc, ok := ctx.Conn().(*clientConn)
	if !ok {
		panic("BUG: gateway: request on a connection that did not come from the gateway's listener")
	}
	return cc
}

// headerOffset is the offset of Request.Header inside RequestCtx.
var headerOffset = unsafe.Offsetof((*fasthttp.RequestCtx)(nil).Request) +
	unsafe.Offsetof((*fasthttp.Request)(nil).Header)

// ctxOfHeader returns the RequestCtx whose Request.Header is h.
//
// Why: fasthttp's Server.HeaderReceived hook runs after the headers and before the first body
// byte, which is the only moment a verdict can be reached without waiting for the body (SPEC 3
// steps 4-7), but it receives only the header. fasthttp v1.78 calls it as
// HeaderReceived(&ctx.Request.Header) (server.go, serveConn), so the header is embedded in the
// connection's RequestCtx at a fixed offset; stepping back from it yields the context and, through
// ctx.Conn(), our clientConn, where the verdict is stored without a map or an allocation.
// TestCtxOfHeader guards this assumption against a fasthttp upgrade.
func ctxOfHeader(h *fasthttp.RequestHeader) *fasthttp.RequestCtx {
	return (*fasthttp.RequestCtx)(unsafe.Add(unsafe.Pointer(h), -int(headerOffset)))
}
