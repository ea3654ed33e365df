package streaming

import (
	"bytes"
	"errors"
	"io"
)

// MaxChunkLineBytes bounds a chunk-size line (size, extensions and CRLF) and each trailer line:
// nobody needs more, and an unbounded line is a memory and smuggling lever (SPEC 7).
const MaxChunkLineBytes = 4096

// MaxTrailerBytes bounds the whole trailer section.
const MaxTrailerBytes = 16 << 10

// maxChunkSize bounds one chunk's declared size so that arithmetic never overflows.
const maxChunkSize = 1 << 62

// ErrFraming is wrapped by every chunk framing error: invalid sizes (non-hex, signs, overflow),
// over-long lines, bare LF or CR, a missing CRLF after chunk data, malformed extensions or
// trailers. The gateway answers 400 if the response has not started and closes the connection.
var ErrFraming = errors.New("streaming: malformed chunked framing")

// FramingError says what was wrong with the framing; it matches ErrFraming with errors.Is.
type FramingError struct{ Msg string }

func (e *FramingError) Error() string        { return "streaming: malformed chunked framing: " + e.Msg }
func (e *FramingError) Is(target error) bool { return target == ErrFraming }

func framingError(msg string) error { return &FramingError{Msg: msg} }

type chunkState uint8

const (
	stateSize    chunkState = iota // expecting a chunk-size line
	stateData                      // inside chunk data
	stateDataEnd                   // expecting the CRLF after chunk data
	stateTrailer                   // inside the trailer section
	stateDone                      // the last chunk and trailers were read
)

// ChunkedReader decodes a chunked request body (RFC 9112 7.1) strictly, from the raw bytes of
// the client connection. It is stricter than any upstream behind the gateway should be: chunk
// extensions must be well-formed and are dropped, trailers are validated and dropped, and every
// line must end in CRLF. Decoded bytes are handed out as they arrive, in constant memory: the
// reader owns one buffer (given to Reset), through which both the framing and the data pass.
//
// A framing error is returned as soon as it is seen; the bytes of valid chunks before it were
// returned, nothing after it ever is. The caller aborts the upstream request without a
// terminating chunk, so the upstream never sees a complete request.
type ChunkedReader struct {
	src   io.Reader
	buf   []byte
	r, w  int // buffered, unconsumed bytes are buf[r:w]
	state chunkState
	left  int64 // bytes left in the current chunk
	trail int   // trailer bytes seen
	err   error

	// WriteTo state: decoded bytes gathered at buf[:dn] (dn <= r), the destination, what was
	// written to it and its first error.
	dn     int
	out    io.Writer
	outN   int64
	outErr error
}

// Reset prepares the reader for a new body read from src through buf (at least
// 2 × MaxChunkLineBytes long; the gateway passes a pooled 64 KiB buffer).
func (d *ChunkedReader) Reset(src io.Reader, buf []byte) {
	if len(buf) < 2*MaxChunkLineBytes {
		panic("BUG: streaming: ChunkedReader buffer too small")
	}
	*d = ChunkedReader{src: src, buf: buf}
}

// Release drops the reader's references to its source and buffer.
func (d *ChunkedReader) Release() {
	*d = ChunkedReader{}
}

// Read implements io.Reader: it returns decoded body bytes, io.EOF after the last chunk and its
// trailers, or an error wrapping ErrFraming (or the source's error).
func (d *ChunkedReader) Read(p []byte) (int, error) {
	for {
		if d.err != nil {
			return 0, d.err
		}
		if d.state == stateData {
			break
		}
		if err := d.step(); err != nil {
			d.err = err
			return 0, err
		}
	}
	if len(p) == 0 {
		return 0, nil
	}
	if int64(len(p)) > d.left {
		p = p[:d.left]
	}
	var n int
	if d.r < d.w {
		n = copy(p, d.buf[d.r:d.w])
		d.r += n
	} else {
		// Nothing buffered: read straight into p, sparing a copy for large bodies.
		var err error
		n, err = d.src.Read(p)
		if n == 0 && err != nil {
			d.err = unexpected(err)
			return 0, d.err
		}
	}
	d.left -= int64(n)
	if d.left == 0 {
		d.state = stateDataEnd
	}
	return n, nil
}

