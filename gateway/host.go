package gateway

import "bytes"

// validHost reports whether h (a Host header value, or the authority of an absolute-form
// target) is host[:port] (SPEC 7, RFC 9110 7.2, RFC 3986 3.2.2): a host name of letters,
// digits, '-', '.' and '_' (container and service names use underscores), an IPv4 address, or
// an IPv6 literal in brackets; then optionally ':' and a port of one to five digits, at most
// 65535. Anything else is refused, before routing: userinfo ("evil@127.0.0.1", which fasthttp's
// client would turn into an Authorization header upstream), a second authority hidden after the
// port ("a.example.com:@b.example.com", routed as a.example.com and forwarded raw), spaces, an
// empty or non-numeric port, percent-encoding, non-ASCII bytes. Empty is refused too: the
// caller decides whether a request may come without a Host.
func validHost(h []byte) bool {
	var rest []byte
	if len(h) > 0 && h[0] == '[' {
		end := bytes.IndexByte(h, ']')
		if end < 2 {
			return false
		}
		for _, c := range h[1:end] {
			if !isHexDigit(c) && c != ':' && c != '.' {
				return false
			}
		}
		rest = h[end+1:]
	} else {
		name := h
		if i := bytes.IndexByte(h, ':'); i >= 0 {
			name, rest = h[:i], h[i:]
		}
		if len(name) == 0 {
			return false
		}
		for _, c := range name {
			if !isHostChar(c) {
				return false
			}
		}
	}
	if len(rest) == 0 {
		return true
	}
	port := rest[1:]
	if rest[0] != ':' || len(port) == 0 || len(port) > 5 {
		return false
	}
	n := 0
	for _, c := range port {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n <= 65535
}

func isHostChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
}

func isHexDigit(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// validPercentEncoding reports whether every '%' of the request-target's path (the part before
// '?') starts a percent-encoded octet, '%' and two hex digits (RFC 3986 2.1). A malformed one is
// a 400 before routing, as in Go's net/http and nginx: upstreams disagree about what "%6%63"
// means, and a lenient one decodes "/%6%63egacy" into a path the gateway did not match (its
// bulkhead and limits would be skipped). The query is forwarded as sent and not checked.
func validPercentEncoding(target []byte) bool {
	if i := bytes.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	for {
		i := bytes.IndexByte(target, '%')
		if i < 0 {
			return true
		}
		if i+2 >= len(target) || !isHexDigit(target[i+1]) || !isHexDigit(target[i+2]) {
			return false
		}
		target = target[i+3:]
	}
}
