package gateway

import (
	"bytes"
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"toron/limits"
	"toron/socket"
	"toron/timeouts"
)

// Tier-1 413 and admission before the body (SPEC 3 steps 1-7).
//
// fasthttp reads the headers, calls Server.HeaderReceived, then (with StreamRequestBody)
// pre-reads up to 8 KiB of the body before our handler runs, blocking while those bytes have
// not arrived (SPEC 12). A verdict reached in the handler alone would therefore wait for body
// bytes. So every decision that needs only the headers is made in onHeaders: framing, health
// and metrics, route, declared-length 413, bulkhead, elevated budget and worker. The verdict is
// stored in the connection's exchange. When it is a rejection and a body was announced,
// onHeaders returns a read timeout of one nanosecond: the pre-read fails at once, fasthttp
// resets the request and calls ErrorHandler, which writes the stored answer. No body byte is
// waited for and no upstream is dialed. With Expect: 100-continue fasthttp does not pre-read;
// onExpect answers the stored rejection instead of 100 Continue. Rejections of requests that
// announced a body close the connection, after a lingering close (socket.LingerClose) so
// the client reads the status rather than a reset.

// preReadFailFast is the read timeout that makes fasthttp's body pre-read fail at once.
const preReadFailFast = time.Nanosecond

// onHeaders is fasthttp's HeaderReceived hook.
func (g *Gateway) onHeaders(h *fasthttp.RequestHeader) (rc fasthttp.RequestConfig) {
	ctx := ctxOfHeader(h)
	cc := connOf(ctx)
	x := cc.ex()
	x.begin(g, ctx)
	defer func() {
		// A bug in the hook must not take the process down: the request gets a 500 and the
		// connection closes (the hook runs outside the handler's recover).
		if p := recover(); p != nil {
			g.log.Error("panic in the header hook", zap.Any("panic", p))
			ctx.Response.Reset() // an answer may have been half written (below)
			x.answered = false
			x.reject(rejInternal)
			x.bodyAnnounced = true
			cc.linger.Store(true)
			rc = fasthttp.RequestConfig{ReadTimeout: preReadFailFast}
		}
	}()
	g.decide(h, x)
	fault(faultHeaderHook)
	srv := &x.snap.cfg.Server
	cc.bodyPhase = false
	cc.writeWin.Carry(srv.WriteTimeout, srv.MinProgressBytes)
	if x.bodyAnnounced && (x.rej != nil || x.local != localNone) {
		// Answered from the headers, with Connection: close, the body never read nor waited
		// for (SPEC 3). The answer is written now: fasthttp resets the request when the
		// pre-read we cut fails, before onError, and an answer may read the request's headers
		// (a redirect's Location, the CORS headers).
		if x.rej != nil {
			g.writeRejection(ctx, x, x.rej)
		} else {
			g.serveLocal(ctx, x)
		}
		cc.linger.Store(true)
		return fasthttp.RequestConfig{ReadTimeout: preReadFailFast}
	}
	if x.rej != nil {
		return fasthttp.RequestConfig{}
	}
	if x.route != nil {
		eff := &x.route.eff
		cc.writeWin.Carry(eff.WriteTimeout, eff.MinProgressBytes)
		var rc fasthttp.RequestConfig
		if x.bodyAnnounced {
			// The body, and fasthttp's pre-read of its first 8 KiB, are read under the route's
			// sliding window (clientConn.Read).
			rc.ReadTimeout = eff.ReadTimeout
			cc.bodyPhase = true
			cc.readWin.Carry(eff.ReadTimeout, eff.MinProgressBytes)
		}
		if x.chunked {
			rc.MaxRequestBodySize = chunkedRaw(h).MaxRequestBodySize
		}
		return rc
	}
	return fasthttp.RequestConfig{}
}

