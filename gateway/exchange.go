package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"
	"toron/auth"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"toron/tracing"
	up "toron/upstream"
)

// localKind marks a request the gateway answers itself, without a route or a worker.
type localKind uint8

const (
	localNone localKind = iota
	localHealth
	localMetrics
)

// exchange is the state of one request from its headers to its last response byte. It lives in
// the clientConn (no allocation per request) and is reset by begin for each new request.
//
// Ownership: the slots taken at admission (route bulkhead, elevated budget, worker) are released
// exactly once, by finish, which every path reaches: the handler for buffered answers, the
// response stream's close for streamed ones, the error handler for requests cut before their
// handler, and clientConn.Close for a client that vanished in between.
type exchange struct {
	g      *Gateway
	conn   *clientConn
	curCtx *fasthttp.RequestCtx

	active atomic.Bool

	snap  *snapshot
	route *route
	stats *routeStats

	start         time.Time
	local         localKind
	rej           *rejection
	bodyAnnounced bool
	chunked       bool
	asterisk      bool // OPTIONS *
	// answered: the gateway's own answer (a rejection, a traffic rule's, /health or /metrics)
	// is in the response; writeRejection and serveLocal write once per request.
	answered bool

	holdsRoute  bool
	holdsBudget bool
	holdsWorker bool

	status     int
	reason     reason
	bytesIn    int64
	bytesOut   int64
	headerWait time.Duration

	path    []byte // the normalized path: matched and forwarded
	method  []byte // kept here: fasthttp resets the request before its error handler
	reqID   []byte
	scratch []byte
	tbuf    []byte // traffic rules' expanded values (traffic.go), reused
	lines   []byte // request_headers' lines for the upstream request (traffic.go), reused
	xff     []byte

	upResp *fasthttp.Response
	// upConn is the upstream connection lent to this request by its route's pool, held until
	// the response was released; upSlot says the request holds one of the pool's slots.
	// upReusable (the response allows keep-alive) and upDone (its body was read to the end)
	// decide whether the connection goes back to the pool. watch is the client watch of an
	// elevated request; watchGone says its client left (the connection must not be reused).
	upConn     *up.Conn
	upTarget   *up.Target // the target that serves the request, between Pick and Done
	upPool     *up.Pool   // its connection pool, while upSlot
	upStatus   int        // the status of the upstream's response head
	upAddr     string     // the target's host:port, for the access log
	upSlot     bool
	upReusable bool
	upDone     bool
	watch      *up.Watch
	watchGone  bool
	out        up.Outbound // the upstream request head's buffer, the streamed body, the watch
	att        up.Attempt  // Forward's result (forward.go)
	body       bodyReader
	rs         respStream

	// The client's identity (SPEC 16), resolved once per request in decide (clientip.go):
	// every consumer (access log, X-Real-IP, rate_limit, client_ip_hash) reads clientIP.
	peer          netip.Addr // the TCP peer, or the PROXY header's source
	clientIP      netip.Addr // invalid until decide resolved it (see clientIPOf)
	trustedPeer   bool       // the peer is in trusted_proxies: its forwarded headers are kept
	untrustedPeer bool       // trusted_proxies is set and the peer is not in it: they are dropped
	retryAfter    []byte     // the Retry-After of a rate_limit 429 (ratelimit.go)

	// Access control (access.go): the check's input, and a refusal that varies per request.
	authIn      auth.Input
	authVerdict auth.Verdict
	authRej     rejection

	ws wsState // a WebSocket upgrade's handshake (tunnel.go)

	trace       tracing.Request // the request's trace state (trace.go)
	traceparent []byte          // Toron's traceparent for the current attempt, reused
	traceHex    []byte          // the trace id as text for the access line, reused

	elapsed    time.Duration // from start to finish, for the duration histogram and the access line
	logFields  [16]zap.Field // the access line's fields, reused (logAccess)
	ipText     []byte        // the client IP as text, reused (ipTextOf)
	ipTextAddr netip.Addr    // the address ipText was made for
}