// WriteTo implements io.WriterTo. Decoded bytes are gathered in place at the front of the
// reader's own buffer (chunk data moved down over the framing that separated it) and handed to
// w in one Write each time the buffer is about to be refilled: one write per read from the
// client, however small the client's chunks, and still no second buffer. On a framing error the
// gathered bytes of that read are dropped, not forwarded: the upstream request is aborted anyway.
func (d *ChunkedReader) WriteTo(w io.Writer) (int64, error) {
	d.out, d.outN, d.outErr = w, 0, nil
	defer func() { d.out = nil }()
	for {
		if d.outErr != nil {
			return d.outN, d.outErr
		}
		if d.err != nil {
			if d.err == io.EOF {
				if err := d.flushOut(); err != nil {
					return d.outN, err
				}
				return d.outN, nil
			}
			return d.outN, d.err
		}
		if d.state != stateData {
			if err := d.step(); err != nil {
				d.err = err
			}
			continue
		}
		if d.r == d.w {
			if err := d.fill(); err != nil {
				d.err = unexpected(err)
			}
			continue
		}
		k := d.w - d.r
		if int64(k) > d.left {
			k = int(d.left)
		}
		copy(d.buf[d.dn:], d.buf[d.r:d.r+k])
		d.dn += k
		d.r += k
		d.left -= int64(k)
		if d.left == 0 {
			d.state = stateDataEnd
		}
	}
}

// flushOut hands the gathered decoded bytes to the WriteTo destination.
func (d *ChunkedReader) flushOut() error {
	if d.dn == 0 {
		return nil
	}
	n, err := d.out.Write(d.buf[:d.dn])
	d.outN += int64(n)
	if err == nil && n < d.dn {
		err = io.ErrShortWrite
	}
	d.dn = 0
	if err != nil {
		d.outErr = err
	}
	return err
}

// step consumes framing: a size line, the CRLF after data, or trailer lines.
func (d *ChunkedReader) step() error {
	switch d.state {
	case stateSize:
		line, err := d.line()
		if err != nil {
			return err
		}
		size, err := parseChunkSizeLine(line)
		if err != nil {
			return err
		}
		if size == 0 {
			d.state = stateTrailer
			return nil
		}
		d.left = size
		d.state = stateData
	case stateDataEnd:
		if err := d.need(2); err != nil {
			return err
		}
		if d.buf[d.r] != '\r' || d.buf[d.r+1] != '\n' {
			return framingError("chunk data not followed by CRLF")
		}
		d.r += 2
		d.state = stateSize
	case stateTrailer:
		line, err := d.line()
		if err != nil {
			return err
		}
		d.trail += len(line) + 2
		if d.trail > MaxTrailerBytes {
			return framingError("trailer section too large")
		}
		if len(line) == 0 {
			d.state = stateDone
			return io.EOF
		}
		return checkTrailerLine(line)
	case stateDone:
		return io.EOF
	}
	return nil
}

// line returns the next CRLF-terminated line without its CRLF, consuming it.
func (d *ChunkedReader) line() ([]byte, error) {
	for {
		if i := bytes.IndexByte(d.buf[d.r:d.w], '\n'); i >= 0 {
			if i+1 > MaxChunkLineBytes {
				return nil, framingError("line longer than 4096 bytes")
			}
			if i == 0 || d.buf[d.r+i-1] != '\r' {
				return nil, framingError("bare LF")
			}
			line := d.buf[d.r : d.r+i-1]
			d.r += i + 1
			if bytes.IndexByte(line, '\r') >= 0 {
				return nil, framingError("bare CR")
			}
			return line, nil
		}
		if d.w-d.r >= MaxChunkLineBytes {
			return nil, framingError("line longer than 4096 bytes")
		}
		if err := d.fill(); err != nil {
			return nil, unexpected(err)
		}
	}
}

// need makes at least n bytes available in the buffer.
func (d *ChunkedReader) need(n int) error {
	for d.w-d.r < n {
		if err := d.fill(); err != nil {
			return unexpected(err)
		}
	}
	return nil
}

