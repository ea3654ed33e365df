package gateway

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

// The HTTPS redirect listener of SPEC 20 (server.tls.http_redirect): a second, plaintext
// listener with its own fasthttp server and accept loop, answering every request with a
// redirect to the TLS listener except the health path, which it serves. Its connections are
// clientConns like the main listener's, served by the same hooks: the header deadline, the idle
// timeout, max_header_bytes, max_connections and the answer-before-the-body rule are the same
// slowloris defences, and a request is counted and logged like any other (route "none").
// decide tells its requests apart by their listener (listener.redirect). It drains with the
// main listener: Drain marks both, Shutdown closes both.

// redirectState is the redirect listener, when server.tls.http_redirect is configured.
type redirectState struct {
	srv *fasthttp.Server
	ln  atomic.Pointer[listener]
}

// ListenRedirect opens the HTTPS redirect listener on server.host and http_redirect.port; nil
// without http_redirect.
func (g *Gateway) ListenRedirect() (net.Listener, error) {
	s := g.Config().Server
	if s.TLS == nil || s.TLS.HTTPRedirect == nil {
		return nil, nil
	}
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.TLS.HTTPRedirect.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen on %s (server.tls.http_redirect): %w", addr, err)
	}
	// The main server's settings and hooks: the same defences (SPEC 20).
	g.redir.srv = g.newServer(&s)
	return ln, nil
}

// ServeRedirect serves the redirect listener's connections from ln, opened by ListenRedirect,
// until Shutdown. The PROXY
// protocol applies to it as to the main listener; TLS does not.
func (g *Gateway) ServeRedirect(ln net.Listener) error {
	l := newListener(g.proxyProtocol(ln), g)
	l.redirect = true
	g.redir.ln.Store(l)
	if g.shut.Load() {
		_ = l.Close() // Shutdown came first: Serve returns at its first Accept (as Serve)
	}
	return g.redir.srv.Serve(l)
}

// shutdownRedirect closes the redirect listener and waits for its requests until ctx is done.
func (g *Gateway) shutdownRedirect(ctx context.Context) error {
	if g.redir.srv == nil {
		return nil
	}
	err := g.redir.srv.ShutdownWithContext(ctx)
	if l := g.redir.ln.Load(); l != nil {
		// As in Shutdown: a ServeRedirect that stored its listener before fasthttp knew it.
		_ = l.Close()
		if err != nil {
			l.closeAll()
		}
	}
	return err
}
