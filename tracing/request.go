package tracing

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys: OpenTelemetry's HTTP semantic conventions (stable since 1.23), and Toron's own
// under toron.*.
const (
	attrMethod       = "http.request.method"
	attrRoute        = "http.route"
	attrPath         = "url.path"
	attrStatus       = "http.response.status_code"
	attrClientAddr   = "client.address"
	attrServerAddr   = "server.address"
	attrServerPort   = "server.port"
	attrErrorType    = "error.type"
	attrRejectReason = "toron.reject_reason"
	attrRouteName    = "toron.route"
	attrOutcome      = "toron.outcome"
	attrAttempt      = "toron.attempt"
)

// Request is the trace state of one request from its headers to its end. The gateway keeps it
// by value in its per-connection exchange and calls Begin for each request: an unsampled
// request uses nothing else, so it allocates nothing.
//
// Sequence: Begin; for each upstream attempt StartAttempt, AppendTraceparent (into the upstream
// request head), EndAttempt; End. Every method is a no-op when Begin was given a nil Tracer.
// A Request is used by one goroutine at a time.
type Request struct {
	t         *Tracer
	traceID   TraceID
	spanID    SpanID // the server span's id, sampled or not
	attemptID SpanID // the current attempt's client span id; zero between attempts
	attempts  int
	sampled   bool
	continued bool
	state     []byte // the tracestate received with a continued trace, reused

	// Only for a sampled request. The SDK calls take their contexts, options and attributes
	// from here, so that nothing of Toron's is allocated per span: the SDK's own span, its
	// context and its snapshot at End are all a sampled request allocates (besides the path
	// and the start and end times the SDK boxes).
	serverCtx   spanCtx // the server span's ids over the caller's remote span (or nothing)
	clientCtx   spanCtx // an attempt's ids over the server span's context
	server      trace.Span
	client      trace.Span
	attemptAddr string // the current attempt's target, "host:port"
	method      string // the request's method, interned when it is a common one
	startOpts   [2]trace.SpanStartOption
	endOpts     [1]trace.SpanEndOption
	attrs       [9]attribute.KeyValue // one span's attributes, set in one call at its end

	// Per-connection caches: a keep-alive connection's requests mostly share them.
	name, nameMethod, namePrefix string     // the last server span name, of method and prefix
	ip                           netip.Addr // the last client address, and its text
	ipText                       string
}

// spanCtx is the context of one SDK Start call: it carries the ids Toron chose for the span to
// idGenerator, over the parent's context. It lives in the Request, so handing its address to
// the SDK allocates nothing.
type spanCtx struct {
	context.Context
	ids preset
}

// Value answers the preset ids, and asks the parent context for anything else.
func (c *spanCtx) Value(key any) any {
	if _, ok := key.(presetKey); ok {
		return &c.ids
	}
	return c.Context.Value(key)
}

// Span start options that never change, boxed once.
var (
	serverKind = trace.WithSpanKind(trace.SpanKindServer)
	clientKind = trace.WithSpanKind(trace.SpanKindClient)
)

// Begin starts the trace state of a request. traceparent and tracestate are the request's
// header values (nil when absent); trustedPeer says the peer may set them (true when
// trusted_proxies is empty, else the peer is in it). A valid traceparent from a trusted peer
// continues its trace and follows its sampled flag when the Tracer trusts incoming headers;
// otherwise a new trace starts, sampled at the ratio. start is when the request began. With a
// nil t the request is not traced.
func (r *Request) Begin(t *Tracer, traceparent, tracestate []byte, trustedPeer bool, start time.Time) {
	r.t = t
	r.attemptID = SpanID{}
	r.attempts = 0
	r.state = r.state[:0]
	r.server, r.client = nil, nil
	if t == nil {
		return
	}
	r.continued = false
	if len(traceparent) > 0 && trustedPeer && t.trust.Load() {
		if p, ok := ParseParent(traceparent); ok {
			r.continued = true
			r.traceID = p.TraceID
			r.sampled = p.Sampled()
			if len(tracestate) > 0 && ValidTracestate(tracestate) {
				r.state = append(r.state, tracestate...)
			}
			r.spanID = newSpanID()
			if r.sampled {
				r.startServer(p.SpanID, start)
			}
			return
		}
	}
	r.traceID = newTraceID()
	r.spanID = newSpanID()
	r.sampled = t.sampleNew(r.traceID)
	if r.sampled {
		r.startServer(SpanID{}, start)
	}
}

