package gateway

import (
	"bytes"
	"errors"
	"strings"

	"github.com/valyala/fasthttp"
)

// hopByHop are the headers of one connection, never forwarded in either direction (SPEC 7,
// RFC 9110 7.6.1), besides those the Connection header names.
var hopByHop = [][]byte{
	[]byte("Connection"),
	[]byte("Keep-Alive"),
	[]byte("Proxy-Connection"),
	[]byte("TE"),
	[]byte("Trailer"),
	[]byte("Transfer-Encoding"),
	[]byte("Upgrade"),
}

func isHopByHop(k []byte) bool {
	for _, h := range hopByHop {
		if equalFold(k, h) {
			return true
		}
	}
	return false
}

// equalFold compares ASCII header names case-insensitively without allocating.
func equalFold(a, b []byte) bool { return bytes.EqualFold(a, b) }

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

// copyResponseHeaders copies the upstream's end-to-end response headers to the client response.
// Content-Length and framing are set by the body that follows.
func copyResponseHeaders(dst, src *fasthttp.ResponseHeader) {
	connTokens := src.Peek(fasthttp.HeaderConnection)
	for k, v := range src.All() {
		if isHopByHop(k) || headerListHas(connTokens, k) || equalFold(k, hdrContentLength) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// errBadFraming is the answer to any header-level framing ambiguity (SPEC 7).
var errBadFraming = errors.New("gateway: ambiguous or malformed request framing")

// validateHeaders applies the header-level rejects of SPEC 7 that fasthttp does not make
// itself, on the raw header bytes (fasthttp keeps only the last Content-Length and lets chunked
// win over a Content-Length): Content-Length together with Transfer-Encoding; more than one
// Content-Length or one that is not plain decimal; a Transfer-Encoding other than a single
// "chunked"; obsolete line folding; whitespace before a colon; control bytes other than HTAB in
// names or values; a protocol other than HTTP/1.x.
func validateHeaders(h *fasthttp.RequestHeader) error {
	proto := h.Protocol()
	if len(proto) < len("HTTP/1.0") || !bytes.HasPrefix(proto, []byte("HTTP/1.")) {
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
				return errBadFraming
			}
		}
		value = bytes.Trim(value, " \t")
		switch {
		case equalFold(name, hdrContentLength):
			nCL++
			if nCL > 1 || !isDecimal(value) {
				return errBadFraming
			}
		case equalFold(name, hdrTransferEncoding):
			nTE++
			if nTE > 1 || !equalFold(value, chunked) {
				return errBadFraming
			}
		}
	}
	if nCL > 0 && nTE > 0 {
		return errBadFraming
	}
	return nil
}

var (
	hdrTransferEncoding = []byte("Transfer-Encoding")
	chunked             = []byte("chunked")
)

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
