package gateway

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"toron/conf"
	"toron/limits"
	"toron/socket"
	"toron/streaming"
	"toron/timeouts"
)

// fakeChunkedLength is the Content-Length a chunked request is given in onHeaders so that
// fasthttp hands us its raw bytes instead of decoding them itself (see chunkedRaw).
const fakeChunkedLength = 1 << 50

// chunkedRaw makes fasthttp stream a chunked body to us undecoded, so that Toron's own strict
// decoder (streaming.ChunkedReader, the framing validator of SPEC 7) sees every byte: fasthttp's
// decoder accepts chunk-size lines of any length and cannot report where framing broke. The
// header is given a huge Content-Length and the request a body limit of one byte; fasthttp then
// pre-reads one raw byte and turns the rest into a stream of raw bytes (SPEC 12). The
// Transfer-Encoding header fasthttp keeps is gone, which does not matter: hop-by-hop headers are
// never forwarded. The connection closes after such a request, because what follows the last
// chunk cannot be handed back to fasthttp's parser.
func chunkedRaw(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	h.SetContentLength(fakeChunkedLength)
	return fasthttp.RequestConfig{MaxRequestBodySize: 1}
}

// attachBody gives the upstream request its body (SPEC 6, SPEC 7):
//   - none;
//   - buffered, with a Content-Length: a declared length at or below stream_threshold_bytes
//     (auto), any declared length (stream_request_body false), or in normalize mode a chunked
//     body that ends within the threshold;
//   - streamed through x.body: a longer declared length (Content-Length kept), a chunked body in
//     passthrough mode or one longer than the threshold in normalize mode (re-chunked).
//
// A client-side failure while buffering is left in x.body.err for the caller.
func (g *Gateway) attachBody(ctx *fasthttp.RequestCtx, x *exchange, req *fasthttp.Request) {
	b := &x.body
	b.reset(x)
	if !x.bodyAnnounced {
		return
	}
	stream := ctx.RequestBodyStream()
	if stream == nil {
		// Defensive: with StreamRequestBody every body is a stream.
		body := ctx.Request.Body()
		x.bytesIn = int64(len(body))
		req.SetBody(body)
		return
	}
	eff := &x.route.eff
	threshold := x.snap.cfg.Server.StreamThresholdBytes
	if x.chunked {
		ctx.SetConnectionClose()
		b.chunk.Reset(stream, b.takeBuffer())
		b.src = &b.chunk
		b.want = -1
		switch {
		case eff.InboundChunkedMode == conf.ChunkedPassthrough:
			// SPEC 7: passthrough is never converted to a Content-Length nor buffered to learn
			// its length, even on a route with stream_request_body false.
			req.SetBodyStream(b, -1)
		case eff.StreamRequestBody == conf.StreamNever:
			b.bufferInto(req, -1)
		case eff.InboundChunkedMode == conf.ChunkedNormalize:
			if done := b.prefetch(threshold); done {
				req.SetBody(b.pre.B)
				return
			}
			req.SetBodyStream(b, -1)
		default:
			req.SetBodyStream(b, -1)
		}
		return
	}
	cl := int64(ctx.Request.Header.ContentLength())
	b.src = stream
	b.want = cl
	if eff.StreamRequestBody == conf.StreamNever || (eff.StreamRequestBody == conf.StreamAuto && cl <= threshold) {
		b.bufferInto(req, cl)
		return
	}
	req.SetBodyStream(b, int(cl))
}

// bodyReader is the client side of a forwarded body. It counts decoded bytes, enforces the
// route's ceiling on them (Tier 2, SPEC 3 step 8: the transfer stops before the byte that
// crosses it), and keeps the first client-side error, so that a failed forward can be told apart
// from a failed upstream. It holds at most one 64 KiB buffer (plus, in normalize mode, the
// decoded prefix of at most stream_threshold_bytes + 1 that it forwards first).
type bodyReader struct {
	x     *exchange
	src   io.Reader
	chunk streaming.ChunkedReader
	want  int64 // declared length; -1 chunked
	n     int64 // decoded bytes read from the client
	max   int64
	err   error
	buf   *[]byte
	pre   *bytebufferpool.ByteBuffer
	preAt int
	upErr error // an upstream write error met while the chunked decoder wrote to it
	// sentAt is when the last body byte was handed to the upstream writer: the end of
	// forwarding for a streamed body, where the upstream header wait starts.
	sentAt time.Time
}