// startServer starts the SDK server span with the ids Begin chose; parent is the caller's span
// of a continued trace, zero for a new trace.
func (r *Request) startServer(parent SpanID, start time.Time) {
	var ctx context.Context = context.Background()
	if parent != (SpanID{}) {
		sc := trace.SpanContextConfig{
			TraceID:    trace.TraceID(r.traceID),
			SpanID:     trace.SpanID(parent),
			TraceFlags: trace.FlagsSampled,
			Remote:     true,
		}
		if len(r.state) > 0 {
			// An invalid list is passed on to the upstream byte for byte all the same (W3C
			// lets a vendor do either); only the span's copy is left empty.
			if ts, err := trace.ParseTraceState(string(r.state)); err == nil {
				sc.TraceState = ts
			}
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(sc))
	}
	r.serverCtx = spanCtx{Context: ctx, ids: preset{trace: r.traceID, span: r.spanID}}
	r.startOpts = [2]trace.SpanStartOption{serverKind, trace.WithTimestamp(start)}
	var sctx context.Context
	sctx, r.server = r.t.tracer.Start(&r.serverCtx, "HTTP", r.startOpts[:]...)
	// The attempts' parent: the context the SDK made, which holds the server span.
	r.clientCtx.Context = sctx
}

// Active reports whether the request is traced (tracing is on): then its upstream requests
// carry Toron's traceparent, and its access line a trace_id.
func (r *Request) Active() bool { return r.t != nil }

// Sampled reports whether the request records spans.
func (r *Request) Sampled() bool { return r.t != nil && r.sampled }

// Continued reports whether the request continues its caller's trace.
func (r *Request) Continued() bool { return r.t != nil && r.continued }

// TraceID returns the request's trace id (zero when not traced).
func (r *Request) TraceID() TraceID {
	if r.t == nil {
		return TraceID{}
	}
	return r.traceID
}

// SpanID returns the id of the request's server span (recorded or not).
func (r *Request) SpanID() SpanID { return r.spanID }

// AppendTraceID appends the trace id as 32 hex digits to dst, nothing when not traced.
func (r *Request) AppendTraceID(dst []byte) []byte {
	if r.t == nil {
		return dst
	}
	return appendHex(dst, r.traceID[:])
}

// Tracestate returns the tracestate to forward upstream: the one received with a continued
// trace, else nil. The bytes are the Request's own, valid until the next Begin.
func (r *Request) Tracestate() []byte {
	if r.t == nil || len(r.state) == 0 {
		return nil
	}
	return r.state
}

// StartAttempt opens the client span of one upstream attempt to addr ("host:port") with method.
// An attempt left open is ended first, as a failure. The clock is read for a sampled request
// only.
func (r *Request) StartAttempt(method []byte, addr string) {
	if r.t == nil {
		return
	}
	if r.attemptID != (SpanID{}) {
		r.EndAttempt(0, "abandoned")
	}
	r.attempts++
	r.attemptID = newSpanID()
	if !r.sampled || r.server == nil {
		return
	}
	r.attemptAddr = addr
	r.method = methodString(method)
	r.clientCtx.ids = preset{trace: r.traceID, span: r.attemptID}
	r.startOpts = [2]trace.SpanStartOption{clientKind}
	_, r.client = r.t.tracer.Start(&r.clientCtx, r.method, r.startOpts[:1]...)
}

// InAttempt reports whether the request is traced and an upstream attempt is open (between
// StartAttempt and EndAttempt).
func (r *Request) InAttempt() bool { return r.t != nil && r.attemptID != (SpanID{}) }

// AppendTraceparent appends Toron's traceparent for the upstream request to dst: the request's
// trace, the current attempt's client span as parent (the server span's before any attempt),
// and the sampled flag.
func (r *Request) AppendTraceparent(dst []byte) []byte {
	if r.t == nil {
		return dst
	}
	parent := r.attemptID
	if parent == (SpanID{}) {
		parent = r.spanID
	}
	return AppendTraceparent(dst, r.traceID, parent, r.sampled)
}

