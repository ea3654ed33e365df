// This file owns Conn, one upstream connection: its read buffer kept across requests, its own
// deadlines (the write window, the response-header timer, the sliding body window), the
// lend-time peek, and the errors an exchange on it ends with.
package upstream

import (
	"bufio"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"toron/socket"
	"toron/timeouts"
)

// Upstream buffer sizes. The read buffer, one per upstream connection and kept for its whole
// life, bounds the upstream's response headers (4 KiB would refuse ordinary responses with a few
// cookies) and is where bytes an upstream sent past a response are found (Conn.idle).
const upstreamReadBufferSize = 16 << 10

var (
	// ErrClientLeft ends an upstream exchange whose client closed its connection meanwhile
	// (Conn.Abort).
	ErrClientLeft = errors.New("gateway: client closed the connection while the upstream was working")
)

// DialError wraps a failed dial, so that the 502 can say refused or timed out.
type DialError struct{ Err error }

func (e *DialError) Error() string { return "gateway: dial upstream: " + e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// WriteStallError is an upstream that did not take request bytes within its write window: an
// upstream that stopped reading (502), never the response header timeout (504).
type WriteStallError struct{ err error }

func (e *WriteStallError) Error() string {
	return "gateway: upstream stopped reading the request: " + e.err.Error()
}
func (e *WriteStallError) Unwrap() error { return e.err }

// connTimeouts are the deadlines one route's upstream connections manage themselves.
type connTimeouts struct {
	// header is response_header_timeout: from the end of forwarding the request to the response
	// headers, and then the inactivity window while the response body is read.
	header time.Duration
	// write is the sliding window of writes to the upstream (write_timeout).
	write time.Duration
	// idle is upstream_idle_timeout: how long a connection waits in the pool for its next request.
	idle time.Duration
}

// Connection states. A connection is lent to one request at a time; between requests it is idle
// in its pool, checked by a peek when it is lent again; dead once closed.
const (
	connLent int32 = iota
	connIdle
	connDead
)

// Conn is one upstream connection with its own read buffer, kept across requests, and
// its own deadlines (SPEC 5, SPEC 12).
//
// Response queue poisoning (SPEC 7): an upstream connection is reused only if nothing arrived on
// it beyond its last response. Bytes already read past a response are in br when the response
// ends: the connection is closed instead of pooled (idle). Bytes that arrive later, while it is
// idle, are found when it is lent: one non-blocking peek at the socket (lend), which also finds
// a close or a reset by the upstream, before any byte of the next request is written or read.
//
// Why a peek and not a reader goroutine per connection (Go's Transport): measured here, a
// goroutine that watches the idle connection and hands the response's first byte to the
// request costs two cross-thread wake-ups per request; a sequential keep-alive request took
// 150 µs instead of 55 µs (BenchmarkProxySmallGET). The peek is one recvfrom that returns
// EAGAIN, about 1 µs, on the path that then writes and reads the socket anyway.
type Conn struct {
	net.Conn
	pool *Pool
	to   *connTimeouts
	br   *bufio.Reader

	state   atomic.Int32
	aborted atomic.Bool
	// slide is set once the response headers were read: reads of the body then push the read
	// deadline forward (an inactivity window); before, the header deadline is absolute.
	slide atomic.Bool

	// peeker looks at the idle socket without blocking (socket.Peeker); idleSince is when the
	// connection went back to the pool.
	peeker    *socket.Peeker
	idleSince time.Time

	// requests counts the requests lent this connection; written counts the bytes of the
	// current request that reached the socket (the retry rule of SPEC 3 step 9).
	requests int
	written  int64
	// socketWritten counts the bytes the socket below TLS took for the current request (the
	// socket.Windowed counts them): tls.Conn.Write reports only whole records, so a record cut
	// short by a failed write would otherwise look like nothing written. isTLS says the
	// connection speaks TLS.
	socketWritten int64
	isTLS         bool
	readDeadline  time.Time
	writeWin      timeouts.Window
	// windowBelow: writeWin is applied below TLS, by the socket (socket.Windowed): a write
	// timeout corrupts a TLS connection, so the window must judge the socket's writes.
	windowBelow bool
	// raw is the socket of a plain TCP connection, through which a small request is written
	// and its answer waited for in one call (socket.RawPath); nil over TLS.
	raw *socket.RawPath
	// vec holds a chunk's size line and data for one writev (writeChunk); kept here so that
	// the net.Buffers does not escape per chunk.
	vec  [2][]byte
	bufs net.Buffers
}

// writeChunk writes a chunk's size line and its data: in one writev(2) on a plain socket, in two
// writes over TLS (which frames records of its own).
func (c *Conn) writeChunk(line, data []byte) error {
	if c.raw == nil {
		if _, err := c.Write(line); err != nil {
			return err
		}
		_, err := c.Write(data)
		return err
	}
	c.vec[0], c.vec[1] = line, data
	c.bufs = c.vec[:]
	n, err := socket.WriteInWindowV(c.Conn, &c.writeWin, nil, &c.bufs, &c.aborted)
	c.bufs = nil
	c.vec[0], c.vec[1] = nil, nil
	return c.writeResult(n, err)
}

func newUpstreamConn(c net.Conn, p *Pool) *Conn {
	uc := &Conn{Conn: c, pool: p, to: &p.to}
	uc.br = bufio.NewReaderSize(uc, upstreamReadBufferSize)
	uc.windowBelow = socket.AttachWriteWindow(c, &uc.writeWin, &uc.aborted)
	if uc.isTLS = socket.IsTLS(c); uc.isTLS {
		socket.CountWrites(c, &uc.socketWritten)
	} else if !uc.windowBelow {
		uc.raw = socket.NewRawPath(c, &uc.written)
	}
	uc.state.Store(connLent)
	return uc
}

// Read reads response bytes. Until the response headers were read, the deadline is the
// absolute one armed when the request was forwarded; after them the same window slides with
// every read, so a long streamed response that progresses is never cut by an absolute timeout.
func (c *Conn) Read(p []byte) (int, error) {
	if c.aborted.Load() {
		return 0, ErrClientLeft
	}
	if c.raw != nil && c.raw.Pending != nil {
		n, err := c.readWithPending(p)
		if err != nil && c.aborted.Load() {
			return n, ErrClientLeft
		}
		return n, err
	}
	if c.slide.Load() && c.to.header > 0 {
		if now := time.Now(); c.readDeadline.Sub(now) < c.to.header/2 {
			c.readDeadline = now.Add(c.to.header)
			if err := c.Conn.SetReadDeadline(c.readDeadline); err != nil {
				return 0, err
			}
		}
	}
	n, err := c.Conn.Read(p)
	if err != nil && c.aborted.Load() {
		return n, ErrClientLeft
	}
	return n, err
}

// Write sends request bytes under a sliding write window. A write blocked past its deadline is
// judged by what the upstream acknowledged meanwhile (timeouts.Window.Stalled, as for the
// client): an upstream that reads a large body slowly but steadily behind a full send buffer
// is not one that stopped reading.
func (c *Conn) Write(p []byte) (int, error) {
	var n int
	var err error
	if c.windowBelow {
		n, err = c.Conn.Write(p)
	} else {
		n, err = socket.WriteInWindow(c.Conn, &c.writeWin, p, &c.aborted)
	}
	return n, c.writeResult(n, err)
}

// writeResult counts n written bytes and turns a write's error into the exchange's.
func (c *Conn) writeResult(n int, err error) error {
	c.written += int64(n)
	switch {
	case err == nil:
		return nil
	case c.aborted.Load():
		return ErrClientLeft
	case socket.IsTimeout(err):
		return &WriteStallError{err: err}
	}
	return err
}

// Abort interrupts the connection's pending read or write at once: the client of its request
// left. Safe to call from another goroutine.
func (c *Conn) Abort() {
	c.aborted.Store(true)
	now := time.Now()
	_ = c.Conn.SetReadDeadline(now)
	_ = c.Conn.SetWriteDeadline(now)
}

// lend takes an idle connection for a request. It reports false when the connection must not
// carry it: it sat idle longer than upstream_idle_timeout, or the peek found bytes nobody asked
// for, a close or a reset; the caller closes it (kill).
func (c *Conn) lend(now time.Time) bool {
	if !c.state.CompareAndSwap(connIdle, connLent) {
		return false
	}
	if c.to.idle > 0 && now.Sub(c.idleSince) > c.to.idle {
		return false
	}
	if c.peeker == nil {
		c.peeker = socket.NewPeeker(socket.Below(c.Conn))
	}
	return c.peeker.Peek() == socket.PeekNothing
}

// begin prepares the connection for the next request's write.
func (c *Conn) begin() {
	c.requests++
	if c.raw != nil {
		c.raw.Pending = nil
	}
	c.written = 0
	c.socketWritten = 0
	c.slide.Store(false)
	c.writeWin.Carry(c.to.write, 0) // the write deadline armed for the last request is kept when it still fits
}

// forwarded arms the response header deadline: the request was written.
func (c *Conn) forwarded(now time.Time) error {
	if c.to.header <= 0 {
		return nil
	}
	c.readDeadline = now.Add(c.to.header)
	return c.Conn.SetReadDeadline(c.readDeadline)
}

// idle puts the connection back to wait for its next request. It reports false when the
// connection cannot be reused: bytes beyond the last response are already buffered.
func (c *Conn) idle(now time.Time) bool {
	if c.br.Buffered() > 0 || c.aborted.Load() {
		return false
	}
	if c.isTLS && !c.tlsDrained() {
		return false
	}
	c.slide.Store(false)
	c.idleSince = now
	c.state.Store(connIdle)
	return true
}

// tlsDrained reports whether crypto/tls holds nothing of the upstream's beyond the response:
// it may have pulled more records off the socket than the response needed, where neither br
// nor the lend-time peek at the socket can see them. A read under a deadline already past
// returns what tls.Conn holds, or a timeout without a system call (Go checks the deadline
// before reading the socket; a read timeout leaves a TLS connection usable).
func (c *Conn) tlsDrained() bool {
	if err := c.Conn.SetReadDeadline(time.Unix(1, 0)); err != nil {
		return false
	}
	var one [1]byte
	n, err := c.Conn.Read(one[:])
	return n == 0 && socket.IsTimeout(err)
}

// Kill closes a connection whose owner (the request it is lent to, or the pool) gives it up.
func (c *Conn) Kill() {
	if c.state.Swap(connDead) != connDead {
		_ = c.Conn.Close()
	}
}

// deferWrite keeps b (which stays valid until the response head was read) to be written by the
// next read. It reports false when the connection has no raw path.
func (c *Conn) deferWrite(b []byte) bool {
	if c.raw == nil || len(b) == 0 {
		return false
	}
	c.raw.Pending = b
	return true
}

// readWithPending writes the deferred request, waits for the socket and reads into p.
func (c *Conn) readWithPending(p []byte) (int, error) {
	r := c.raw
	err := r.WriteRead(p, nil)
	if err != nil {
		// The wait failed: the header deadline passed (or abort moved it), or the socket closed.
		r.Pending = nil
		return 0, err
	}
	if r.Partial {
		// The socket's buffer took part of the request: the rest under the write window, then
		// the ordinary read.
		rest := r.Pending
		r.Pending = nil
		if _, err := c.Write(rest); err != nil {
			return 0, err
		}
		return c.Conn.Read(p)
	}
	r.Pending = nil
	return r.N, r.Err
}
