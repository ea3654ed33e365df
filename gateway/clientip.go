package gateway

import (
	"bytes"
	"net/netip"
	"unsafe"

	"github.com/valyala/fasthttp"

	"toron/conf"
	listen "toron/listener"
)

// The client's identity (SPEC 16).
//
// The peer is the TCP peer, or the source of the PROXY header when that protocol is on (the
// listener's connection reports it as RemoteAddr). The client IP is the peer, unless the peer
// is one of server.trusted_proxies: then X-Forwarded-For, all its lines read as one list, is
// walked from the right, and the first address that is not trusted is the client; when every
// address is trusted the leftmost is; a malformed entry stops the walk and the last trusted
// address read (possibly the peer itself) is the client. Reading from the right is what makes
// the header safe: each trusted proxy appends the address it saw, so the entries right of the
// first untrusted one were written by proxies we trust, and whatever is left of it may be
// forged by the client.
//
// The client IP is resolved once per request, in decide, and kept on the exchange: the access
// log, X-Real-IP, rate_limit and the balancer's client_ip_hash all read x.clientIP, so they
// never disagree.

// trustedSet is server.trusted_proxies, parsed. A gateway has a handful of trusted ranges, so a
// linear scan costs less than any tree and allocates nothing.
type trustedSet []netip.Prefix

// newTrustedSet parses the validated trusted_proxies of cfg.
func newTrustedSet(cfg *conf.Config) (trustedSet, error) {
	return conf.ParsePrefixes(cfg.Server.TrustedProxies)
}

func (s trustedSet) contains(a netip.Addr) bool {
	for _, p := range s {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// resolveClientIP sets the peer, the client IP and how the peer's forwarded headers are
// treated (SPEC 16). h has passed validateHeaders.
func (x *exchange) resolveClientIP(h *fasthttp.RequestHeader) {
	x.peer = listen.AddrIP(x.ctx().RemoteAddr())
	x.clientIP = x.peer
	x.untrustedPeer, x.trustedPeer = false, false
	ts := x.snap.trusted
	switch {
	case len(ts) == 0:
		// The default: nobody is trusted, and the forwarded headers are those of SPEC 7.
		return
	case !ts.contains(x.peer):
		x.untrustedPeer = true
		return
	}
	x.trustedPeer = true
	x.clientIP = clientFromXFF(h.PeekAll(fasthttp.HeaderXForwardedFor), ts, x.peer)
}

// clientFromXFF walks the X-Forwarded-For lines from the right (SPEC 16); peer is trusted.
func clientFromXFF(lines [][]byte, ts trustedSet, peer netip.Addr) netip.Addr {
	last := peer // the last trusted address read
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for len(line) > 0 {
			var entry []byte
			if j := bytes.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, nil
			}
			entry = trimOWS(entry)
			if len(entry) == 0 {
				// An empty list element ("a, , b"): recipients ignore them (RFC 9110 5.6.1).
				continue
			}
			a, ok := parseForwardedAddr(entry)
			switch {
			case !ok:
				return last
			case !ts.contains(a):
				return a
			}
			last = a
		}
	}
	return last
}