func (b *bodyReader) reset(x *exchange) {
	b.release()
	b.x = x
	b.src = nil
	b.want = 0
	b.n = 0
	b.err = nil
	b.sentAt = time.Time{}
	b.max = 0
	if x.route != nil {
		b.max = x.route.eff.MaxBodyBytes
	}
}

// release returns the buffers; the exchange calls it once the request was written upstream.
func (b *bodyReader) release() {
	b.chunk.Release()
	if b.buf != nil {
		streaming.PutBuffer(b.buf)
		b.buf = nil
	}
	if b.pre != nil {
		bytebufferpool.Put(b.pre)
		b.pre = nil
	}
}

// dropPrefix returns the normalize prefix to its pool once it was forwarded: it decided between
// a Content-Length and re-chunking, and must not be held for the rest of a long upload.
func (b *bodyReader) dropPrefix() {
	if b.pre != nil {
		bytebufferpool.Put(b.pre)
		b.pre = nil
		b.preAt = 0
	}
}

func (b *bodyReader) takeBuffer() []byte {
	if b.buf == nil {
		b.buf = streaming.GetBuffer()
	}
	return *b.buf
}

// fail records the first client-side error.
func (b *bodyReader) fail(err error) error {
	if b.err == nil {
		if errors.Is(err, io.EOF) && b.want >= 0 && b.n < b.want {
			err = errClientEOF
		}
		b.err = err
	}
	return b.err
}

// count adds n decoded bytes and enforces the ceiling.
func (b *bodyReader) count(n int) error {
	b.n += int64(n)
	b.x.bytesIn = b.n
	if b.n > b.max {
		return b.fail(limits.ErrBodyTooLarge)
	}
	return nil
}

