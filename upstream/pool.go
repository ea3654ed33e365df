// This file owns Pool, one target's upstream connections: the slots of max_upstream_conns,
// the idle stack lent from the top, the idle sweep, and the dial (with the TLS handshake).
package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Slots bounds the connections of a pool that are lent at once (max_upstream_conns). The
// gateway passes a limits.WorkerPool (FIFO hand-over, no allocation): package upstream does
// not import limits (STYLE 1), so the pool takes the small interface it needs.
type Slots interface {
	// Acquire waits at most wait for a slot; false means none freed up in time.
	Acquire(wait time.Duration) bool
	// Release gives back a slot taken by Acquire.
	Release()
}

// Pool holds one target's upstream connections (SPEC 13: each target of a route has
// its own pool, attached to it with Target.Attach): at most max_upstream_conns lent at once
// (slots), the idle ones in a stack, so that the most recently used connection is lent first
// and the others run out their idle time (sweepIdle closes them after upstream_idle_timeout).
//
// A connection is checked when it is lent, before any body byte is read from the client: one
// that the upstream closed while idle, or that received bytes nobody asked for, is found by a
// non-blocking peek (Conn.lend) and closed, and the request dials anew. A request with
// a body is never replayed (SPEC 3 step 9), so this check is what keeps a POST after an
// upstream's keep-alive timeout from failing with a 502.
type Pool struct {
	params PoolParams
	slots  Slots
	// tls is the client configuration of an https target; nil for http.
	tls  *tls.Config
	dial DialFunc
	to   connTimeouts

	mu      sync.Mutex
	idle    []*Conn // the oldest at the bottom, lent from the top
	retired bool
	sweep   *time.Timer // closes expired idle connections (sweepIdle); nil while none is idle
}

// PoolParams are the settings a pool is built from. A reload that keeps a target with the same
// params keeps its pool and its warm connections; any change builds a new pool and retires the
// old one (its connections close as their requests end).
type PoolParams struct {
	// Addr is the target's host:port, dialed.
	Addr string
	// HTTPS says the target is an https:// one.
	HTTPS bool
	// TLS is the target's client TLS configuration (TargetTLS), built at each load: an https
	// target gets a new pool at every reload, so that a changed CA file takes effect.
	TLS *tls.Config
	// MaxConns is max_upstream_conns.
	MaxConns int
	// Connect is connect_timeout, the dial and the TLS handshake included (SPEC 14).
	Connect time.Duration
	// Header is response_header_timeout, then the inactivity window of the response body.
	Header time.Duration
	// Write is write_timeout, the sliding window of writes to the upstream.
	Write time.Duration
	// Idle is upstream_idle_timeout: how long a connection waits in the pool.
	Idle time.Duration
}

// NewPool builds the pool of one target; dial connects (DNS at dial time), slots bounds the
// connections lent at once (pp.MaxConns of them).
func NewPool(pp PoolParams, dial DialFunc, slots Slots) *Pool {
	p := &Pool{
		params: pp,
		slots:  slots,
		dial:   dial,
		to:     connTimeouts{header: pp.Header, write: pp.Write, idle: pp.Idle},
	}
	p.tls = pp.TLS
	return p
}

// Params returns the settings the pool was built from.
func (p *Pool) Params() PoolParams { return p.params }

// Close retires the pool: a Set closes the pool of a target that left its route.
func (p *Pool) Close() error {
	p.Retire()
	return nil
}

// ErrPoolExhausted reports that every connection slot of the target stayed in use for connect_timeout.
var ErrPoolExhausted = errors.New("gateway: upstream connection pool exhausted")

// Acquire waits at most wait for a connection slot; false means none freed up in time. The
// slot is given back by Release.
func (p *Pool) Acquire(wait time.Duration) bool { return p.slots.Acquire(wait) }

// Release gives back a slot taken by Acquire.
func (p *Pool) Release() { p.slots.Release() }

// lend lends an idle connection, the most recently used first, or dials a new one. It reports
// whether the connection was reused.
func (p *Pool) lend() (*Conn, bool, error) {
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
		c.Kill()
	}
	c, err := p.dialConn()
	return c, false, err
}

// dialConn opens a new connection of the pool (Dial).
func (p *Pool) dialConn() (*Conn, error) {
	c, err := Dial(p.dial, p.params.Addr, p.tls, p.params.Connect)
	if err != nil {
		return nil, err
	}
	return newUpstreamConn(c, p), nil
}

// Dial opens a connection to addr, the TLS handshake of an https target (cfg not nil)
// included, within connect (SPEC 14: the handshake counts against connect_timeout): a pool's
// connection, or a WebSocket tunnel's own, which is never pooled. A failed dial is a
// *DialError, a failed handshake a *TLSHandshakeError: both a 502 that says so, a failure of
// the target, and an attempt that sent nothing (another target may be tried).
func Dial(dial DialFunc, addr string, cfg *tls.Config, connect time.Duration) (net.Conn, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), connect)
	defer cancel()
	raw, err := dial(ctx, addr)
	if err != nil {
		return nil, &DialError{Err: err}
	}
	if cfg == nil {
		return raw, nil
	}
	return Handshake(raw, cfg, start.Add(connect))
}

// Put takes a connection back once its response was read to the end. One that cannot be
// reused (reusable false, bytes beyond the response, a pool retired by a reload) is closed.
func (p *Pool) Put(c *Conn, reusable bool) {
	now := time.Now()
	p.mu.Lock()
	keep := reusable && !p.retired
	p.mu.Unlock()
	if !keep || !c.idle(now) {
		c.Kill()
		return
	}
	p.mu.Lock()
	if p.retired {
		p.mu.Unlock()
		c.Kill()
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
func (p *Pool) sweepIdle() {
	now := time.Now()
	var expired []*Conn
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
			c.Kill()
		}
	}
}

// Retire closes the idle connections and makes the pool close those still lent when they come
// back: a reload replaced the route.
func (p *Pool) Retire() {
	p.mu.Lock()
	p.retired = true
	if p.sweep != nil {
		p.sweep.Stop()
		p.sweep = nil
	}
	p.mu.Unlock()
	p.CloseIdle()
}

// CloseIdle closes the idle connections.
func (p *Pool) CloseIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		if c.state.CompareAndSwap(connIdle, connLent) {
			c.Kill()
		}
	}
}

// Idle returns the idle connections, the most recently used last (for tests).
func (p *Pool) Idle() []*Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Conn(nil), p.idle...)
}

var _ io.Closer = (*Pool)(nil)
