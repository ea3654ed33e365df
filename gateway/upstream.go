package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"toron/conf"
	"toron/timeouts"
)

// Upstream buffer sizes. The read buffer bounds the upstream's response headers (fasthttp's
// default of 4 KiB refuses ordinary responses with a few cookies); the write buffer is the unit
// in which request bodies leave for the upstream.
const (
	upstreamReadBufferSize  = 16 << 10
	upstreamWriteBufferSize = 32 << 10
)

var (
	// errStaleConn: a reused keep-alive connection was found closed by the upstream before any
	// byte of the request was written, so the request cannot have reached the upstream.
	errStaleConn = errors.New("gateway: reused upstream connection was closed by the upstream")
)

// dialError wraps a failed dial, so that the 502 can say refused or timed out.
type dialError struct{ err error }

func (e *dialError) Error() string { return "gateway: dial upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// upstreamTimeouts are the deadlines one route's upstream connections manage themselves.
type upstreamTimeouts struct {
	// header is response_header_timeout: from the end of forwarding the request to the first
	// response byte, and then the inactivity window while the response is read.
	header time.Duration
	// write is the sliding window of writes to the upstream (write_timeout).
	write time.Duration
}

// newHostClient builds one of a route's upstream clients (SPEC 3 step 9): a HostClient of one
// connection, lent by the route's upstreamPool.
//
// fasthttp's HostClient applies ReadTimeout from the end of the request write until the whole
// response body is read and WriteTimeout to the whole request write, and retries idempotent
// requests on any error, timeouts included (SPEC 12). Neither matches SPEC 3 and 5, so both
// timeouts are off here: the connections come from our Dial as *upstreamConn, which arm their
// own deadlines, and RetryIfErr retries only what cannot have reached the upstream.
//
// onDial is told about every connection the client dials: the route's pool uses it to know the
// one connection of each of its clients (pool.go).
//
// tlsConfig (upstreamTLSConfig, nil for http://) is the route's: the Dial runs the handshake
// within connect_timeout (upstreamHandshake), so HostClient.IsTLS stays false.
func newHostClient(r *conf.Route, s *conf.Server, onDial func(*upstreamConn), tlsConfig *tls.Config) (*fasthttp.HostClient, error) {
	u, err := url.Parse(r.Target)
	if err != nil {
		return nil, fmt.Errorf("gateway: route %q: target %q: %w", r.Name, r.Target, err)
	}
	to := &upstreamTimeouts{header: r.Effective.ResponseHeaderTimeout, write: r.Effective.WriteTimeout}
	dialer := &net.Dialer{Timeout: r.Effective.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &fasthttp.HostClient{
		Addr:                          u.Host,
		NoDefaultUserAgentHeader:      true,
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: false,
		// One connection per client: the route's pool holds max_upstream_conns clients.
		MaxConns:                  1,
		MaxConnWaitTimeout:        r.Effective.ConnectTimeout,
		MaxIdleConnDuration:       s.UpstreamIdleTimeout,
		ReadBufferSize:            upstreamReadBufferSize,
		WriteBufferSize:           upstreamWriteBufferSize,
		StreamResponseBody:        true,
		MaxIdemponentCallAttempts: 3,
		RetryIfErr:                retryIfStale,
		Dial: func(addr string) (net.Conn, error) {
			start := time.Now()
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				return nil, &dialError{err: err}
			}
			if tlsConfig != nil {
				if c, err = upstreamHandshake(c, tlsConfig, start.Add(r.Effective.ConnectTimeout)); err != nil {
					return nil, &dialError{err: err}
				}
			}
			uc := &upstreamConn{Conn: c, to: to}
			uc.windowBelow = attachWriteWindow(c, &uc.writeWin, &uc.aborted) // TLS: below it
			if onDial != nil {
				onDial(uc)
			}
			return uc, nil
		},
	}, nil
}

// retryIfStale is the whole retry rule of SPEC 3 step 9: a request is retried only when its
// reused keep-alive connection was found closed before any byte was written, and never once a
// body byte was read from the client. fasthttp already never retries a streamed body.
func retryIfStale(req *fasthttp.Request, attempts int, err error) (resetTimeout, retry bool) {
	return false, errors.Is(err, errStaleConn) && len(req.Body()) == 0 && !req.IsBodyStream()
}

// upstreamConn is an upstream connection that manages its own deadlines (SPEC 5, SPEC 12).
// fasthttp's HostClient uses a connection for one request at a time: writes of the request,
// then reads of the response. The first read after writes is the end of forwarding, where the
// response header timer starts; a write after reads starts the next request on a reused
// connection, which is first checked for a close by the upstream.
type upstreamConn struct {
	net.Conn
	to *upstreamTimeouts

	aborted atomic.Bool
	peeker  *peeker

	requests     int
	reading      bool
	aliveAt      time.Time // last response byte read, or last peek that found the connection open
	respBytes    int64
	readDeadline time.Time
	writeWin     timeouts.Window
	// windowBelow: writeWin is applied below TLS, by the socket (tls.go, windowedSocket).
	windowBelow bool
}

// Write sends request bytes under a sliding write window. A write blocked past its deadline is
// judged by what the upstream acknowledged meanwhile (timeouts.Window.Stalled, as for the
// client): an upstream that reads a large body slowly but steadily behind a full send buffer
// is not one that stopped reading.
func (c *upstreamConn) Write(p []byte) (int, error) {
	if c.reading || c.requests == 0 {
		c.requests++
		c.reading = false
		c.respBytes = 0
		c.writeWin.Reset(c.to.write, 0)
		if c.requests > 1 && c.closedWhileIdle() {
			return 0, errStaleConn
		}
	}
	var n int
	var err error
	if c.windowBelow {
		n, err = c.Conn.Write(p)
	} else {
		n, err = writeInWindow(c.Conn, &c.writeWin, p, &c.aborted)
	}
	switch {
	case err == nil:
		return n, nil
	case c.aborted.Load():
		return n, errClientLeft
	case isTimeout(err):
		// fasthttp turns every timeout into ErrTimeout; this one must stay apart from the
		// response header timeout (504): it is an upstream that stopped reading (502).
		return n, &writeStallError{err: err}
	}
	return n, err
}

// writeStallError is an upstream that did not take request bytes within its write window. It
// deliberately has no Timeout method, so that fasthttp passes it through unchanged.
type writeStallError struct{ err error }

func (e *writeStallError) Error() string {
	return "gateway: upstream stopped reading the request: " + e.err.Error()
}
func (e *writeStallError) Unwrap() error { return e.err }

// Read reads response bytes. Until the first byte the deadline is fixed at the end of
// forwarding plus response_header_timeout; after it the same window slides with every read, so
// a long streamed response that progresses is never cut by an absolute timeout.
func (c *upstreamConn) Read(p []byte) (int, error) {
	if w := c.to.header; w > 0 {
		now := time.Now()
		switch {
		case !c.reading:
			c.reading = true
			c.readDeadline = now.Add(w)
			if err := c.Conn.SetReadDeadline(c.readDeadline); err != nil {
				return 0, err
			}
		case c.respBytes > 0 && c.readDeadline.Sub(now) < w/2:
			c.readDeadline = now.Add(w)
			if err := c.Conn.SetReadDeadline(c.readDeadline); err != nil {
				return 0, err
			}
		}
	} else {
		c.reading = true
	}
	if c.aborted.Load() {
		return 0, errClientLeft
	}
	n, err := c.Conn.Read(p)
	if err != nil && c.aborted.Load() {
		return n, errClientLeft
	}
	c.respBytes += int64(n)
	if n > 0 {
		c.aliveAt = time.Now()
	}
	return n, err
}

// abort interrupts the connection's pending read or write at once: the client of its request
// left. Safe to call from another goroutine.
func (c *upstreamConn) abort() {
	c.aborted.Store(true)
	now := time.Now()
	_ = c.Conn.SetReadDeadline(now)
	_ = c.Conn.SetWriteDeadline(now)
}

// errClientLeft ends an upstream exchange whose client closed its connection meanwhile.
var errClientLeft = errors.New("gateway: client closed the connection while the upstream was working")

// staleCheckAfter: a connection that answered less than this long ago is reused without the
// peek. Upstreams close idle keep-alive connections after seconds, not milliseconds, so under
// load (the common case of reuse) the check would cost a system call per request for nothing;
// a connection closed within that window still fails as a 502, never as a wrong answer.
const staleCheckAfter = 50 * time.Millisecond

// closedWhileIdle reports a connection idle for longer than staleCheckAfter that the upstream
// closed meanwhile. A check that finds it open counts as a sign of life, so the first write
// right after the pool's check (upstreamPool.get) does not peek a second time. Only for a
// connection no other goroutine is using.
func (c *upstreamConn) closedWhileIdle() bool {
	if time.Since(c.aliveAt) <= staleCheckAfter {
		return false
	}
	if c.closedByPeer() {
		return true
	}
	c.aliveAt = time.Now()
	return false
}

// closedByPeer reports an idle pooled connection that must not carry a request: the upstream
// sent a FIN or a reset, or bytes nobody asked for. It runs before every reused request, so
// the raw connection and the peek are set up once per connection, not per request.
func (c *upstreamConn) closedByPeer() bool {
	if c.peeker == nil {
		c.peeker = newPeeker(c.Conn)
	}
	return c.peeker.peek() != peekNothing
}