// Read implements io.Reader.
func (b *bodyReader) Read(p []byte) (int, error) {
	if b.pre != nil && b.preAt < len(b.pre.B) {
		n := copy(p, b.pre.B[b.preAt:])
		b.preAt += n
		if b.preAt == len(b.pre.B) {
			b.dropPrefix()
		}
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.want >= 0 && b.n >= b.want {
		b.err = io.EOF
		return 0, io.EOF
	}
	n, err := b.src.Read(p)
	if cerr := b.count(n); cerr != nil {
		return 0, cerr
	}
	if err != nil {
		if errors.Is(err, io.EOF) && (b.want < 0 || b.n >= b.want) {
			b.err = io.EOF
			return n, io.EOF
		}
		return n, b.fail(err)
	}
	return n, nil
}

// WriteTo implements io.WriterTo: fasthttp's client copies the body with it, so the bytes move
// from the client socket to the upstream through our one 64 KiB buffer (fasthttp's own copy
// goes through 4 KiB buffers).
func (b *bodyReader) WriteTo(w io.Writer) (total int64, err error) {
	// fasthttp's client has no recover around the body write: a panic here would leak its
	// upstream connection slot. Turn it into an error instead (the handler logs the request).
	defer func() {
		if p := recover(); p != nil {
			err = b.fail(fmt.Errorf("BUG: gateway: panic while forwarding a body: %v", p))
		}
	}()
	if b.pre != nil && b.preAt < len(b.pre.B) {
		n, err := w.Write(b.pre.B[b.preAt:])
		b.preAt += n
		total += int64(n)
		if err != nil {
			return total, err
		}
		b.dropPrefix()
	}
	if b.src == &b.chunk {
		b.upErr = nil
		n, err := b.chunk.WriteTo(limitWriter{b: b, w: w})
		total += n
		if err != nil {
			if b.upErr != nil {
				// The upstream failed while taking the body: its error, not the client's.
				return total, err
			}
			return total, b.fail(err)
		}
		b.err = io.EOF
		b.sentAt = time.Now()
		return total, nil
	}
	n, err := streaming.CopyBuffer(w, b, b.takeBuffer())
	total += n
	if err == nil {
		b.sentAt = time.Now()
	}
	return total, err
}

// SupportsBodyWriteTo tells fasthttp that WriteTo may replace Read (fasthttp.BodyWriterTo).
func (b *bodyReader) SupportsBodyWriteTo() bool { return true }

// limitWriter counts decoded bytes on their way upstream and refuses the write that would cross
// the ceiling, so the upstream sees at most max_body_bytes.
type limitWriter struct {
	b *bodyReader
	w io.Writer
}

func (l limitWriter) Write(p []byte) (int, error) {
	if l.b.n+int64(len(p)) > l.b.max {
		l.b.count(len(p))
		return 0, l.b.err
	}
	n, err := l.w.Write(p)
	l.b.n += int64(n)
	l.b.x.bytesIn = l.b.n
	if err != nil {
		l.b.upErr = err
	}
	return n, err
}

// bufferInto reads the whole body (declared length, or -1 until the end of a chunked body)
// into the upstream request's own buffer.
func (b *bodyReader) bufferInto(req *fasthttp.Request, declared int64) {
	buf := b.takeBuffer()
	for {
		n, err := b.Read(buf)
		req.AppendBody(buf[:n])
		if err != nil {
			return
		}
	}
}

// prefetch reads up to limit+1 decoded bytes into the prefix buffer. It reports true when the
// body ended within limit (normalize: forward it with a Content-Length).
func (b *bodyReader) prefetch(limit int64) bool {
	b.pre = bytebufferpool.Get()
	b.preAt = 0
	buf := b.takeBuffer()
	for int64(len(b.pre.B)) <= limit {
		want := limit + 1 - int64(len(b.pre.B))
		if want > int64(len(buf)) {
			want = int64(len(buf))
		}
		n, err := b.src.Read(buf[:want])
		if cerr := b.count(n); cerr != nil {
			return false
		}
		b.pre.B = append(b.pre.B, buf[:n]...)
		if err == io.EOF {
			b.err = io.EOF
			return true
		}
		if err != nil {
			b.fail(err)
			return false
		}
	}
	return false
}

// respStream is the upstream response body on its way to the client. fasthttp copies it after
// the handler returned and then calls CloseWithError, which finishes the exchange: that is where
// the slots are released for streamed responses.
type respStream struct {
	x     *exchange
	src   io.Reader
	upErr error
	enc   streaming.Encoding // the coding the body is compressed with (traffic.go), Identity none
	// deferEnd: once the upstream body ended, the writes left (a compressed body's last chunk,
	// then the end of the chunked framing) are the response's last, which the connection
	// joins into one write made by its next read (clientConn.Write), rather than writing the
	// chunk at once and the framing's end apart. Set for fasthttp's own writes of a
	// compressed body.
	deferEnd bool
}

func (s *respStream) reset(x *exchange, src io.Reader) {
	s.x = x
	s.src = src
	s.upErr = nil
	s.enc = streaming.Identity
	s.deferEnd = false
}

// Read implements io.Reader for fasthttp's response writer.
func (s *respStream) Read(p []byte) (int, error) {
	n, err := s.src.Read(p)
	s.x.bytesOut += int64(n)
	switch {
	case err == io.EOF:
		s.x.upDone = true
		if s.deferEnd {
			s.x.conn.deferResponseEnd()
		}
	case err != nil:
		s.upErr = err
	}
	return n, err
}

// WriteTo copies the upstream body to the client through one pooled 64 KiB buffer.
func (s *respStream) WriteTo(w io.Writer) (int64, error) {
	if s.enc != streaming.Identity {
		// SPEC 20: compressed as it streams; the access line counts the bytes sent.
		n, err := streaming.CopyCompressed(w, s, s.enc)
		s.x.bytesOut = n
		return n, err
	}
	bp := streaming.GetBuffer()
	defer streaming.PutBuffer(bp)
	return streaming.CopyBuffer(w, s, *bp)
}

// SupportsBodyWriteTo tells fasthttp that WriteTo may replace Read (fasthttp.BodyWriterTo).
func (s *respStream) SupportsBodyWriteTo() bool { return true }

// CloseWithError is called by fasthttp with the error that ended the copy (nil on success).
// respStream deliberately has no Close method: fasthttp would call it first, without the error.
func (s *respStream) CloseWithError(err error) error {
	x := s.x
	switch {
	case s.upErr != nil:
		// The upstream aborted mid-response: fasthttp saw the error too and closes the
		// connection without a terminating chunk, so the client sees a truncated transfer.
		x.reason = reasonUpstreamError
	case err != nil:
		x.status, x.reason = statusClientClosed, reasonClientAbort
		if socket.IsTimeout(err) || errors.Is(err, timeouts.ErrSlowClient) {
			x.reason = reasonSlowClient
		}
	}
	x.finish()
	return nil
}

var (
	_ fasthttp.BodyWriterTo        = (*bodyReader)(nil)
	_ fasthttp.BodyWriterTo        = (*respStream)(nil)
	_ fasthttp.ReadCloserWithError = (*respStream)(nil)
)
