package gateway

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"toron/limits"
)

// proxy forwards an admitted request to its route's upstream and streams the answer back
// (SPEC 3 steps 8-11).
func (g *Gateway) proxy(ctx *fasthttp.RequestCtx, cc *clientConn, x *exchange) {
	r := x.route
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	x.upResp = resp
	g.prepareRequest(ctx, x, req)
	g.attachBody(ctx, x, req)

	start := time.Now()
	err := r.client.Do(req, resp)
	x.headerWait = time.Since(start)
	fasthttp.ReleaseRequest(req)

	if err != nil {
		g.answerForwardError(ctx, x, err)
		x.finish()
		return
	}
	if x.body.err != nil && !errors.Is(x.body.err, io.EOF) {
		// The upstream answered before the body ended (fasthttp reads the response only once the
		// request was written, so this is an upstream that ignored a short body): the client side
		// failed, close.
		g.answerForwardError(ctx, x, x.body.err)
		x.finish()
		return
	}

	copyResponseHeaders(&ctx.Response.Header, &resp.Header)
	ctx.Response.Header.SetStatusCode(resp.StatusCode())
	ctx.Response.Header.SetBytesKV(headerRequestID, x.reqID)
	x.status = resp.StatusCode()
	if bs := resp.BodyStream(); bs != nil {
		x.rs.reset(x, bs)
		ctx.Response.SetBodyStream(&x.rs, resp.Header.ContentLength())
		return // finished by x.rs.CloseWithError once fasthttp wrote the body
	}
	ctx.Response.SetBody(resp.Body())
	x.bytesOut = int64(len(resp.Body()))
	x.finish()
}

// answerForwardError answers a failed forward: the client side failing (body cut, client gone,
// Tier-2 413, read timeout) or the upstream failing before its headers (502, 504).
func (g *Gateway) answerForwardError(ctx *fasthttp.RequestCtx, x *exchange, err error) {
	if berr := x.body.err; berr != nil && !errors.Is(berr, io.EOF) {
		err = berr
		switch {
		case errors.Is(err, limits.ErrBodyTooLarge):
			g.writeRejection(ctx, x, rejBodyTooLargeStream)
		case isTimeout(err):
			g.writeRejection(ctx, x, rejReadTimeout)
		default:
			// The client left mid-body: nobody to answer.
			x.status, x.reason = statusClientClosed, reasonClientAbort
		}
		ctx.SetConnectionClose()
		return
	}
	g.writeRejection(ctx, x, upstreamRejection(err))
	if x.bodyAnnounced {
		ctx.SetConnectionClose()
	}
}

// prepareRequest copies the request line and end-to-end headers to the upstream request
// (SPEC 7): hop-by-hop headers and the ones Connection names are dropped, X-Forwarded-For is
// appended, X-Forwarded-Proto and X-Forwarded-Host are set, Host is kept, and the path sent is
// the normalized one that was matched, with the original query.
func (g *Gateway) prepareRequest(ctx *fasthttp.RequestCtx, x *exchange, req *fasthttp.Request) {
	in := &ctx.Request.Header
	out := &req.Header
	out.SetMethodBytes(in.Method())

	uri := append(x.scratch[:0], x.path...)
	if q := ctx.URI().QueryString(); len(q) > 0 {
		uri = append(uri, '?')
		uri = append(uri, q...)
	}
	x.scratch = uri
	out.SetRequestURIBytes(uri)
	req.UseHostHeader = true
	out.SetHostBytes(in.Host())

	connTokens := in.Peek(fasthttp.HeaderConnection)
	var xff []byte
	for k, v := range in.All() {
		switch {
		case isHopByHop(k), headerListHas(connTokens, k),
			equalFold(k, hdrHost), equalFold(k, hdrContentLength),
			equalFold(k, hdrXForwardedProto), equalFold(k, hdrXForwardedHost), equalFold(k, headerRequestID):
			continue
		case equalFold(k, hdrXForwardedFor):
			xff = v
			continue
		}
		out.AddBytesKV(k, v)
	}
	ip := remoteIP(ctx)
	if len(xff) > 0 {
		buf := append(x.scratch[len(x.scratch):], xff...)
		buf = append(buf, ", "...)
		buf = append(buf, ip...)
		out.SetBytesKV(hdrXForwardedFor, buf)
	} else {
		out.SetBytesKV(hdrXForwardedFor, ip)
	}
	out.SetBytesKV(hdrXForwardedProto, protoHTTP)
	out.SetBytesKV(hdrXForwardedHost, in.Host())
	out.SetBytesKV(headerRequestID, x.reqID)
}

// remoteIP returns the client's IP address as text without allocating for IPv4.
func remoteIP(ctx *fasthttp.RequestCtx) []byte {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip4 := a.IP.To4(); ip4 != nil {
			return appendIPv4(nil, ip4)
		}
		return []byte(a.IP.String())
	}
	return []byte(ctx.RemoteAddr().String())
}

