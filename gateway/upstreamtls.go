package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"

	"toron/conf"
)

// upstreamSessionCacheSize is how many TLS sessions a route keeps for resumption: one per
// target address is enough (the cache is keyed by server name), a few spare for DNS names
// with several addresses.
const upstreamSessionCacheSize = 64

// upstreamTLSConfig builds the client TLS configuration of a route's https:// target
// (SPEC 14), once per route and load: verified against the system roots, or against
// tls_ca_file when set; the name sent as SNI and verified is tls_server_name, else the
// target's host (an IP address is verified against the certificate's IP SANs and sent as no
// SNI, as crypto/tls does). tls_insecure_skip_verify turns verification off (warned at load).
// It returns nil for an http:// target.
func upstreamTLSConfig(r *conf.Route) (*tls.Config, error) {
	u, err := url.Parse(r.Target)
	if err != nil {
		return nil, fmt.Errorf("gateway: route %q: target %q: %w", r.Name, r.Target, err)
	}
	if u.Scheme != "https" {
		return nil, nil
	}
	name := r.TLSServerName
	if name == "" {
		name = u.Hostname()
	}
	return &tls.Config{
		ServerName:         name,
		RootCAs:            r.TLSRootCAs, // nil: the system roots
		InsecureSkipVerify: r.TLSInsecureSkipVerify,
		MinVersion:         tls.VersionTLS12,
		// HTTP/1.1 only: an upstream that would pick h2 must not, fasthttp speaks HTTP/1.1.
		NextProtos:         []string{"http/1.1"},
		ClientSessionCache: tls.NewLRUClientSessionCache(upstreamSessionCacheSize),
	}, nil
}

// upstreamHandshake runs the client handshake on a freshly dialled connection, bounded by
// deadline (the dial's start plus connect_timeout: SPEC 14 counts the handshake against
// connect_timeout), for a target's pool and a tunnel alike. On error the connection is closed.
//
// The TLS layer sits on a windowedSocket: attachWriteWindow then puts the upstream
// connection's sliding write window below TLS, where a write blocked past its deadline can be
// judged by the bytes the upstream acknowledged (SPEC 5), as on a plain connection.
func upstreamHandshake(c net.Conn, cfg *tls.Config, deadline time.Time) (net.Conn, error) {
	tc := tls.Client(&windowedSocket{Conn: nonBlockingSocket(c)}, cfg)
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return nil, &tlsHandshakeError{err: err}
	}
	// The socket's deadline bounds the handshake (HandshakeContext would start a goroutine
	// per connection to watch a context).
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, &tlsHandshakeError{err: err}
	}
	// upstreamConn arms its own deadlines from here on.
	if err := c.SetDeadline(time.Time{}); err != nil {
		c.Close()
		return nil, &tlsHandshakeError{err: err}
	}
	return tc, nil
}

// tlsHandshakeError is a failed or timed-out TLS handshake with an upstream: a 502 that says
// so, and a failure of the target (SPEC 14).
type tlsHandshakeError struct{ err error }

func (e *tlsHandshakeError) Error() string {
	return "gateway: TLS handshake with the upstream failed: " + e.err.Error()
}
func (e *tlsHandshakeError) Unwrap() error { return e.err }

// rejUpstreamTLS answers a request whose upstream TLS handshake failed.
var rejUpstreamTLS = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
	"502 Bad Gateway: upstream TLS handshake failed", false)

// isTLSHandshakeError reports an upstream TLS handshake failure in err's chain.
func isTLSHandshakeError(err error) bool {
	var e *tlsHandshakeError
	return errors.As(err, &e)
}

// targetTLS is the TLS configuration of one target of a route: the route's, with the target's
// own host as the name sent and verified when tls_server_name is not set (the route's targets
// may be different hosts). nil for an http route.
func targetTLS(cfg *tls.Config, r *conf.Route, addr string) *tls.Config {
	if cfg == nil || r.TLSServerName != "" {
		return cfg
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == cfg.ServerName {
		return cfg
	}
	c := cfg.Clone()
	c.ServerName = host
	return c
}
