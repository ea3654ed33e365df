package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	up "toron/upstream"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"toron/limits"
	"toron/socket"
	"toron/streaming"
	"toron/timeouts"
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
	if err := x.body.err; err != nil && !errors.Is(err, io.EOF) {
		// The body failed while being buffered: nothing was sent upstream.
		fasthttp.ReleaseRequest(req)
		g.answerForwardError(ctx, x, err)
		x.finish()
		return
	}

	if r.eff.Elevated {
		x.watch = up.WatchClient(cc.Conn)
	}
	sentAt, err := g.forward(x, req, resp)
	if !sentAt.IsZero() {
		x.headerWait = time.Since(sentAt)
	}
	if berr := x.body.err; berr != nil && !errors.Is(berr, io.EOF) {
		// The body never arrived whole (the client left, dripped or crossed the limit): the
		// upstream was never waited for, and the whole body phase is no header wait.
		x.headerWait = 0
	}
	fasthttp.ReleaseRequest(req)
	x.body.release()
	cc.bodyPhase = false
	if w := x.watch; w != nil {
		w.Halt()
		if w.Gone() {
			x.watchGone = true
			// The client left while the upstream worked: nobody to answer (SPEC 5). The socket
			// is closed now, so that fasthttp cannot send its default 200 to a half-closed
			// client that still reads.
			x.status, x.reason = statusClientClosed, reasonClientAbort
			ctx.SetConnectionClose()
			cc.forceClose()
			x.finish()
			return
		}
	}

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

	// The client gets the upstream's Content-Type or none: fasthttp would report its default
	// (text/plain) for a response without one, even a 204.
	resp.Header.SetNoDefaultContentType(true)
	up.CopyResponseHeadersExcept(&ctx.Response.Header, &resp.Header, x.responseRemoves()) // SPEC 20: response_headers remove them (traffic.go)
	ctx.Response.Header.SetStatusCode(resp.StatusCode())
	ctx.Response.Header.SetCanonical(headerRequestID, x.reqID) // the key is canonical: no copy to normalize it
	x.status = resp.StatusCode()
	enc := x.applyResponseTraffic(ctx, int64(resp.Header.ContentLength())) // SPEC 20 (traffic.go)
	if bs := resp.BodyStream(); bs != nil && !resp.SkipBody {
		x.rs.reset(x, bs)
		cl := resp.Header.ContentLength()
		if enc != streaming.Identity {
			x.rs.enc, cl = enc, -1
		}
		if cl < 0 && !ctx.Request.Header.IsHTTP11() && !ctx.IsHead() {
			g.streamToHTTP10(ctx, x)
			return // finished by streamToHTTP10's hijack handler
		}
		x.rs.deferEnd = x.rs.enc != streaming.Identity
		ctx.Response.SetBodyStream(&x.rs, cl)
		return // finished by x.rs.CloseWithError once fasthttp wrote the body
	}
	// No body on the wire (HEAD, 1xx, 204, 304): the upstream's answer is complete.
	x.upDone = true
	if enc != streaming.Identity {
		ctx.Response.Header.Del(fasthttp.HeaderContentEncoding) // nothing was compressed
	}
	if ctx.IsHead() {
		// A HEAD answer has no body but announces the length of the one GET would get.
		if cl := resp.Header.ContentLength(); cl >= 0 {
			ctx.Response.Header.SetContentLength(cl)
		}
	}
	x.finish()
}

// streamToHTTP10 sends a body of unknown length to an HTTP/1.0 client, which cannot read
// chunked framing (RFC 9112 6.1: no Transfer-Encoding to a 1.0 client): the body is written as
// it comes and its end is the end of the connection (Connection: close, no Content-Length), as
// nginx does. fasthttp frames every body of unknown length chunked, so the connection is
// hijacked once the handler returns: fasthttp writes nothing, and the hijack handler (on its own
// goroutine, which fasthttp starts; only this rare path pays for it) writes the header and
// copies the body through the connection's sliding write deadline, then finishes the exchange.
//
// Until the hijack handler runs the exchange records no status: if fasthttp never starts it (the
// socket was closed meanwhile, by a shutdown timeout), clientConn.Close finishes the exchange as
// a client that left, not as a 200 nobody received. The close after the body lingers, so that
// bytes the client sent after its request (a pipelined one) do not turn it into a reset that
// would cut the body's tail.
func (g *Gateway) streamToHTTP10(ctx *fasthttp.RequestCtx, x *exchange) {
	ctx.Response.Header.SetContentLength(-2) // neither Content-Length nor Transfer-Encoding; closes
	status := x.status
	x.status = 0
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		x.status = status
		x.conn.linger.Store(true)
		var err error
		defer func() {
			// fasthttp recovers a panic of the body copy on its own path, and so does this one:
			// the slots are released and the process lives on.
			if p := recover(); p != nil {
				g.log.Error("panic while streaming a response to an HTTP/1.0 client", zap.Any("panic", p), zap.ByteString("request_id", x.reqID))
				err = fmt.Errorf("BUG: gateway: panic while streaming a response: %v", p)
			}
			_ = x.rs.CloseWithError(err)
		}()
		_, err = c.Write(ctx.Response.Header.Header())
		if err == nil {
			_, err = x.rs.WriteTo(c)
		}
	})
}