// begin starts the exchange of a new request on this connection. A previous request that was
// never finished (fasthttp answered it without our handler) is finished first.
func (x *exchange) begin(g *Gateway, ctx *fasthttp.RequestCtx) {
	if x.active.Load() {
		x.finish()
	}
	x.g = g
	x.curCtx = ctx
	x.snap = nil
	x.route = nil
	x.stats = g.none
	// From the request's first byte, as nginx's $request_time counts: the timestamp taken
	// when the connection went active, and no clock read of its own.
	x.start = x.conn.activeAt
	x.local = localNone
	x.rej = nil
	x.bodyAnnounced = false
	x.chunked = false
	x.asterisk = false
	x.answered = false
	x.status = 0
	x.reason = reasonNone
	x.bytesIn = 0
	x.bytesOut = 0
	x.headerWait = 0
	x.upAddr = ""
	x.body.err = nil // a body is read whole only once attachBody read it for this request
	x.path = x.path[:0]
	x.method = x.method[:0]
	x.reqID = x.reqID[:0]
	x.clientIP = netip.Addr{}
	x.ws.reset()
	x.trace.Begin(nil, nil, nil, false, time.Time{}) // not traced until decide says so (trace.go)
	x.out.Observer = nil
	x.active.Store(true)
}

// reject records the answer the gateway gives instead of forwarding.
func (x *exchange) reject(r *rejection) {
	x.rej = r
	x.status = r.status
	x.reason = r.reason
}

// abandon finishes an exchange whose connection is closing. A request that was never answered
// counts as 499: its client left.
func (x *exchange) abandon() {
	if !x.active.Load() {
		return
	}
	if x.status == 0 {
		x.status = statusClientClosed
		x.reason = reasonClientAbort
	}
	x.finish()
}

// statusClientClosed is nginx's 499, used in metrics and logs for a client that left before its
// answer (SPEC 8).
const statusClientClosed = 499

// finish releases the slots, releases the upstream response, counts the request and writes its
// access line, exactly once.
func (x *exchange) finish() {
	if !x.active.CompareAndSwap(true, false) {
		return
	}
	if cc := x.conn; cc != nil {
		cc.deferResponseEnd() // what fasthttp writes now ends the response (conn.go)
	}
	g := x.g
	x.body.release()
	if x.upResp != nil {
		fasthttp.ReleaseResponse(x.upResp)
		x.upResp = nil
	}
	if w := x.watch; w != nil {
		// Halted already, unless a panic skipped the proxy's halt.
		w.Halt()
		x.watch = nil
	}
	if c := x.upConn; c != nil {
		// After the response: the connection goes back to the pool only if its answer was read
		// to the end, with nothing left over, and the request's body was forwarded whole.
		bodyOK := x.body.err == nil || errors.Is(x.body.err, io.EOF)
		x.upPool.Put(c, x.upReusable && x.upDone && bodyOK && !x.watchGone)
		x.upConn = nil
	}
	x.upReusable, x.upDone, x.watchGone = false, false, false
	if x.upSlot {
		x.upSlot = false
		x.upPool.Release()
	}
	x.upPool = nil
	x.doneTarget()
	x.ws.release(x)
	x.releaseAdmission()
	st := x.stats
	if x.local != localNone {
		return
	}
	if x.reason != reasonNone {
		st.rejected[x.reason].Inc()
	}
	st.codeCounter(x.status).Inc()
	x.elapsed = time.Since(x.start) // one clock read for the histogram and the access line
	x.endTrace(x.start.Add(x.elapsed))
	st.duration.Update(x.elapsed.Seconds())
	if x.headerWait > 0 {
		st.headerWait.Update(x.headerWait.Seconds())
	}
	st.bodyIn.Add(int(x.bytesIn))
	st.bodyOut.Add(int(x.bytesOut))
	if g.access.Load() {
		g.logAccess(x)
	}
}