// decide runs SPEC 3 steps 2-6 on the headers alone.
func (g *Gateway) decide(h *fasthttp.RequestHeader, x *exchange) {
	snap := g.snap.Load()
	x.snap = snap
	if isHigherHTTP1(h.Protocol()) {
		processAsHTTP11(h)
	}
	cl := h.ContentLength()
	x.chunked = cl == -1
	x.bodyAnnounced = cl > 0 || x.chunked

	// Step 2: framing. Anything ambiguous closes the connection.
	if err := validateHeaders(h); err != nil {
		x.bodyAnnounced = true
		// The answer still gets an id, generated: nothing in a malformed request is trusted.
		x.setRequestID(nil)
		x.reject(rejBadRequest)
		return
	}
	// An absolute-form target names the host itself: the Host header is ignored and replaced
	// by the target's authority, for routing and forwarding alike (RFC 9112 3.2.2), so that
	// Toron and whatever sits behind it cannot disagree about the host.
	if auth, ok := targetAuthority(h.RequestURI()); ok {
		h.SetHostBytes(auth)
	}
	// OPTIONS * (asterisk-form) asks about the server, not a path: it is routed as "/" and
	// forwarded as "*" (RFC 9112 3.2.4).
	x.asterisk = string(h.RequestURI()) == "*"
	x.path = appendPath(x.path[:0], h.RequestURI())
	x.method = append(x.method[:0], h.Method()...)
	x.setRequestID(h)
	x.resolveClientIP(h)
	if unsupportedExpectation(h) {
		// Decided from the headers, before any body byte and before routing (expect.go).
		x.reject(rejExpectation)
		return
	}

	// Step 3: the gateway's own paths, before the route table, never taking a worker.
	switch {
	case bytes.Equal(x.path, snap.healthPath):
		x.local = localHealth
		return
	case x.conn.ln.redirect:
		// The HTTPS redirect listener serves only the health path (SPEC 20, redirect.go).
		x.reject(ansHTTPSListener)
		return
	case bytes.Equal(x.path, snap.metricsPath):
		x.local = localMetrics
		return
	}
	x.beginTrace(h) // after the client identity, never for the gateway's own paths (trace.go)
	if len(h.Peek(fasthttp.HeaderUpgrade)) > 0 || h.IsConnect() {
		// A WebSocket upgrade goes on to routing; any other upgrade is refused (tunnel.go).
		if !checkUpgrade(h, x) {
			return
		}
	}

	// Step 4: route.
	i := snap.table.match(h.Host(), h.Method(), x.path)
	if h.IsOptions() {
		i = preflightRoute(snap, h, x.path, i)
	}
	if i < 0 {
		x.reject(rejNoRoute)
		return
	}
	r := snap.routes[i]
	x.route = r
	x.stats = r.stats
	if r.traffic != nil && x.answerAtRouting(r.traffic) {
		return // a redirect route, or https_only on plain http (SPEC 20, traffic.go)
	}
	if x.ws.upgrade && r.tun == nil {
		x.reject(rejWebSocketOff)
		return
	}

	// Step 4a: access, 403, on the client IP (SPEC 19, access.go).
	if !r.ac.allowsClient(x) {
		x.reject(rejForbidden)
		return
	}

	// Step 5: Tier 1, the declared length.
	if int64(cl) > r.eff.MaxBodyBytes {
		x.reject(rejBodyTooLarge)
		return
	}
	if r.traffic != nil && x.answerPreflight(h, r.traffic) {
		return // a CORS preflight: no worker, no upstream (SPEC 20, traffic.go)
	}

	// Step 6: admission. The client's rate limit first (SPEC 17), never queued.
	if r.rl != nil && !r.rl.allow(h, x) {
		x.reject(rejRateLimited)
		return
	}
	// Auth, 401 / the auth service's answer / 503, waiting within its own bound and holding no
	// slot or worker (access.go).
	if !g.authorize(h, x, r.ac) {
		return
	}
	if x.ws.upgrade {
		g.admitTunnel(x)
		return
	}
	if err := g.admit(x); err != nil {
		x.reject(admissionRejection(err))
	}
}

// admit takes the route's bulkhead slot, the elevated budget and a worker, in that order
// (SPEC 3 step 6); on a refusal it gives back what it took.
func (g *Gateway) admit(x *exchange) error {
	r := x.route
	if !r.stats.bulkhead.TryAcquire() {
		return limits.ErrConcurrency
	}
	x.holdsRoute = true
	if r.eff.Elevated {
		if !g.budget.TryAcquire() {
			x.holdsRoute = false
			r.stats.bulkhead.Release()
			return limits.ErrElevatedBudget
		}
		x.holdsBudget = true
	}
	if !g.workers.Acquire(x.snap.cfg.Server.WorkerQueueTimeout) {
		if x.holdsBudget {
			x.holdsBudget = false
			g.budget.Release()
		}
		x.holdsRoute = false
		r.stats.bulkhead.Release()
		return limits.ErrWorkersSaturated
	}
	x.holdsWorker = true
	return nil
}

