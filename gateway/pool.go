package gateway

import (
	"crypto/tls"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"toron/conf"
	"toron/limits"
)

// upstreamClient is one upstream connection of a route: a HostClient of at most one
// connection, whose dial hook records the connection. Between requests it waits in the route's
// upstreamPool with its connection open (keep-alive, up to upstream_idle_timeout). Knowing the
// connection lets the pool check it before lending it, and the watch of an elevated request
// abort exactly it (watch.go).
type upstreamClient struct {
	hc    *fasthttp.HostClient
	up    atomic.Pointer[upstreamConn]
	watch atomic.Pointer[clientWatch]
}

func (uc *upstreamClient) onDial(c *upstreamConn) {
	uc.up.Store(c)
	if w := uc.watch.Load(); w != nil && w.gone.Load() {
		c.abort()
	}
}

// upstreamPool holds a route's upstream clients: at most max_upstream_conns lent at once
// (slots), the idle ones in a stack, so that the most recently used connection is lent first
// and the others run out their idle time.
//
// Why not one shared fasthttp HostClient per route: it picks the connection inside Do, after
// the request's body was read from the client, and never checks an idle connection before
// using it. An upstream that closed an idle connection (its keep-alive timeout shorter than
// upstream_idle_timeout) then fails a request with a body, which SPEC 3 forbids retrying once
// body bytes were read: a 502 for a request the upstream never saw. Here the connection is
// checked when it is lent, before any body byte is read.
type upstreamPool struct {
	route  *conf.Route
	server *conf.Server
	slots  *limits.WorkerPool
	// addr is the target's host:port, the Host of a request that came without one.
	addr string

	mu      sync.Mutex
	idle    []*upstreamClient
	retired bool

	// tls is the route's upstream TLS configuration, nil for http:// (upstreamtls.go).
	tls *tls.Config
}

// newUpstreamPool builds a route's pool with one idle client, so that a target fasthttp cannot
// use fails here, when the configuration is loaded, not on the first request.
func newUpstreamPool(r *conf.Route, s *conf.Server) (*upstreamPool, error) {
	p := &upstreamPool{route: r, server: s, slots: limits.NewWorkerPool(r.Effective.MaxUpstreamConns)}
	var err error
	if p.tls, err = upstreamTLSConfig(r); err != nil {
		return nil, err
	}
	uc, err := p.newClient()
	if err != nil {
		return nil, err
	}
	p.addr = uc.hc.Addr
	p.idle = append(p.idle, uc)
	return p, nil
}

func (p *upstreamPool) newClient() (*upstreamClient, error) {
	uc := &upstreamClient{}
	hc, err := newHostClient(p.route, p.server, uc.onDial, p.tls)
	if err != nil {
		return nil, err
	}
	uc.hc = hc
	return uc, nil
}

// get waits at most wait for a connection slot, then lends an idle client or a new one. It
// reports false when no slot freed up in time. A lent client's connection that sat idle longer
// than staleCheckAfter is checked first, and closed when the upstream closed it: the request
// then dials anew.
func (p *upstreamPool) get(wait time.Duration) (*upstreamClient, bool, error) {
	if !p.slots.Acquire(wait) {
		return nil, false, nil
	}
	p.mu.Lock()
	var uc *upstreamClient
	if n := len(p.idle); n > 0 {
		uc = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()
	if uc != nil {
		if c := uc.up.Load(); c != nil && c.closedWhileIdle() {
			uc.hc.CloseIdleConnections()
		}
		return uc, true, nil
	}
	uc, err := p.newClient()
	if err != nil {
		p.slots.Release()
		return nil, false, err
	}
	return uc, true, nil
}

// put takes a client back once its response was released. A client whose request was aborted
// for a departed client, whose watch is still running (a panic skipped the halt), or that
// comes back to a pool retired by a reload is not kept: its connection is closed.
func (p *upstreamPool) put(uc *upstreamClient, reusable bool) {
	if w := uc.watch.Load(); w != nil {
		w.halt()
		reusable = false
	}
	p.mu.Lock()
	keep := reusable && !p.retired
	if keep {
		p.idle = append(p.idle, uc)
	}
	p.mu.Unlock()
	if !keep {
		uc.hc.CloseIdleConnections()
	}
	p.slots.Release()
}

// retire closes the idle clients' connections and makes the pool close those of the clients
// still lent when they come back: a reload replaced the route.
func (p *upstreamPool) retire() {
	p.mu.Lock()
	p.retired = true
	p.mu.Unlock()
	p.closeIdle()
}

// closeIdle closes the idle clients' connections; the clients stay for the next requests.
func (p *upstreamPool) closeIdle() {
	p.mu.Lock()
	idle := append([]*upstreamClient(nil), p.idle...)
	p.mu.Unlock()
	for _, uc := range idle {
		uc.hc.CloseIdleConnections()
	}
}