// releaseAdmission gives back the slots taken at admission (SPEC 3 step 11): the worker, the
// elevated budget and the route's bulkhead, each once. finish calls it, and so does a tunnel
// once its 101 is sent (an open tunnel holds none of them, SPEC 15).
func (x *exchange) releaseAdmission() {
	g := x.g
	if x.holdsWorker {
		x.holdsWorker = false
		g.workers.Release()
	}
	if x.holdsBudget {
		x.holdsBudget = false
		g.budget.Release()
	}
	if x.holdsRoute {
		x.holdsRoute = false
		x.route.stats.bulkhead.Release()
	}
}

// doneTarget gives the target that served the request its outcome, once (SPEC 13 judges a
// target by its response head: an upstream that aborts mid-body after a 200 head is a success,
// a 502, 503 or 504 head a failure). A tunnel calls it when it ends: it counts in its target's
// in-flight requests while it is open.
func (x *exchange) doneTarget() {
	if t := x.upTarget; t != nil {
		x.upTarget = nil
		t.Done(up.OutcomeOf(x.upStatus), x.upStatus)
	}
}

// logAccess writes the access line of SPEC 8: encoded here, in zap's JSON layout, when the
// logger is the binary's JSON one (accessline.go), else through zap.
func (g *Gateway) logAccess(x *exchange) {
	if fc := g.accessJSON; fc != nil {
		if fc.Enabled(zapcore.InfoLevel) {
			// The clock read of finish (start + elapsed) is the line's time, as zap's Check
			// would read it a few nanoseconds later.
			fc.sink.writeAccess(x.start.Add(x.elapsed), x)
		}
		return
	}
	ce := g.log.Check(zap.InfoLevel, AccessLogMessage)
	if ce == nil {
		return
	}
	ce.Write(g.accessFields(x)...)
}

// accessFields returns the access line's fields, in the exchange's own array (not a slice
// allocated per line).
func (g *Gateway) accessFields(x *exchange) []zap.Field {
	remote := x.conn.remoteString()
	method, path := x.method, x.path
	ipText := x.ipTextOf(x.clientIPOf())
	// The buffers are reused by the connection's next request: s copies them unless the core
	// encodes the line before Write returns (logString).
	s := g.logString
	fields := append(x.logFields[:0],
		zap.String("request_id", s(x.reqID)),
		zap.String("route", x.stats.name),
		zap.String("method", s(method)),
		zap.String("path", s(path)),
		zap.Int("status", x.status),
		zap.Int64("bytes_in", x.bytesIn),
		zap.Int64("bytes_out", x.bytesOut),
		zap.Duration("duration", x.elapsed),
		zap.Duration("upstream_header_wait", x.headerWait),
		zap.String("reject_reason", x.reason.String()),
		zap.String("remote", remote),
		zap.String("target", x.upAddr),
		zap.String("client_ip", s(ipText)),
	)
	if x.trace.Active() {
		x.traceHex = x.trace.AppendTraceID(x.traceHex[:0])
		fields = append(fields, zap.String("trace_id", s(x.traceHex)))
	}
	return fields
}

// ctx returns the connection's RequestCtx (fasthttp keeps one per connection).
func (x *exchange) ctx() *fasthttp.RequestCtx { return x.curCtx }

// newIDPrefix returns a random per-process prefix for generated request ids.
func newIDPrefix() string {
	var b [6]byte
	_, _ = io.ReadFull(rand.Reader, b[:])
	return hex.EncodeToString(b[:])
}

// maxRequestIDBytes bounds a client-supplied X-Request-Id; a longer or non-printable one is
// replaced by a generated id (it ends up in logs and upstream headers).
const maxRequestIDBytes = 128

// setRequestID keeps a sane client X-Request-Id or generates prefix-counter (h may be nil).
func (x *exchange) setRequestID(h *fasthttp.RequestHeader) {
	if h != nil {
		if v := h.Peek("X-Request-Id"); len(v) > 0 && len(v) <= maxRequestIDBytes && printable(v) {
			x.reqID = append(x.reqID[:0], v...)
			return
		}
	}
	x.reqID = append(x.reqID[:0], x.g.idPrefix...)
	x.reqID = append(x.reqID, '-')
	x.reqID = strconv.AppendUint(x.reqID, x.g.reqSeq.Add(1), 16)
}

func printable(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
