package gateway

import (
	"bytes"
	"errors"
	"strings"

	"github.com/valyala/fasthttp"
)

// equalFold compares ASCII header names case-insensitively without allocating.
func equalFold(a, b []byte) bool { return bytes.EqualFold(a, b) }

// equalUnderscoreFold reports whether name equals the hyphenated header name h
// case-insensitively once its underscores are read as hyphens, and contains one.
func equalUnderscoreFold(name, h []byte) bool {
	if len(name) != len(h) || bytes.IndexByte(name, '_') < 0 {
		return false
	}
	for i, c := range name {
		if c == '_' {
			c = '-'
		}
		if c|0x20 != h[i]|0x20 {
			return false
		}
	}
	return true
}

// headerListHas reports whether the comma-separated token list (a Connection header value)
// names k.
func headerListHas(list, k []byte) bool {
	for len(list) > 0 {
		var tok []byte
		if i := bytes.IndexByte(list, ','); i >= 0 {
			tok, list = list[:i], list[i+1:]
		} else {
			tok, list = list, nil
		}
		if equalFold(bytes.TrimSpace(tok), k) {
			return true
		}
	}
	return false
}

// errBadFraming is the answer to any header-level framing ambiguity (SPEC 7).
var errBadFraming = errors.New("gateway: ambiguous or malformed request framing")

// validateHeaders applies the header-level rejects of SPEC 7 that fasthttp does not make
// itself, so that every request the gateway accepts has exactly one framing and one target.
// It runs on every request and does not allocate.
//
// The request line: fasthttp hands over the method, request-target and protocol it split at
// single spaces, and already refuses a missing part, a second space, tabs, control bytes and a
// version that is not HTTP/d.d (see TestSmugglingCorpus, class request-line). It accepts any
// HTTP/d.d, though: only HTTP/1.x passes here. The other request-line checks repeat what
// fasthttp v1.78 refuses, so that a more lenient fasthttp cannot open a hole unnoticed.
// fasthttp drops the request line's own terminator, so a bare LF ending it (RFC 9112 2.2 lets
// a recipient accept one) cannot be seen here.
//
// The header section, on the raw bytes (fasthttp lets chunked win over a Content-Length,
// accepts Transfer-Encoding: identity, tolerates spaces inside names and joins folded lines):
// Content-Length together with Transfer-Encoding; more than one Content-Length (fasthttp v1.78
// refuses that too) or one that is not plain decimal; a Transfer-Encoding other than a
// single "chunked" (any case); obsolete line folding; whitespace before a colon or any other
// non-token byte in a name; control bytes other than HTAB in values; a line not ending in CRLF.
//
// Host: mandatory from HTTP/1.1 on (RFC 9112 3.2). fasthttp checks it for "HTTP/1.1" only; a
// higher 1.x is processed as 1.1 (SPEC 7), so it needs one too.
func validateHeaders(h *fasthttp.RequestHeader) error {
	if !validRequestLine(h) {
		return errBadFraming
	}
	raw := h.RawHeaders()
	var nCL, nTE int
	for len(raw) > 0 {
		var line []byte
		i := bytes.IndexByte(raw, '\n')
		if i < 0 {
			line, raw = raw, nil
		} else {
			line, raw = raw[:i], raw[i+1:]
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		} else if i >= 0 {
			return errBadFraming // bare LF
		}
		if len(line) == 0 {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			return errBadFraming // obs-fold
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return errBadFraming
		}
		name, value := line[:colon], line[colon+1:]
		for _, c := range name {
			if !isTokenChar(c) {
				return errBadFraming // includes whitespace before the colon
			}
		}
		for _, c := range value {
			if (c < ' ' && c != '\t') || c == 0x7f {
				return errBadFraming // includes a bare CR
			}
		}
		switch {
		case equalFold(name, hdrContentLength):
			nCL++
			if nCL > 1 || !isDecimal(trimOWS(value)) {
				return errBadFraming
			}
		case equalFold(name, hdrTransferEncoding):
			nTE++
			if nTE > 1 || !equalFold(trimOWS(value), chunked) {
				return errBadFraming
			}
		case equalUnderscoreFold(name, hdrContentLength), equalUnderscoreFold(name, hdrTransferEncoding):
			// Content_Length or Transfer_Encoding: a CGI-style upstream (WSGI, PHP-FPM behind a
			// translator) maps "_" and "-" to the same variable and may frame by it.
			return errBadFraming
		}
	}
	if nCL > 0 && nTE > 0 {
		return errBadFraming
	}
	if host := h.Host(); len(host) > 0 && !validHost(host) {
		return errBadFraming // not host[:port] (SPEC 7; host.go)
	}
	if h.Protocol()[7] != '0' && len(h.Host()) == 0 {
		return errBadFraming
	}
	return nil
}