// onExpect is fasthttp's ExpectHandler: 100 Continue only after Tier 1 and admission passed
// (SPEC 3 step 7); a rejected request gets its final status with its JSON instead, and fasthttp
// closes the connection without reading the body.
func (g *Gateway) onExpect(ctx *fasthttp.RequestCtx) int {
	x := connOf(ctx).ex()
	if x.rej != nil {
		g.writeRejection(ctx, x, x.rej)
		return x.status // a redirect's is its route's status, not its rejection's default
	}
	if x.answered {
		return ctx.Response.StatusCode() // no 100 Continue for the gateway's own paths
	}
	return fasthttp.StatusContinue
}

// onError is fasthttp's ErrorHandler. It runs when fasthttp could not read a request: a header
// it refused (before onHeaders ran), or a body pre-read that failed, including the one our
// verdict cut on purpose. fasthttp closes the connection after it.
func (g *Gateway) onError(ctx *fasthttp.RequestCtx, err error) {
	cc := connOf(ctx)
	x := cc.ex()
	switch {
	case x.active.Load() && x.answered:
		// The pre-read we cut after answering from the headers (onHeaders).
	case x.active.Load() && x.rej != nil:
		g.writeRejection(ctx, x, x.rej)
	case x.active.Load():
		if isClientGone(err) || (x.bodyAnnounced && isEOF(err)) {
			// Including a client that closed before fasthttp's pre-read of the body's first
			// bytes completed: it left, it did not send a malformed request.
			x.status, x.reason = statusClientClosed, reasonClientAbort
			cc.forceClose()
			break
		}
		x.reject(clientErrorRejection(err))
		lingerUnlessTimeout(cc, err)
		g.writeRejection(ctx, x, x.rej)
	case cc.headBytes == 0 && socket.IsTimeout(err):
		// A new connection that never sent a byte (a preconnecting client or load balancer, or
		// a port scan) is closed without an answer and without counting a request: there was
		// none. fasthttp writes whatever the handler left, so the socket is closed first.
		cc.forceClose()
		return
	default:
		// fasthttp refused the request before our hook saw it: there is no path or route,
		// but the answer and the access line still get a request id, and its duration counts
		// from the request's first byte (a header timeout lasted read_timeout, not nothing).
		x.begin(g, ctx)
		if cc.activeAt.Before(x.start) {
			x.start = cc.activeAt
		}
		x.setRequestID(nil)
		x.reject(clientErrorRejection(err))
		lingerUnlessTimeout(cc, err)
		g.writeRejection(ctx, x, x.rej)
	}
	ctx.SetConnectionClose()
	x.finish()
}

// lingerUnlessTimeout makes the close after a refused request linger: fasthttp stopped reading
// mid-request (a 431 leaves the rest of the headers unread, a malformed request whatever
// followed it), and closing a socket with unread bytes sends a reset that can destroy the
// answer before the client reads it. A client cut for being slow (a read timeout, or a body
// that arrived below the minimum rate) was barely sending: its connection closes at once, so
// that a drip attack holds nothing longer.
func lingerUnlessTimeout(cc *clientConn, err error) {
	if !socket.IsTimeout(err) && !errors.Is(err, timeouts.ErrSlowClient) {
		cc.linger.Store(true)
	}
}

// handle is the fasthttp handler: everything after the body pre-read.
func (g *Gateway) handle(ctx *fasthttp.RequestCtx) {
	cc := connOf(ctx)
	x := cc.ex()
	defer func() {
		if p := recover(); p != nil {
			g.log.Error("panic in request handler", zap.Any("panic", p), zap.ByteString("request_id", x.reqID))
			x.reject(rejInternal)
			ctx.Response.Reset()
			x.answered = false // whatever was written is gone
			g.writeRejection(ctx, x, rejInternal)
			ctx.SetConnectionClose()
			x.finish()
		}
	}()
	if g.draining.Load() {
		ctx.SetConnectionClose()
	}
	switch {
	case x.rej != nil:
		g.writeRejection(ctx, x, x.rej)
		x.finish()
	case x.local != localNone:
		g.serveLocal(ctx, x)
		x.finish()
	case x.ws.upgrade:
		g.tunnel(ctx, cc, x)
	default:
		fault(faultHandler)
		g.proxy(ctx, cc, x)
	}
}