// EndAttempt ends the current attempt's client span: status is the upstream's response status
// (0 when there was none), failure names what went wrong ("" for a response: the outcome is
// "ok"; "connect_error", "upstream_timeout", ... otherwise).
func (r *Request) EndAttempt(status int, failure string) {
	if r.t == nil || r.attemptID == (SpanID{}) {
		return
	}
	r.attemptID = SpanID{}
	s := r.client
	if s == nil {
		return
	}
	r.client = nil
	outcome := failure
	if outcome == "" {
		outcome = "ok"
	}
	host, port := splitHostPort(r.attemptAddr)
	a := append(r.attrs[:0],
		attribute.String(attrMethod, r.method),
		attribute.String(attrServerAddr, host),
		attribute.Int(attrServerPort, port),
		attribute.Int(attrAttempt, r.attempts),
		attribute.String(attrOutcome, outcome),
	)
	if status > 0 {
		a = append(a, attribute.Int(attrStatus, status))
	}
	switch {
	case failure != "":
		a = append(a, attribute.String(attrErrorType, failure))
		s.SetStatus(codes.Error, failure)
	case status >= 500:
		// A client span is an error for any 4xx or 5xx (semantic conventions); Toron marks
		// only the answers that fail the target (5xx), the ones SPEC 13 counts against it.
		a = append(a, attribute.String(attrErrorType, strconv.Itoa(status)))
		s.SetStatus(codes.Error, "")
	}
	s.SetAttributes(a...)
	s.End()
}

// Outcome is what the server span records when the request ends.
type Outcome struct {
	// Method and Path are the request's method and normalized path.
	Method, Path []byte
	// Route is the route's name ("none" without a route); RoutePrefix its prefix ("" without).
	Route, RoutePrefix string
	// Status is the status answered (499: the client left; 101 for a tunnel).
	Status int
	// ClientIP is the client's address (SPEC 16).
	ClientIP netip.Addr
	// RejectReason is the toron_rejected_total reason, "" when the request was not rejected.
	RejectReason string
	// End is when the request ended (a tunnel: when its 101 was sent).
	End time.Time
}

// End ends the server span. A rejection (a reject reason) or a 5xx is an error span. An open
// attempt is ended first. Only the first End of a request records.
func (r *Request) End(o Outcome) {
	if r.t == nil {
		return
	}
	if r.attemptID != (SpanID{}) {
		r.EndAttempt(0, "abandoned")
	}
	s := r.server
	if s == nil {
		return
	}
	r.server, r.clientCtx.Context = nil, nil
	method := methodString(o.Method)
	if method != r.nameMethod || o.RoutePrefix != r.namePrefix || r.name == "" {
		r.name, r.nameMethod, r.namePrefix = method, method, o.RoutePrefix
		if o.RoutePrefix != "" {
			r.name = method + " " + o.RoutePrefix
		}
	}
	s.SetName(r.name)
	a := append(r.attrs[:0],
		attribute.String(attrMethod, method),
		attribute.String(attrPath, string(o.Path)),
		attribute.String(attrRouteName, o.Route),
		attribute.Int(attrStatus, o.Status),
	)
	if o.RoutePrefix != "" {
		a = append(a, attribute.String(attrRoute, o.RoutePrefix))
	}
	if o.ClientIP.IsValid() {
		if o.ClientIP != r.ip || r.ipText == "" {
			r.ip, r.ipText = o.ClientIP, o.ClientIP.String()
		}
		a = append(a, attribute.String(attrClientAddr, r.ipText))
	}
	if o.RejectReason != "" {
		a = append(a, attribute.String(attrRejectReason, o.RejectReason))
	}
	switch {
	case o.RejectReason != "":
		a = append(a, attribute.String(attrErrorType, o.RejectReason))
		s.SetStatus(codes.Error, o.RejectReason)
	case o.Status >= 500:
		a = append(a, attribute.String(attrErrorType, strconv.Itoa(o.Status)))
		s.SetStatus(codes.Error, "")
	}
	s.SetAttributes(a...)
	r.endOpts[0] = trace.WithTimestamp(o.End)
	s.End(r.endOpts[:]...)
}

// methodString returns the method as a string, without allocating for the common ones.
func methodString(m []byte) string {
	switch string(m) {
	case "GET":
		return "GET"
	case "HEAD":
		return "HEAD"
	case "POST":
		return "POST"
	case "PUT":
		return "PUT"
	case "PATCH":
		return "PATCH"
	case "DELETE":
		return "DELETE"
	case "OPTIONS":
		return "OPTIONS"
	}
	return string(m)
}

// splitHostPort splits "host:port"; a missing or bad port is 0.
func splitHostPort(addr string) (string, int) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0
	}
	port, _ := strconv.Atoi(p)
	return host, port
}