// attachBody gives the upstream request its body: none, buffered (at or below
// stream_threshold_bytes, or stream_request_body false) or streamed through the body reader.
func (g *Gateway) attachBody(ctx *fasthttp.RequestCtx, x *exchange, req *fasthttp.Request) {
	x.body.reset(x, nil, 0)
	cl := ctx.Request.Header.ContentLength()
	if cl == 0 || cl == -2 {
		return
	}
	stream := ctx.RequestBodyStream()
	if stream == nil {
		body := ctx.Request.Body()
		x.bytesIn = int64(len(body))
		req.SetBody(body)
		return
	}
	eff := &x.route.eff
	x.body.reset(x, stream, int64(cl))
	buffer := eff.StreamRequestBody == "never" ||
		(eff.StreamRequestBody == "auto" && cl > 0 && int64(cl) <= x.snap.cfg.Server.StreamThresholdBytes)
	if buffer && cl > 0 {
		x.body.readAllInto(req)
		return
	}
	req.SetBodyStream(&x.body, cl)
}

// bodyReader is the client side of a forwarded body: it counts bytes, enforces the route's
// ceiling on decoded bytes (Tier 2, SPEC 3 step 8) and remembers the first client-side error,
// so that a failed forward can be told apart from a failed upstream.
type bodyReader struct {
	x     *exchange
	src   io.Reader
	want  int64 // declared length, -1 chunked
	n     int64
	max   int64
	err   error
	chunk []byte
}

func (b *bodyReader) reset(x *exchange, src io.Reader, declared int64) {
	b.x = x
	b.src = src
	b.want = declared
	b.n = 0
	b.err = nil
	if x.route != nil {
		b.max = x.route.eff.MaxBodyBytes
	}
}

// Read implements io.Reader for the upstream client.
func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.src.Read(p)
	b.n += int64(n)
	b.x.bytesIn = b.n
	if b.n > b.max {
		b.err = limits.ErrBodyTooLarge
		return 0, b.err
	}
	if err != nil {
		if errors.Is(err, io.EOF) && b.want >= 0 && b.n < b.want {
			err = errClientEOF
		}
		b.err = err
	}
	return n, err
}

// readAllInto reads the whole (small) body into the upstream request's own buffer.
func (b *bodyReader) readAllInto(req *fasthttp.Request) {
	buf := bodyBufPool.Get().(*[]byte)
	defer bodyBufPool.Put(buf)
	for {
		n, err := b.Read(*buf)
		req.AppendBody((*buf)[:n])
		if err != nil {
			return
		}
		if b.want >= 0 && b.n >= b.want {
			b.err = io.EOF
			return
		}
	}
}

// respStream is the upstream response body on its way to the client. fasthttp copies it after
// the handler returned and then calls CloseWithError, which finishes the exchange: that is where
// the slots are released for streamed responses.
type respStream struct {
	x     *exchange
	src   io.Reader
	upErr error
}

func (s *respStream) reset(x *exchange, src io.Reader) {
	s.x = x
	s.src = src
	s.upErr = nil
}

// Read implements io.Reader for fasthttp's response writer.
func (s *respStream) Read(p []byte) (int, error) {
	n, err := s.src.Read(p)
	s.x.bytesOut += int64(n)
	if err != nil && err != io.EOF {
		s.upErr = err
	}
	return n, err
}

// CloseWithError is called by fasthttp with the error that ended the copy (nil on success).
func (s *respStream) CloseWithError(err error) error {
	x := s.x
	switch {
	case s.upErr != nil:
		// The upstream aborted mid-response: the client connection closes without a clean end.
		// fasthttp saw the read error too and closes the connection without a terminating
		// chunk, so the client sees a truncated transfer (SPEC 6).
		x.reason = reasonUpstreamError
	case err != nil:
		x.status, x.reason = statusClientClosed, reasonClientAbort
		if isTimeout(err) {
			x.reason = reasonSlowClient
		}
	}
	x.finish()
	return nil
}

// Close implements io.Closer.
func (s *respStream) Close() error { return s.CloseWithError(nil) }

var (
	hdrHost            = []byte("Host")
	hdrContentLength   = []byte("Content-Length")
	hdrXForwardedFor   = []byte("X-Forwarded-For")
	hdrXForwardedProto = []byte("X-Forwarded-Proto")
	hdrXForwardedHost  = []byte("X-Forwarded-Host")
	protoHTTP          = []byte("http")
)

// bodyBufPool holds the buffers small bodies are read through on their way into the upstream
// request's own buffer.
var bodyBufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

func appendIPv4(dst []byte, ip net.IP) []byte {
	for i, b := range ip {
		if i > 0 {
			dst = append(dst, '.')
		}
		dst = strconv.AppendUint(dst, uint64(b), 10)
	}
	return dst
}
