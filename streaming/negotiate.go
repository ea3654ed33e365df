package streaming

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// DefaultCompressTypes are the media types compressed when a route's compress block lists
// none (SPEC 20). A wildcard such as text/* never matches text/event-stream: an event stream
// is compressed only when its type is listed by name.
var DefaultCompressTypes = []string{"text/*", "application/json", "application/javascript", "application/xml", "image/svg+xml", "application/wasm"}

// DefaultCompressMinBytes is the smallest declared body compressed: below 1 KiB the coding's
// framing and the CPU cost more than the bytes saved (nginx's gzip_min_length is 20 bytes,
// Caddy's minimum_length 512; 1 KiB is SPEC 20's).
const DefaultCompressMinBytes = 1024

// eventStream is the one type a wildcard never matches.
const eventStream = "text/event-stream"

// CompressPolicy is one route's compress settings, built once from the configuration and
// read-only afterwards.
type CompressPolicy struct {
	// Encodings are the codings offered, in the route's order of preference (ties of the
	// client's q-values go to the earlier one). Empty turns compression off.
	Encodings []Encoding
	// MinBytes: a response whose Content-Length is below it is sent as it is.
	MinBytes int64
	// Types are lower-case media types ("application/json") and wildcards ("text/*").
	Types []string
}

// Apply decides whether the response in resp, an answer to the request with header req, is
// compressed, and edits resp to match (SPEC 20); contentLength is the upstream's declared body
// length, -1 when unknown. A response of a compressible type gets Vary: Accept-Encoding
// whatever is decided. When it returns a coding other than Identity, resp has that
// Content-Encoding, no Accept-Ranges, a weak ETag, and the body must be sent with an unknown
// length (chunked) through CopyCompressed. It does not allocate.
func (p *CompressPolicy) Apply(req *fasthttp.RequestHeader, resp *fasthttp.ResponseHeader, contentLength int64) Encoding {
	if p == nil || len(p.Encodings) == 0 {
		return Identity
	}
	switch st := resp.StatusCode(); {
	case st < 200, st == fasthttp.StatusNoContent, st == fasthttp.StatusPartialContent, st == fasthttp.StatusNotModified:
		return Identity
	}
	if !p.compressible(resp.ContentType()) {
		return Identity
	}
	addVary(resp)
	switch {
	case req.IsHead():
		return Identity
	case len(resp.ContentEncoding()) > 0 && !equalFoldASCII(resp.ContentEncoding(), "identity"):
		return Identity
	case contentLength >= 0 && contentLength < p.MinBytes:
		return Identity
	case hasNoTransform(resp):
		return Identity
	}
	e := Negotiate(req.Peek(fasthttp.HeaderAcceptEncoding), p.Encodings)
	if e == Identity {
		return Identity
	}
	resp.SetContentEncoding(e.String())
	resp.Del(fasthttp.HeaderAcceptRanges)
	weakenETag(resp)
	return e
}

// compressible reports whether the media type of ct (parameters ignored) is in p.Types.
func (p *CompressPolicy) compressible(ct []byte) bool {
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	if len(ct) == 0 {
		return false
	}
	for _, t := range p.Types {
		if len(t) > 2 && t[len(t)-2:] == "/*" {
			major := t[:len(t)-1] // "text/"
			if len(ct) > len(major) && equalFoldASCII(ct[:len(major)], major) && !equalFoldASCII(ct, eventStream) {
				return true
			}
			continue
		}
		if equalFoldASCII(ct, t) {
			return true
		}
	}
	return false
}

// addVary adds Accept-Encoding to Vary unless a Vary field already names it or is "*".
func addVary(resp *fasthttp.ResponseHeader) {
	for _, v := range resp.PeekAll(fasthttp.HeaderVary) {
		for item := range bytes.SplitSeq(v, []byte{','}) {
			item = bytes.TrimSpace(item)
			if equalFoldASCII(item, "accept-encoding") || equalFoldASCII(item, "*") {
				return
			}
		}
	}
	resp.Add(fasthttp.HeaderVary, fasthttp.HeaderAcceptEncoding)
}