// writeRejection writes one of the gateway's own answers.
func (g *Gateway) writeRejection(ctx *fasthttp.RequestCtx, x *exchange, r *rejection) {
	if x.answered {
		return // written from the header hook (onHeaders)
	}
	x.answered = true
	if r.traffic {
		g.writeTraffic(ctx, x, r) // redirects and CORS preflights (traffic.go)
		return
	}
	x.status, x.reason = r.status, r.reason
	ctx.Response.Header.SetStatusCode(r.status)
	ctx.Response.Header.SetContentTypeBytes(contentTypeJSON)
	ctx.Response.SetBodyRaw(r.body)
	// The keys are canonical: SetCanonical skips SetBytesKV's copy and normalization.
	if r.retryAfter {
		ctx.Response.Header.SetCanonical(headerRetryAfter, retryAfterSeconds)
	}
	if r == rejRateLimited {
		ctx.Response.Header.SetCanonical(headerRetryAfter, x.retryAfter) // SPEC 17: until a token is back
	}
	writeAuthHeaders(ctx, x, r) // a challenge, Retry-After: 1, a relayed answer's headers (access.go)
	if x.route != nil && x.route.traffic != nil && x.route.traffic.cors != nil {
		// A browser reads Toron's own answers (401, 403, 413, 429, 502, ...) on a cors route
		// only with the CORS headers, as it reads the upstream's (SPEC 20).
		x.route.traffic.cors.actual(&ctx.Response.Header, &ctx.Request.Header)
	}
	if len(x.reqID) > 0 {
		ctx.Response.Header.SetCanonical(headerRequestID, x.reqID)
	}
	if x.bodyAnnounced || closesConnection(r.status) {
		ctx.SetConnectionClose()
	}
	if x.bodyAnnounced && !errors.Is(x.body.err, io.EOF) && r.reason != reasonReadTimeout && r.reason != reasonSlowClient {
		// Every answer given while the client may still be sending its body (a 502 of a refused
		// dial or an exhausted pool, an upstream reset mid-upload, the 500 of a panic, ...)
		// closes lingering: closing with unread bytes sends a reset, which can destroy the
		// answer before the client reads it (SPEC 12). A client cut for being slow was barely
		// sending and closes at once (lingerUnlessTimeout).
		x.conn.linger.Store(true)
	}
	x.bytesOut = int64(len(r.body))
}

// closesConnection reports the answers after which the connection is not reused even without
// a body in flight: the request was malformed or timed out (the stream cannot be trusted), or
// the gateway itself failed. 404, 413 without a body, 502, 503 and 504 keep a keep-alive
// connection, as nginx does.
func closesConnection(status int) bool {
	switch status {
	case fasthttp.StatusBadRequest, fasthttp.StatusRequestTimeout,
		fasthttp.StatusRequestHeaderFieldsTooLarge, fasthttp.StatusInternalServerError,
		fasthttp.StatusNotImplemented:
		return true
	}
	return false
}

var (
	contentTypeJSON   = []byte("application/json")
	headerRetryAfter  = []byte("Retry-After")
	retryAfterSeconds = []byte("5")
	headerRequestID   = []byte("X-Request-Id")
	healthOK          = []byte(`{"status":"ok"}`)
	healthDraining    = []byte(`{"status":"draining"}`)
)

// serveLocal answers the gateway's own paths, once per request: from the header hook when a
// body was announced (it is never read), else from the handler.
func (g *Gateway) serveLocal(ctx *fasthttp.RequestCtx, x *exchange) {
	if x.answered {
		return
	}
	x.answered = true
	if x.local == localHealth {
		g.serveHealth(ctx)
	} else {
		g.serveMetrics(ctx)
	}
	if x.bodyAnnounced {
		// Nobody reads a body sent to the gateway's own paths; fasthttp's lenient chunked
		// decoder must not parse it to find the next request.
		ctx.SetConnectionClose()
	}
}

func (g *Gateway) serveHealth(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.SetContentTypeBytes(contentTypeJSON)
	if g.draining.Load() {
		ctx.Response.Header.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.Response.SetBodyRaw(healthDraining)
		return
	}
	ctx.Response.SetBodyRaw(healthOK)
}

func (g *Gateway) serveMetrics(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	g.set.WritePrometheus(ctx)
}

// appendPath appends the normalized path of a request-target (origin-form or absolute-form)
// to dst; the query is not part of it.
func appendPath(dst, uri []byte) []byte {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	if len(uri) > 0 && uri[0] != '/' {
		// absolute-form: scheme://authority/path
		if i := bytes.Index(uri, []byte("://")); i >= 0 {
			rest := uri[i+3:]
			if j := bytes.IndexByte(rest, '/'); j >= 0 {
				uri = rest[j:]
			} else {
				uri = nil
			}
		}
	}
	return normalizePath(dst, uri)
}