// answerForwardError answers a failed forward: the client side failing (body cut, client gone,
// Tier-2 413, read timeout) or the upstream failing before its headers (502, 504).
func (g *Gateway) answerForwardError(ctx *fasthttp.RequestCtx, x *exchange, err error) {
	if berr := x.body.err; berr != nil && !errors.Is(berr, io.EOF) {
		err = berr
		switch {
		case errors.Is(err, limits.ErrBodyTooLarge):
			g.writeRejection(ctx, x, rejBodyTooLargeStream)
		case errors.Is(err, streaming.ErrFraming):
			// SPEC 7: a chunk framing error aborted the upstream request before its
			// terminating chunk; the client gets a 400 and the connection closes.
			g.writeRejection(ctx, x, rejBadChunk)
		case errors.Is(err, timeouts.ErrSlowClient):
			g.writeRejection(ctx, x, rejSlowClient)
		case socket.IsTimeout(err):
			g.writeRejection(ctx, x, rejReadTimeout)
		default:
			// The client left mid-body: nobody to answer, and nothing (not fasthttp's default
			// 200) may reach a client that only half-closed.
			x.status, x.reason = statusClientClosed, reasonClientAbort
			x.conn.forceClose()
		}
		// Body bytes may still be in flight: close lingering, so the answer is read, not reset.
		x.conn.linger.Store(true)
		ctx.SetConnectionClose()
		return
	}
	rej := upstreamRejection(err)
	g.writeRejection(ctx, x, rej)
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

	uri := x.route.appendForwardPath(x.scratch[:0], x.path) // strip_prefix, add_prefix (rewrite.go)
	if x.asterisk {
		uri = append(uri[:0], '*')
	}
	// The original query, byte for byte from the request line (fasthttp's client drops an
	// empty one, "/x?").
	if _, q, ok := bytes.Cut(in.RequestURI(), []byte{'?'}); ok {
		uri = append(uri, '?')
		uri = append(uri, q...)
	}
	x.scratch = uri
	out.SetRequestURIBytes(uri)
	req.UseHostHeader = true
	// The upstream sees the client's headers, not fasthttp's defaults: no Content-Type is
	// invented for a body that came without one.
	out.SetNoDefaultContentType(true)
	host := in.Host()
	if len(host) == 0 {
		// Only HTTP/1.0 may come without a Host (validateHeaders); the upstream request needs
		// one, so it names the target, as nginx's proxy_pass does by default.
		out.SetHost(x.route.host)
	} else {
		out.SetHostBytes(host)
	}

	var stack [128]byte
	named, table := up.CollectConnNames(stack[:0], in.PeekAll(fasthttp.HeaderConnection)) // upstream/connnames.go
	defer up.ReleaseConnTable(table)
	// X-Forwarded-For: every previous hop (several header lines are one list, RFC 9110 5.3),
	// then the client, built in a buffer the exchange reuses (SetBytesKV copies it).
	buf := x.xff[:0]
	for k, v := range in.All() {
		switch {
		case up.IsHopByHop(k), named.Has(k),
			equalFold(k, hdrHost), equalFold(k, hdrContentLength),
			equalFold(k, hdrXForwardedProto), equalFold(k, hdrXForwardedHost), equalFold(k, headerRequestID):
			continue
		case x.dropsIdentityHeader(k): // SPEC 16: X-Real-IP; an untrusted peer's forwarded headers
			continue
		case x.dropsTraceHeader(k): // SPEC 21: Toron's traceparent replaces the client's (trace.go)
			continue
		case x.removesRequestHeader(k): // SPEC 20: request_headers remove it (traffic.go)
			continue
		case equalFold(k, hdrXForwardedFor):
			buf = append(buf, v...)
			buf = append(buf, ", "...)
			continue
		}
		out.AddBytesKV(k, v)
	}
	buf = appendRemoteIP(buf, ctx)
	x.xff = buf
	// The keys are canonical: SetCanonical skips SetBytesKV's copy and normalization.
	out.SetCanonical(hdrXForwardedFor, buf)
	out.SetCanonical(hdrXForwardedProto, g.proto)
	if len(host) > 0 {
		out.SetCanonical(hdrXForwardedHost, host)
	}
	x.forwardIdentity(in, out) // SPEC 16: X-Real-IP; a trusted peer's X-Forwarded-Proto/Host
	out.SetCanonical(headerRequestID, x.reqID)
	x.route.setForwardedPrefix(out)
	x.setTraceHeaders(out)
	x.applyRequestTraffic(out) // SPEC 20: request_headers, after Toron's own (traffic.go)
}

// appendRemoteIP appends the client's IP address as text, without allocating for IPv4.
func appendRemoteIP(dst []byte, ctx *fasthttp.RequestCtx) []byte {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip4 := a.IP.To4(); ip4 != nil {
			return appendIPv4(dst, ip4)
		}
		return append(dst, a.IP.String()...)
	}
	return append(dst, ctx.RemoteAddr().String()...)
}

func appendIPv4(dst []byte, ip net.IP) []byte {
	for i, b := range ip {
		if i > 0 {
			dst = append(dst, '.')
		}
		dst = strconv.AppendUint(dst, uint64(b), 10)
	}
	return dst
}

var (
	hdrHost            = []byte("Host")
	hdrContentLength   = []byte("Content-Length")
	hdrXForwardedFor   = []byte("X-Forwarded-For")
	hdrXForwardedProto = []byte("X-Forwarded-Proto")
	hdrXForwardedHost  = []byte("X-Forwarded-Host")
	protoHTTP          = []byte("http")
)