// validRequestLine checks `METHOD SP request-target SP HTTP/1.x` on the parts fasthttp split:
// the method is a token; the version is HTTP/1.0 to HTTP/1.9, case-sensitive; the target is
// origin-form ("/..."), absolute-form with an http or https scheme, "*" for OPTIONS, or
// anything for CONNECT (authority-form; the gateway answers CONNECT 501 later), and holds no
// control byte, space, DEL, "#" or backslash. A fragment is never part of a request-target
// (RFC 9112 3.2), and the gateway must route on the path it forwards: "/admin#x" would be
// matched as one path and reach the upstream as "/admin". A backslash is no separator to the
// gateway but one to some upstreams ("/api\..\admin"). Other bytes RFC 3986 does not allow
// ("|", "{", "[", non-ASCII, ...) are sent by real clients in queries and pass.
func validRequestLine(h *fasthttp.RequestHeader) bool {
	proto := h.Protocol()
	if len(proto) != len("HTTP/1.1") || !bytes.HasPrefix(proto, http1Prefix) || proto[7] < '0' || proto[7] > '9' {
		return false
	}
	method := h.Method()
	if len(method) == 0 {
		return false
	}
	for _, c := range method {
		if !isTokenChar(c) {
			return false
		}
	}
	target := h.RequestURI()
	if len(target) == 0 {
		return false
	}
	for _, c := range target {
		if c <= ' ' || c == 0x7f || c == '#' || c == '\\' {
			return false
		}
	}
	if !validPercentEncoding(target) {
		return false
	}
	switch {
	case target[0] == '/':
		return true
	case len(target) == 1 && target[0] == '*':
		return bytes.Equal(method, methodOptions)
	case bytes.Equal(method, methodConnect):
		return true
	}
	i := bytes.Index(target, schemeSep)
	if i < 0 {
		return false
	}
	scheme := target[:i]
	if !equalFold(scheme, schemeHTTP) && !equalFold(scheme, schemeHTTPS) {
		return false
	}
	// An http(s) URI with an empty host is invalid (RFC 9110 4.2.1), and one with userinfo is
	// refused too (RFC 9110 4.2.4 deprecates it; it only ever served to mislead): the authority
	// must be host[:port], as the Host header it replaces (validHost).
	auth, _ := targetAuthority(target)
	return validHost(auth)
}

// targetAuthority returns the authority of an absolute-form request-target
// (scheme://authority/path?query); ok is false for the other forms.
func targetAuthority(target []byte) (auth []byte, ok bool) {
	if len(target) == 0 || target[0] == '/' {
		return nil, false
	}
	i := bytes.Index(target, schemeSep)
	if i < 0 {
		return nil, false
	}
	auth = target[i+len(schemeSep):]
	if end := bytes.IndexAny(auth, "/?"); end >= 0 {
		auth = auth[:end]
	}
	return auth, true
}

var (
	http1Prefix   = []byte("HTTP/1.")
	methodOptions = []byte(fasthttp.MethodOptions)
	methodConnect = []byte(fasthttp.MethodConnect)
	schemeSep     = []byte("://")
	schemeHTTP    = []byte("http")
	schemeHTTPS   = []byte("https")
)

var (
	hdrTransferEncoding = []byte("Transfer-Encoding")
	hdrConnectionName   = []byte("Connection")
	chunked             = []byte("chunked")
	tokenClose          = []byte("close")
	protoHTTP11         = []byte("HTTP/1.1")
)

// isHigherHTTP1 reports HTTP/1.2 to HTTP/1.9.
func isHigherHTTP1(proto []byte) bool {
	return len(proto) == len(protoHTTP11) && bytes.HasPrefix(proto, http1Prefix) && proto[7] >= '2' && proto[7] <= '9'
}

// processAsHTTP11 makes an HTTP/1.2-1.9 request an HTTP/1.1 one (SPEC 7: a higher 1.x is
// processed as 1.1). fasthttp parsed its header as HTTP/1.0, so it marked the connection to close
// unless the client asked for keep-alive; the connection now stays open unless the client sent
// Connection: close, read from the raw header. fasthttp also refuses such a request when it
// carries Transfer-Encoding, before this hook runs: that case stays a 400 (README, known gaps).
func processAsHTTP11(h *fasthttp.RequestHeader) {
	h.SetProtocolBytes(protoHTTP11)
	h.ResetConnectionClose()
	raw := h.RawHeaders()
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte{'\n'})
		name, value, ok := bytes.Cut(line, []byte{':'})
		if ok && equalFold(name, hdrConnectionName) && headerListHas(bytes.TrimSpace(value), tokenClose) {
			h.SetConnectionClose()
			return
		}
	}
}

func isDecimal(b []byte) bool {
	if len(b) == 0 || len(b) > 18 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// isTokenChar reports an RFC 9110 tchar.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
