package gateway

import (
	"crypto/tls"
	"net"
	"sync/atomic"

	"toron/conf"
	listen "toron/listener"
	"toron/timeouts"
)

// tlsState is the gateway's side of TLS on the listener (SPEC 14): the certificate store
// built from server.tls at New (nil: plain HTTP), and the TLS listener once Serve wrapped the
// socket. (The package is imported as listen: the gateway's own listener type has the name.)
type tlsState struct {
	certs *listen.CertStore
	ln    atomic.Pointer[listen.TLS]
}

// protoHTTPS is X-Forwarded-Proto on a TLS listen.
var protoHTTPS = []byte("https")

// newTLSState builds the certificate store of cfg (nil state fields for plain HTTP).
func (g *Gateway) newTLSState(cfg *conf.Config) error {
	g.proto = protoHTTP
	t := cfg.Server.TLS
	if t == nil {
		return nil
	}
	store, err := listen.NewCertStore(listenerCerts(t), g.set)
	if err != nil {
		return err
	}
	g.tls.certs = store
	g.proto = protoHTTPS
	return nil
}

// listenerCerts turns server.tls.certs into the listener's certificates, named by cert_file
// for toron_tls_cert_expiry_timestamp_seconds.
func listenerCerts(t *conf.TLS) []listen.Cert {
	out := make([]listen.Cert, len(t.Certs))
	for i, c := range t.Certs {
		out[i] = listen.Cert{Name: c.CertFile, Certificate: c.Pair}
	}
	return out
}

func tlsOptions(t *conf.TLS, store *listen.CertStore) listen.TLSOptions {
	return listen.TLSOptions{
		Certs:            store,
		MinVersion:       t.Version(),
		ClientCAs:        t.ClientCAs,
		HandshakeTimeout: t.HandshakeTimeout,
	}
}

// wrapTLS returns ln itself for plain HTTP, else ln speaking TLS. The PROXY protocol, when
// on, sits below: ln is then its listener, whose header is read before the handshake.
func (g *Gateway) wrapTLS(ln net.Listener) (net.Listener, error) {
	if g.tls.certs == nil {
		return ln, nil
	}
	t := g.Config().Server.TLS
	// The client's sliding write window runs below TLS (windowedSocket).
	tl, err := listen.NewTLS(windowListener{ln}, tlsOptions(t, g.tls.certs), g.set)
	if err != nil {
		return nil, err
	}
	g.tls.ln.Store(tl)
	return tl, nil
}

// reloadTLS puts the certificates and settings of cfg in force for new handshakes; open
// connections keep theirs. Load already read and checked every pair, so only a programming
// error can fail here; ReloadCompatible made sure TLS stays on or off.
func (g *Gateway) reloadTLS(cfg *conf.Config) error {
	t := cfg.Server.TLS
	if t == nil || g.tls.certs == nil {
		return nil
	}
	if err := g.tls.certs.Swap(listenerCerts(t)); err != nil {
		return err
	}
	if tl := g.tls.ln.Load(); tl != nil {
		return tl.Update(tlsOptions(t, g.tls.certs))
	}
	return nil
}

// rawConn returns the socket below c's wrappers (TLS, the PROXY protocol), for what only the
// kernel can tell: a peer's FIN (peeker), the bytes it acknowledged (unackedBytes), the
// half-close of a lingering close. Wrappers expose it as NetConn, as *tls.Conn does.
func rawConn(c net.Conn) net.Conn {
	for {
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return c
		}
		inner := w.NetConn()
		if inner == nil || inner == c {
			return c
		}
		c = inner
	}
}

// windowListener hands out sockets whose writes the gateway can put under a client's sliding
// write window from below the TLS layer (windowedSocket).
type windowListener struct{ net.Listener }

func (l windowListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &windowedSocket{Conn: nonBlockingSocket(c)}, nil
}

// windowedSocket is the socket below a client's TLS layer. Once the gateway's connection
// attached its write window (attachWriteWindow), every write of TLS records goes through
// writeInWindow: a write blocked past its deadline is judged by what the client acknowledged
// and goes on while the client reads (SPEC 5, the slow-read defence). Above TLS that is
// impossible: after a write timeout crypto/tls's state is corrupt and the connection is lost,
// so a slow but steady reader behind a full send buffer would be cut. crypto/tls sees only the
// window's final verdict (timeouts.ErrSlowClient, ErrStalled), after which the connection is
// closed anyway.
type windowedSocket struct {
	net.Conn
	win *timeouts.Window // nil until attached: plain writes (the handshake's)
	// interrupted is writeInWindow's: an upstream connection's abort flag, nil for a client.
	interrupted *atomic.Bool
	// written, when set, counts the bytes the socket took (countSocketWrites).
	written *int64
}

func (s *windowedSocket) Write(p []byte) (n int, err error) {
	if s.win == nil {
		n, err = s.Conn.Write(p)
	} else {
		n, err = writeInWindow(s.Conn, s.win, p, s.interrupted)
	}
	if s.written != nil {
		*s.written += int64(n)
	}
	return n, err
}

// countSocketWrites makes the windowedSocket below c, if there is one, count the bytes it
// writes into n: the only count of what reached the socket once TLS frames the writes.
func countSocketWrites(c net.Conn, n *int64) {
	for {
		if ws, ok := c.(*windowedSocket); ok {
			ws.written = n
			return
		}
		inner, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		next := inner.NetConn()
		if next == nil || next == c {
			return
		}
		c = next
	}
}

// NetConn returns the socket, for rawConn.
func (s *windowedSocket) NetConn() net.Conn { return s.Conn }

// attachWriteWindow puts the writes of the windowedSocket below c, if there is one, under w
// (interrupted as writeInWindow's), and reports whether it did: the caller then writes to c
// without a window of its own. Called before the connection's first write of its own (at the
// accept; after the upstream dial).
func attachWriteWindow(c net.Conn, w *timeouts.Window, interrupted *atomic.Bool) bool {
	for {
		if ws, ok := c.(*windowedSocket); ok {
			ws.win, ws.interrupted = w, interrupted
			return true
		}
		inner, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return false
		}
		next := inner.NetConn()
		if next == nil || next == c {
			return false
		}
		c = next
	}
}

// isTLSConn reports a connection that encrypts: after a write deadline passed, its state is
// corrupt (crypto/tls: "all future writes will return the same error"), so a write that timed
// out cannot be retried the way a plain socket's can.
func isTLSConn(c net.Conn) bool {
	_, ok := c.(interface{ ConnectionState() tls.ConnectionState })
	return ok
}

var (
	_ net.Listener = windowListener{}
	_ net.Conn     = (*windowedSocket)(nil)
)
