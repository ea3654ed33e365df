// This file owns upstream TLS (SPEC 14): a route's client configuration, a target's own
// server name, and the handshake inside connect_timeout.
package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"toron/socket"
)

// upstreamSessionCacheSize is how many TLS sessions a route keeps for resumption: one per
// target address is enough (the cache is keyed by server name), a few spare for DNS names
// with several addresses.
const upstreamSessionCacheSize = 64

// TLSOptions are a route's upstream TLS settings (SPEC 14).
type TLSOptions struct {
	// Route names the route in errors.
	Route string
	// Target is the route's target URL; only an https:// one gets a configuration.
	Target string
	// ServerName is tls_server_name: the name sent as SNI and verified; empty: the target's host.
	ServerName string
	// RootCAs are tls_ca_file's; nil: the system roots.
	RootCAs *x509.CertPool
	// InsecureSkipVerify is tls_insecure_skip_verify (warned at load).
	InsecureSkipVerify bool
}

// TLSConfig builds the client TLS configuration of a route's https:// target (SPEC 14), once
// per route and load: verified against the system roots, or against tls_ca_file when set; the
// name sent as SNI and verified is tls_server_name, else the target's host (an IP address is
// verified against the certificate's IP SANs and sent as no SNI, as crypto/tls does).
// tls_insecure_skip_verify turns verification off. It returns nil for an http:// target.
func TLSConfig(o TLSOptions) (*tls.Config, error) {
	u, err := url.Parse(o.Target)
	if err != nil {
		return nil, fmt.Errorf("gateway: route %q: target %q: %w", o.Route, o.Target, err)
	}
	if u.Scheme != "https" {
		return nil, nil
	}
	name := o.ServerName
	if name == "" {
		name = u.Hostname()
	}
	return &tls.Config{
		ServerName:         name,
		RootCAs:            o.RootCAs, // nil: the system roots
		InsecureSkipVerify: o.InsecureSkipVerify,
		MinVersion:         tls.VersionTLS12,
		// HTTP/1.1 only: an upstream that would pick h2 must not, fasthttp speaks HTTP/1.1.
		NextProtos:         []string{"http/1.1"},
		ClientSessionCache: tls.NewLRUClientSessionCache(upstreamSessionCacheSize),
	}, nil
}

// Handshake runs the client handshake on a freshly dialled connection, bounded by
// deadline (the dial's start plus connect_timeout: SPEC 14 counts the handshake against
// connect_timeout), for a target's pool and a tunnel alike. On error the connection is closed.
//
// The TLS layer sits on a socket.Windowed: socket.AttachWriteWindow then puts the upstream
// connection's sliding write window below TLS, where a write blocked past its deadline can be
// judged by the bytes the upstream acknowledged (SPEC 5), as on a plain connection.
func Handshake(c net.Conn, cfg *tls.Config, deadline time.Time) (net.Conn, error) {
	tc := tls.Client(&socket.Windowed{Conn: socket.NonBlocking(c)}, cfg)
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return nil, &TLSHandshakeError{err: err}
	}
	// The socket's deadline bounds the handshake (HandshakeContext would start a goroutine
	// per connection to watch a context).
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, &TLSHandshakeError{err: err}
	}
	// Conn arms its own deadlines from here on.
	if err := c.SetDeadline(time.Time{}); err != nil {
		c.Close()
		return nil, &TLSHandshakeError{err: err}
	}
	return tc, nil
}

// TLSHandshakeError is a failed or timed-out TLS handshake with an upstream: a 502 that says
// so, and a failure of the target (SPEC 14).
type TLSHandshakeError struct{ err error }

func (e *TLSHandshakeError) Error() string {
	return "gateway: TLS handshake with the upstream failed: " + e.err.Error()
}

// Unwrap returns the handshake's own error.
func (e *TLSHandshakeError) Unwrap() error { return e.err }

// IsTLSHandshakeError reports an upstream TLS handshake failure in err's chain.
func IsTLSHandshakeError(err error) bool {
	var e *TLSHandshakeError
	return errors.As(err, &e)
}

// TargetTLS is the TLS configuration of one target of a route: the route's, with the target's
// own host as the name sent and verified when tls_server_name (serverName) is not set (the
// route's targets may be different hosts). nil for an http route.
func TargetTLS(cfg *tls.Config, serverName, addr string) *tls.Config {
	if cfg == nil || serverName != "" {
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
