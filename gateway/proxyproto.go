package gateway

import (
	"net"
	"time"

	"toron/conf"
	listenerpkg "toron/listener" // the gateway has a type named listener (conn.go)
)

// proxyProtocol wraps the TCP listener for server.proxy_protocol (SPEC 16); without it, ln is
// returned as it is. A refused connection (a source outside allow, no valid header within the
// timeout) has no request and no route: it is counted in
// toron_rejected_total{route="none",reason="proxy_protocol"}. The peer the PROXY header names is
// the connection's RemoteAddr, which resolveClientIP and trusted_proxies see.
func (g *Gateway) proxyProtocol(ln net.Listener) net.Listener {
	pp := g.Config().Server.ProxyProtocol
	if !pp.Enabled {
		return ln
	}
	allow, err := conf.ParsePrefixes(pp.Allow)
	if err != nil {
		// Not reachable: validation parsed the same list.
		panic("BUG: gateway: invalid proxy_protocol.allow after validation: " + err.Error())
	}
	return listenerpkg.NewProxyProtocol(ln, listenerpkg.ProxyProtocol{
		Allow: allow,
		// The timeout follows the configuration in force; enabled and allow cannot change on
		// reload (conf.ReloadCompatible).
		Timeout:  func() time.Duration { return g.Config().Server.ProxyProtocol.Timeout },
		OnReject: g.none.rejected[reasonProxyProtocol].Inc,
	})
}