// fill reads more bytes from the source, compacting the buffer first when needed.
func (d *ChunkedReader) fill() error {
	if d.out != nil {
		// Gathered decoded bytes go out before the buffer is reused.
		if err := d.flushOut(); err != nil {
			return err
		}
	}
	if d.r == d.w {
		d.r, d.w = 0, 0
	} else if d.w == len(d.buf) {
		d.w = copy(d.buf, d.buf[d.r:d.w])
		d.r = 0
	}
	for {
		n, err := d.src.Read(d.buf[d.w:])
		d.w += n
		if n > 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// unexpected turns an end of input inside the framing into io.ErrUnexpectedEOF: a body that
// stops before its last chunk is a client that left, not a clean end.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseChunkSizeLine parses `chunk-size [ chunk-ext ]` (RFC 9112 7.1.1): hex digits only (no
// sign, no 0x, no whitespace before them), then optional extensions that must be well-formed.
func parseChunkSizeLine(line []byte) (int64, error) {
	var size int64
	i := 0
	for ; i < len(line); i++ {
		v, ok := HexValue(line[i])
		if !ok {
			break
		}
		if size > (maxChunkSize-int64(v))/16 {
			return 0, framingError("chunk size overflows")
		}
		size = size*16 + int64(v)
	}
	if i == 0 {
		return 0, framingError("chunk size is not hexadecimal")
	}
	if err := checkChunkExtensions(line[i:]); err != nil {
		return 0, err
	}
	return size, nil
}

// HexValue returns the value of a hexadecimal digit, and false for any other byte.
func HexValue(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// checkChunkExtensions validates *( BWS ";" BWS ext-name [ BWS "=" BWS ext-value ] ), where a
// value is a token or a quoted-string (RFC 9112 7.1.1). Whitespace is allowed only where the
// grammar has BWS: before a ';', never at the end of the line ("5 \r\n" is refused).
func checkChunkExtensions(b []byte) error {
	for {
		if len(b) == 0 {
			return nil
		}
		b = skipBWS(b)
		if len(b) == 0 {
			return framingError("whitespace at the end of a chunk-size line")
		}
		if b[0] != ';' {
			return framingError("invalid character after chunk size")
		}
		b = skipBWS(b[1:])
		n := tokenLen(b)
		if n == 0 {
			return framingError("chunk extension without a name")
		}
		b = skipBWS(b[n:])
		if len(b) == 0 || b[0] != '=' {
			continue
		}
		b = skipBWS(b[1:])
		if len(b) > 0 && b[0] == '"' {
			end, ok := quotedStringEnd(b)
			if !ok {
				return framingError("malformed quoted chunk extension value")
			}
			b = b[end:]
			continue
		}
		n = tokenLen(b)
		if n == 0 {
			return framingError("chunk extension without a value")
		}
		b = b[n:]
	}
}

func skipBWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// quotedStringEnd returns the length of the quoted-string at the start of b.
func quotedStringEnd(b []byte) (int, bool) {
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			i++
			if i >= len(b) || !isQDTextOrVisible(b[i]) {
				return 0, false
			}
		case !isQDTextOrVisible(c):
			return 0, false
		}
	}
	return 0, false
}

func isQDTextOrVisible(c byte) bool { return c == '\t' || (c >= ' ' && c != 0x7f) }

func tokenLen(b []byte) int {
	n := 0
	for n < len(b) && IsTokenChar(b[n]) {
		n++
	}
	return n
}

// IsTokenChar reports an RFC 9110 tchar.
func IsTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// forbiddenTrailers are fields that must never arrive in a trailer (RFC 9110 6.5.1): framing,
// routing and connection control. A client sending them is probing for a parser that merges
// trailers into the header; the gateway drops trailers anyway, and refuses these.
var forbiddenTrailers = [][]byte{
	[]byte("content-length"), []byte("transfer-encoding"), []byte("host"), []byte("trailer"),
	[]byte("connection"), []byte("keep-alive"), []byte("upgrade"), []byte("te"), []byte("expect"),
	[]byte("content-type"), []byte("content-encoding"), []byte("content-range"),
	[]byte("authorization"), []byte("cookie"), []byte("set-cookie"),
}

// checkTrailerLine validates one trailer field line: a token name directly followed by a colon,
// a value without control bytes other than HTAB, and a name that is not forbidden.
func checkTrailerLine(line []byte) error {
	if line[0] == ' ' || line[0] == '\t' {
		return framingError("obsolete line folding in trailer")
	}
	n := tokenLen(line)
	if n == 0 || n >= len(line) || line[n] != ':' {
		return framingError("malformed trailer field")
	}
	for _, c := range line[n+1:] {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return framingError("control byte in trailer value")
		}
	}
	name := line[:n]
	for _, f := range forbiddenTrailers {
		if bytes.EqualFold(name, f) {
			return framingError("forbidden trailer field")
		}
	}
	return nil
}

var (
	_ io.Reader   = (*ChunkedReader)(nil)
	_ io.WriterTo = (*ChunkedReader)(nil)
)
