// This file owns the gateway's side of TLS on the listener: the certificate store built from
// server.tls, the TLS listener over socket.Listener, and the reload of both.
package gateway

import (
	"net"
	"sync/atomic"

	"toron/conf"
	listen "toron/listener"
	"toron/socket"
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
	// The client's sliding write window runs below TLS (socket.Windowed).
	tl, err := listen.NewTLS(socket.Listener{Listener: ln}, tlsOptions(t, g.tls.certs), g.set)
	if err != nil {
		return nil, err
	}
	g.tls.ln.Store(tl)
	return tl, nil
}

// reloadTLS puts the certificates and settings of cfg in force for new handshakes; open
// connections keep theirs. Load already read and checked every pair, so only a programming
// error can fail here; ReloadCompatible made sure TLS stays on or off.
// checkTLSReload reports what reloadTLS would refuse in cfg, changing nothing.
func (g *Gateway) checkTLSReload(cfg *conf.Config) error {
	t := cfg.Server.TLS
	if t == nil || g.tls.certs == nil {
		return nil
	}
	if err := listen.CheckCerts(listenerCerts(t)); err != nil {
		return err
	}
	return tlsOptions(t, g.tls.certs).Check()
}

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
