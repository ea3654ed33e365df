package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"toron/conf"
	"toron/limits"
	up "toron/upstream"
)

// upstreamPool holds one target's upstream connections (SPEC 13: each target of a route has
// its own pool, attached to it by package upstream): at most max_upstream_conns lent at once
// (slots), the idle ones in a stack, so that the most recently used connection is lent first
// and the others run out their idle time (sweepIdle closes them after upstream_idle_timeout).
//
// A connection is checked when it is lent, before any body byte is read from the client: one
// that the upstream closed while idle, or that received bytes nobody asked for, is found by a
// non-blocking peek (upstreamConn.lend) and closed, and the request dials anew. A request with
// a body is never replayed (SPEC 3 step 9), so this check is what keeps a POST after an
// upstream's keep-alive timeout from failing with a 502.
type upstreamPool struct {
	params poolParams
	slots  *limits.WorkerPool
	// tls is the client configuration of an https target; nil for http.
	tls  *tls.Config
	dial up.DialFunc
	to   upstreamTimeouts

	mu      sync.Mutex
	idle    []*upstreamConn // the oldest at the bottom, lent from the top
	retired bool
	sweep   *time.Timer // closes expired idle connections (sweepIdle); nil while none is idle
}

// poolParams are the settings a pool is built from. A reload that keeps a target with the same
// params keeps its pool and its warm connections; any change builds a new pool and retires the
// old one (its connections close as their requests end).
type poolParams struct {
	addr  string // host:port, dialed
	https bool
	// tls is the route's upstream TLS configuration (upstreamtls.go), built at each load: an
	// https target gets a new pool at every reload, so that a changed CA file takes effect.
	tls      *tls.Config
	maxConns int
	connect  time.Duration
	header   time.Duration
	write    time.Duration
	idle     time.Duration
}

// poolParamsOf returns the params of the pool of target addr of route r; tlsCfg is the route's
// upstream TLS configuration (nil for http targets).
func poolParamsOf(r *conf.Route, s *conf.Server, addr string, tlsCfg *tls.Config) poolParams {
	return poolParams{
		addr:     addr,
		https:    strings.HasPrefix(r.Target, "https://"),
		tls:      tlsCfg,
		maxConns: r.Effective.MaxUpstreamConns,
		connect:  r.Effective.ConnectTimeout,
		header:   r.Effective.ResponseHeaderTimeout,
		write:    r.Effective.WriteTimeout,
		idle:     s.UpstreamIdleTimeout,
	}
}

// newUpstreamPool builds the pool of one target; dial connects (DNS at dial time).
func newUpstreamPool(pp poolParams, dial up.DialFunc) *upstreamPool {
	p := &upstreamPool{
		params: pp,
		slots:  limits.NewWorkerPool(pp.maxConns),
		dial:   dial,
		to:     upstreamTimeouts{header: pp.header, write: pp.write, idle: pp.idle},
	}
	p.tls = pp.tls
	return p
}

// Close retires the pool: package upstream closes the pool of a target that left its route.
func (p *upstreamPool) Close() error {
	p.retire()
	return nil
}

// errPoolExhausted: every connection slot of the target stayed in use for connect_timeout.
var errPoolExhausted = errors.New("gateway: upstream connection pool exhausted")

// acquire waits at most wait for a connection slot; false means none freed up in time. The
// slot is given back by release.
func (p *upstreamPool) acquire(wait time.Duration) bool { return p.slots.Acquire(wait) }

// release gives back a slot taken by acquire.
func (p *upstreamPool) release() { p.slots.Release() }

// conn lends an idle connection, the most recently used first, or dials a new one. It reports
// whether the connection was reused.
func (p *upstreamPool) conn() (*upstreamConn, bool, error) {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if c.lend(time.Now()) {
			return c, true, nil
		}
		// Idle too long, or the upstream closed it or sent bytes nobody asked for.
		c.kill()
	}
	c, err := p.dialConn()
	return c, false, err
}

// dialConn opens a new connection, the TLS handshake of an https target included, within
// connect_timeout (SPEC 14: the handshake counts against it).
func (p *upstreamPool) dialConn() (*upstreamConn, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), p.params.connect)
	defer cancel()
	raw, err := p.dial(ctx, p.params.addr)
	if err != nil {
		return nil, &dialError{err: err}
	}
	var c net.Conn = raw
	if p.tls != nil {
		// upstreamHandshake returns a *tlsHandshakeError: a 502 that says so, a failure of the
		// target, and an attempt that sent nothing (another target may be tried).
		if c, err = upstreamHandshake(raw, p.tls, start.Add(p.params.connect)); err != nil {
			return nil, err
		}
	}
	return newUpstreamConn(c, p), nil
}

// put takes a connection back once its response was read to the end. One that cannot be
// reused (reusable false, bytes beyond the response, a pool retired by a reload) is closed.
func (p *upstreamPool) put(c *upstreamConn, reusable bool) {
	now := time.Now()
	p.mu.Lock()
	keep := reusable && !p.retired
	p.mu.Unlock()
	if !keep || !c.idle(now) {
		c.kill()
		return
	}
	p.mu.Lock()
	if p.retired {
		p.mu.Unlock()
		c.kill()
		return
	}
	p.idle = append(p.idle, c)
	if p.sweep == nil && p.to.idle > 0 {
		p.sweep = time.AfterFunc(p.to.idle, p.sweepIdle)
	}
	p.mu.Unlock()
}

// sweepIdle closes the connections that sat idle longer than upstream_idle_timeout (the oldest
// are at the bottom of the stack), and runs again while connections stay idle. It is a timer,
// not a goroutine: nothing waits while the pool is empty.
func (p *upstreamPool) sweepIdle() {
	now := time.Now()
	var expired []*upstreamConn
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleSince) > p.to.idle {
		n++
	}
	expired = append(expired, p.idle[:n]...)
	copy(p.idle, p.idle[n:])
	for i := len(p.idle) - n; i < len(p.idle); i++ {
		p.idle[i] = nil
	}
	p.idle = p.idle[:len(p.idle)-n]
	p.sweep = nil
	if len(p.idle) > 0 && !p.retired {
		next := p.to.idle - now.Sub(p.idle[0].idleSince)
		p.sweep = time.AfterFunc(max(next, 10*time.Millisecond), p.sweepIdle)
	}
	p.mu.Unlock()
	for _, c := range expired {
		if c.state.CompareAndSwap(connIdle, connLent) {
			c.kill()
		}
	}
}

// retire closes the idle connections and makes the pool close those still lent when they come
// back: a reload replaced the route.
func (p *upstreamPool) retire() {
	p.mu.Lock()
	p.retired = true
	if p.sweep != nil {
		p.sweep.Stop()
		p.sweep = nil
	}
	p.mu.Unlock()
	p.closeIdle()
}

// closeIdle closes the idle connections.
func (p *upstreamPool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		if c.state.CompareAndSwap(connIdle, connLent) {
			c.kill()
		}
	}
}

var _ io.Closer = (*upstreamPool)(nil)
