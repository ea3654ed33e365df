package tracing

import (
	"math/rand/v2"
	"slices"
)

// W3C Trace Context (https://www.w3.org/TR/trace-context/): the traceparent header is
// "version-traceid-parentid-flags", lower-case hex, 2-32-16-2 digits. Toron parses it and writes
// its own by hand, on the request's own buffers: the unsampled path of every request goes
// through here, and it must not allocate.

// Header names of W3C Trace Context, as Toron writes them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// TraceID is a W3C trace id: 16 bytes, never all zero when valid.
type TraceID [16]byte

// SpanID is a W3C span (parent) id: 8 bytes, never all zero when valid.
type SpanID [8]byte

// FlagSampled is the sampled bit of the trace flags.
const FlagSampled byte = 0x01

// traceparentLen is the length of a version-00 traceparent: 2+1+32+1+16+1+2.
const traceparentLen = 55

// maxTracestateBytes bounds the tracestate Toron passes on. W3C lets a vendor truncate it to 512
// characters (section 3.3.1.5); a longer one is dropped whole rather than cut mid-entry.
const maxTracestateBytes = 512

// Parent is a parsed traceparent: the caller's trace, its span and its flags.
type Parent struct {
	TraceID TraceID
	SpanID  SpanID
	Flags   byte
}

// Sampled reports whether the caller recorded its span (the sampled flag).
func (p Parent) Sampled() bool { return p.Flags&FlagSampled != 0 }

// ParseParent parses a traceparent header value. It accepts version 00 exactly (55 bytes) and,
// as W3C asks of a version-00 parser, a higher version (not ff) whose first four fields have the
// version-00 layout, followed by nothing or by "-" and more. Upper-case hex, an all-zero trace
// or parent id, version ff, and anything else malformed give false: the request then starts a
// trace of its own. It does not allocate.
func ParseParent(v []byte) (Parent, bool) {
	var p Parent
	if len(v) < traceparentLen || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return p, false
	}
	ver, ok := hexByte(v[0], v[1])
	switch {
	case !ok || ver == 0xff:
		return p, false
	case ver == 0 && len(v) != traceparentLen:
		return p, false
	case ver > 0 && len(v) > traceparentLen && v[traceparentLen] != '-':
		return p, false
	}
	if !decodeHex(p.TraceID[:], v[3:35]) || !decodeHex(p.SpanID[:], v[36:52]) {
		return p, false
	}
	if p.TraceID == (TraceID{}) || p.SpanID == (SpanID{}) {
		return p, false
	}
	if p.Flags, ok = hexByte(v[53], v[54]); !ok {
		return p, false
	}
	return p, true
}

// AppendTraceparent appends a version-00 traceparent for trace t, parent span s and the
// sampled flag to dst.
func AppendTraceparent(dst []byte, t TraceID, s SpanID, sampled bool) []byte {
	dst = append(dst, "00-"...)
	dst = appendHex(dst, t[:])
	dst = append(dst, '-')
	dst = appendHex(dst, s[:])
	if sampled {
		return append(dst, "-01"...)
	}
	return append(dst, "-00"...)
}

// AppendHex appends the lower-case hex of id (a TraceID or a SpanID slice) to dst: the
// trace_id of the access line.
func AppendHex(dst, id []byte) []byte { return appendHex(dst, id) }

// ValidTracestate reports whether a tracestate value may be passed on as it came: at most
// maxTracestateBytes of printable ASCII (W3C's list-members are a subset of it). The gateway
// copies it byte for byte; its members are parsed only for a sampled span.
func ValidTracestate(v []byte) bool {
	if len(v) > maxTracestateBytes {
		return false
	}
	for _, c := range v {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

const hexDigits = "0123456789abcdef"

func appendHex(dst, b []byte) []byte {
	n := len(dst)
	dst = slices.Grow(dst, 2*len(b))[:n+2*len(b)]
	out := dst[n:]
	for i, c := range b {
		out[2*i], out[2*i+1] = hexDigits[c>>4], hexDigits[c&0x0f]
	}
	return dst
}

// decodeHex decodes lower-case hex src into dst (len(src) == 2*len(dst)).
func decodeHex(dst, src []byte) bool {
	for i := range dst {
		b, ok := hexByte(src[2*i], src[2*i+1])
		if !ok {
			return false
		}
		dst[i] = b
	}
	return true
}

func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexVal(hi)
	l, ok2 := hexVal(lo)
	return h<<4 | l, ok1 && ok2
}

// hexVal decodes one lower-case hex digit: W3C allows no upper case in traceparent.
func hexVal(c byte) (byte, bool) {
	v := hexTable[c]
	return v, v != 0xff
}

// hexTable maps a byte to its value as a lower-case hex digit, 0xff for any other byte.
var hexTable = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i := range 16 {
		t[hexDigits[i]] = byte(i)
	}
	return t
}()

// newTraceID returns a random, valid trace id. math/rand/v2's global source is a per-thread
// ChaCha8 stream: no lock, no allocation, and unpredictable enough for ids (they are not
// secrets; W3C asks only that they be random and unique).
func newTraceID() TraceID {
	var t TraceID
	for t == (TraceID{}) {
		putUint64(t[:8], rand.Uint64())
		putUint64(t[8:], rand.Uint64())
	}
	return t
}

// newSpanID returns a random, valid span id.
func newSpanID() SpanID {
	var s SpanID
	for s == (SpanID{}) {
		putUint64(s[:], rand.Uint64())
	}
	return s
}

func putUint64(b []byte, v uint64) {
	_ = b[7]
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

func getUint64(b []byte) uint64 {
	_ = b[7]
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}
