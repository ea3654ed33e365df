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

	// Only for a sampled request:
	preset preset
	ctx    context.Context // holds the server span: the parent of the client spans
	server trace.Span
	client trace.Span
}

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
	r.server, r.client, r.ctx = nil, nil, nil
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
	ctx := context.Background()
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
	r.preset = preset{trace: r.traceID, span: r.spanID}
	_, r.server = r.t.tracer.Start(context.WithValue(ctx, presetKey{}, &r.preset), "HTTP",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start))
	r.ctx = trace.ContextWithSpan(context.Background(), r.server)
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
	host, port := splitHostPort(addr)
	r.preset = preset{trace: r.traceID, span: r.attemptID}
	_, r.client = r.t.tracer.Start(context.WithValue(r.ctx, presetKey{}, &r.preset), string(method),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String(attrMethod, string(method)),
			attribute.String(attrServerAddr, host),
			attribute.Int(attrServerPort, port),
			attribute.Int(attrAttempt, r.attempts),
		))
}

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
	if status > 0 {
		s.SetAttributes(attribute.Int(attrStatus, status))
	}
	s.SetAttributes(attribute.String(attrOutcome, outcome))
	switch {
	case failure != "":
		s.SetAttributes(attribute.String(attrErrorType, failure))
		s.SetStatus(codes.Error, failure)
	case status >= 500:
		// A client span is an error for any 4xx or 5xx (semantic conventions); Toron marks
		// only the answers that fail the target (5xx), the ones SPEC 13 counts against it.
		s.SetAttributes(attribute.String(attrErrorType, strconv.Itoa(status)))
		s.SetStatus(codes.Error, "")
	}
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
	r.server, r.ctx = nil, nil
	name := string(o.Method)
	if o.RoutePrefix != "" {
		name += " " + o.RoutePrefix
	}
	s.SetName(name)
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs,
		attribute.String(attrMethod, string(o.Method)),
		attribute.String(attrPath, string(o.Path)),
		attribute.String(attrRouteName, o.Route),
		attribute.Int(attrStatus, o.Status),
	)
	if o.RoutePrefix != "" {
		attrs = append(attrs, attribute.String(attrRoute, o.RoutePrefix))
	}
	if o.ClientIP.IsValid() {
		attrs = append(attrs, attribute.String(attrClientAddr, o.ClientIP.String()))
	}
	if o.RejectReason != "" {
		attrs = append(attrs, attribute.String(attrRejectReason, o.RejectReason))
	}
	s.SetAttributes(attrs...)
	switch {
	case o.RejectReason != "":
		s.SetAttributes(attribute.String(attrErrorType, o.RejectReason))
		s.SetStatus(codes.Error, o.RejectReason)
	case o.Status >= 500:
		s.SetAttributes(attribute.String(attrErrorType, strconv.Itoa(o.Status)))
		s.SetStatus(codes.Error, "")
	}
	s.End(trace.WithTimestamp(o.End))
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