// hasNoTransform reports whether a Cache-Control field holds no-transform (RFC 9111 5.2.2.6:
// a proxy must not change the content coding).
func hasNoTransform(resp *fasthttp.ResponseHeader) bool {
	for _, v := range resp.PeekAll(fasthttp.HeaderCacheControl) {
		for item := range bytes.SplitSeq(v, []byte{','}) {
			if equalFoldASCII(bytes.TrimSpace(item), "no-transform") {
				return true
			}
		}
	}
	return false
}

// weakenETag turns a strong ETag into a weak one (RFC 9110 8.8.3: the compressed bytes are not
// the bytes the strong validator names, but the same representation's).
func weakenETag(resp *fasthttp.ResponseHeader) {
	et := resp.Peek(fasthttp.HeaderETag)
	if len(et) == 0 || bytes.HasPrefix(et, []byte("W/")) {
		return
	}
	var stack [128]byte
	resp.SetBytesV(fasthttp.HeaderETag, append(append(stack[:0], "W/"...), et...))
}

// Negotiate picks the coding of offered (in preference order) that the Accept-Encoding value
// accept rates highest (RFC 9110 12.5.3): an explicit entry's q-value, else that of "*", else
// not acceptable; q=0 refuses; equal q-values go to the earlier coding of offered; "x-gzip"
// counts as gzip. Identity when none is acceptable (Toron never answers 406: the identity
// response is the one every client can read). It does not allocate.
func Negotiate(accept []byte, offered []Encoding) Encoding {
	if len(accept) == 0 {
		return Identity
	}
	best, bestQ := Identity, 0
	for _, e := range offered {
		if q := qValue(accept, e); q > bestQ {
			best, bestQ = e, q
		}
	}
	return best
}

// qValue returns the weight, 0..1000, that accept gives e.
func qValue(accept []byte, e Encoding) int {
	name := e.String()
	explicit, star := -1, -1
	for elem := range bytes.SplitSeq(accept, []byte{','}) {
		token, params, _ := bytes.Cut(elem, []byte{';'})
		token = bytes.TrimSpace(token)
		q, ok := parseQ(params)
		if !ok {
			continue // a malformed weight: the element is ignored
		}
		switch {
		case equalFoldASCII(token, name), e == Gzip && equalFoldASCII(token, "x-gzip"):
			explicit = max(explicit, q)
		case len(token) == 1 && token[0] == '*':
			star = max(star, q)
		}
	}
	switch {
	case explicit >= 0:
		return explicit
	case star >= 0:
		return star
	}
	return 0
}

// parseQ reads the q parameter of an element's parameters ("q=0.5", " Q=1.000"); an element
// without one weighs 1000. ok is false for a weight that is not RFC 9110's qvalue.
func parseQ(params []byte) (q int, ok bool) {
	for len(params) > 0 {
		var p []byte
		p, params, _ = bytes.Cut(params, []byte{';'})
		k, v, found := bytes.Cut(bytes.TrimSpace(p), []byte{'='})
		if !found || !equalFoldASCII(bytes.TrimSpace(k), "q") {
			continue
		}
		return parseQValue(bytes.TrimSpace(v))
	}
	return 1000, true
}

// parseQValue parses "0", "0.", "0.5", "0.125", "1", "1.000" into thousandths.
func parseQValue(v []byte) (int, bool) {
	if len(v) == 0 || len(v) > 5 || (v[0] != '0' && v[0] != '1') {
		return 0, false
	}
	q := int(v[0]-'0') * 1000
	if len(v) == 1 {
		return q, true
	}
	if v[1] != '.' {
		return 0, false
	}
	scale := 100
	for _, c := range v[2:] {
		if c < '0' || c > '9' {
			return 0, false
		}
		q += int(c-'0') * scale
		scale /= 10
	}
	if q > 1000 {
		return 0, false
	}
	return q, true
}