// parseForwardedAddr parses one X-Forwarded-For entry: an IPv4 or IPv6 address, optionally
// with a port as some proxies write it ("192.0.2.1:4711", "[2001:db8::1]:4711", "[2001:db8::1]").
// Zones, "unknown", obfuscated identifiers and anything else are malformed.
func parseForwardedAddr(b []byte) (netip.Addr, bool) {
	if b[0] == '[' {
		end := bytes.IndexByte(b, ']')
		if end < 0 || !validPortSuffix(b[end+1:]) {
			return netip.Addr{}, false
		}
		b = b[1:end]
	} else if i := bytes.IndexByte(b, ':'); i >= 0 && bytes.IndexByte(b[i+1:], ':') < 0 {
		// One colon: IPv4 with a port. (Two or more: IPv6 without brackets.)
		if !validPortSuffix(b[i:]) {
			return netip.Addr{}, false
		}
		b = b[:i]
	}
	if len(b) == 0 || len(b) > len("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255") || bytes.IndexByte(b, '%') >= 0 {
		return netip.Addr{}, false
	}
	// netip.ParseAddr keeps nothing of its argument once zones are excluded, so the header
	// bytes are passed without the copy a string conversion would allocate.
	a, err := netip.ParseAddr(unsafe.String(unsafe.SliceData(b), len(b)))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// validPortSuffix accepts "" or ":" followed by 1 to 5 digits.
func validPortSuffix(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if b[0] != ':' || len(b) < 2 || len(b) > 6 {
		return false
	}
	for _, c := range b[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// trimOWS trims spaces and tabs (RFC 9110 optional whitespace).
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// clientIPOf returns the request's client IP, or the connection's peer for a request refused
// before decide resolved it (fasthttp refused its headers, or they were malformed).
func (x *exchange) clientIPOf() netip.Addr {
	if x.clientIP.IsValid() {
		return x.clientIP
	}
	return listen.AddrIP(x.conn.RemoteAddr())
}

// ipTextOf returns the client IP a as text, in the exchange's buffer: X-Real-IP's value and
// the access line's client_ip. The text is made again only when a differs from the address it
// was made for (a connection's requests mostly share their client IP), so the address is
// formatted once per connection rather than twice per request.
func (x *exchange) ipTextOf(a netip.Addr) []byte {
	if a != x.ipTextAddr || len(x.ipText) == 0 {
		x.ipText = a.AppendTo(x.ipText[:0])
		x.ipTextAddr = a
	}
	return x.ipText
}

// The forwarded headers a request from an untrusted peer loses once trusted_proxies is set
// (SPEC 16), so that the upstream sees only what Toron vouches for.
var (
	hdrXForwardedPrefix = []byte("X-Forwarded-Prefix")
	hdrXRealIP          = []byte("X-Real-IP")
	hdrForwarded        = []byte("Forwarded")
)

// dropsIdentityHeader reports a request header prepareRequest must not copy: X-Real-IP always
// (forwardIdentity sets it), an identity header spelled with '_' for '-' always, and from an
// untrusted peer with trusted_proxies set also X-Forwarded-For, X-Forwarded-Proto,
// X-Forwarded-Host, X-Forwarded-Prefix and Forwarded.
func (x *exchange) dropsIdentityHeader(k []byte) bool {
	if equalFold(k, hdrXRealIP) {
		return true
	}
	if bytes.IndexByte(k, '_') >= 0 && underscoreIdentity(k) {
		return true
	}
	return x.untrustedPeer && (equalFold(k, hdrXForwardedFor) || equalFold(k, hdrXForwardedProto) ||
		equalFold(k, hdrXForwardedHost) || equalFold(k, hdrXForwardedPrefix) || equalFold(k, hdrForwarded))
}

// underscoreIdentity reports k, which holds a '_', as one of the identity headers with '_' in
// place of '-' (X_Forwarded_For, x_real_ip, X-Forwarded_Host; any case), whatever the peer
// (SPEC 16): upstreams that map header names to CGI variables (HTTP_X_FORWARDED_FOR, as CGI,
// PHP and WSGI do) would read it as the real one, next to or in place of Toron's. Forwarded has
// no '-' to spell otherwise.
func underscoreIdentity(k []byte) bool {
	return equalUnderscoreFold(k, hdrXForwardedFor) || equalUnderscoreFold(k, hdrXRealIP) ||
		equalUnderscoreFold(k, hdrXForwardedProto) || equalUnderscoreFold(k, hdrXForwardedHost) ||
		equalUnderscoreFold(k, hdrXForwardedPrefix)
}

// forwardIdentity finishes the forwarded headers of the upstream request out (SPEC 16): a
// trusted peer's X-Forwarded-Proto and X-Forwarded-Host are kept when it sent them (in place of
// Toron's own, set just before), and X-Real-IP is the client IP.
func (x *exchange) forwardIdentity(in, out *fasthttp.RequestHeader) {
	if x.trustedPeer {
		if v := in.PeekBytes(hdrXForwardedProto); len(v) > 0 {
			out.SetBytesKV(hdrXForwardedProto, v)
		}
		if v := in.PeekBytes(hdrXForwardedHost); len(v) > 0 {
			out.SetBytesKV(hdrXForwardedHost, v)
		}
	}
	out.SetBytesKV(hdrXRealIP, x.ipTextOf(x.clientIP))
}
