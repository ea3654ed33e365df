package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"toron/conf"
	"toron/tracing"
	up "toron/upstream"
)

// The gateway's side of tracing (SPEC 21): which tracer is in force, when a request's trace
// begins and ends, Toron's traceparent on each upstream attempt, and the incoming trace headers
// kept from the upstream. The spans themselves are package tracing's; the per-request state is
// the exchange's trace field, so an unsampled request allocates nothing here either.

var (
	hdrTraceparent = []byte(tracing.HeaderTraceparent)
	hdrTracestate  = []byte(tracing.HeaderTracestate)
	// The same as fasthttp normalizes them, for SetCanonical.
	hdrTraceparentCanonical = []byte("Traceparent")
	hdrTracestateCanonical  = []byte("Tracestate")
)

// minTraceFlush is the least time the shutdown gives the exporter for the spans still queued,
// even when shutdown_timeout was used up by the requests.
const minTraceFlush = time.Second

// tracers holds the tracer in force (nil: tracing off), the configuration it was built from,
// and the tracers a reload replaced, flushed in the background.
type tracers struct {
	cur      atomic.Pointer[tracing.Tracer]
	cfg      conf.Tracing // of cur; read and written by New, Reload and Shutdown only
	retiring sync.WaitGroup
}

// tracingOptions turns server.tracing into the tracer's options.
func (g *Gateway) tracingOptions(c conf.Tracing) tracing.Options {
	log := g.log
	return tracing.Options{
		Endpoint:      c.Endpoint,
		Headers:       c.Headers,
		ServiceName:   c.ServiceName,
		SampleRatio:   c.SampleRatio,
		TrustIncoming: c.TrustIncoming,
		OnError: func(err error) {
			log.Warn("trace export failed: spans are dropped (toron_tracing_spans_dropped_total) until the collector answers",
				zap.String("endpoint", c.Endpoint), zap.Error(err))
		},
	}
}

// setTracing puts server.tracing in force, at start and on every reload. Only the sampling
// keys changed: the running tracer takes them, its queue kept. The exporter's keys changed
// (endpoint, headers, service_name) or tracing was turned on or off: a new tracer replaces it,
// and the old one flushes what it holds in the background (requests still in flight under it
// end their spans into it until then).
func (g *Gateway) setTracing(c conf.Tracing) error {
	t := &g.tracers
	old := t.cur.Load()
	if old != nil && sameExporter(t.cfg, c) {
		old.SetSampling(c.SampleRatio, c.TrustIncoming)
		t.cfg = c
		return nil
	}
	var next *tracing.Tracer
	if c.Enabled() {
		var err error
		if next, err = tracing.New(g.tracingOptions(c), g.set); err != nil {
			return err
		}
	}
	t.cur.Store(next)
	t.cfg = c
	if old != nil {
		t.retiring.Go(func() {
			// Requests admitted before the swap may still end spans into it for a while.
			time.Sleep(time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), tracing.DefaultExportTimeout)
			defer cancel()
			_ = old.Shutdown(ctx)
		})
	}
	return nil
}

// sameExporter reports whether a and b export the same way (endpoint, headers, service name).
func sameExporter(a, b conf.Tracing) bool {
	if a.Endpoint != b.Endpoint || a.ServiceName != b.ServiceName || len(a.Headers) != len(b.Headers) {
		return false
	}
	for k, v := range a.Headers {
		if w, ok := b.Headers[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// shutdownTracing flushes the spans still queued (SPEC 21: at drain), within ctx or at least
// minTraceFlush.
func (g *Gateway) shutdownTracing(ctx context.Context) {
	t := g.tracers.cur.Swap(nil)
	if ctx.Err() != nil || timeLeft(ctx) < minTraceFlush {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), minTraceFlush)
		defer cancel()
	}
	if err := t.Shutdown(ctx); err != nil {
		g.log.Warn("trace flush at shutdown", zap.Error(err))
	}
	g.tracers.retiring.Wait()
}

func timeLeft(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return time.Hour
}

// beginTrace starts the request's trace once its client identity is known: the incoming
// traceparent counts only from a trusted peer when trusted_proxies is set (SPEC 21, SPEC 16).
func (x *exchange) beginTrace(h *fasthttp.RequestHeader) {
	t := x.g.tracers.cur.Load()
	if t == nil {
		return
	}
	x.trace.Begin(t, h.PeekBytes(hdrTraceparent), h.PeekBytes(hdrTracestate), !x.untrustedPeer, x.start)
	x.out.Observer = x
}

// endTrace ends the request's server span with what the access line says.
func (x *exchange) endTrace(end time.Time) {
	if !x.trace.Sampled() {
		x.trace.End(tracing.Outcome{}) // an open attempt's id is forgotten; nothing to record
		return
	}
	o := tracing.Outcome{Method: x.method, Path: x.path, Route: x.stats.name, Status: x.status,
		ClientIP: x.clientIPOf(), RejectReason: x.reason.String(), End: end}
	if x.route != nil {
		o.RoutePrefix = x.route.conf.Prefix
	}
	x.trace.End(o)
}

// dropsTraceHeader reports an incoming trace header that Toron replaces by its own (with
// tracing on: the upstream's parent is Toron's client span, never the client's).
func (x *exchange) dropsTraceHeader(k []byte) bool {
	return x.trace.Active() && (equalFold(k, hdrTraceparent) || equalFold(k, hdrTracestate))
}

// setTraceHeaders sets Toron's traceparent for the current attempt, and the tracestate of a
// continued trace, on the upstream request. A proxied request's attempts set them as they
// start (AttemptStart); a tunnel's one attempt started before its request was built.
func (x *exchange) setTraceHeaders(h *fasthttp.RequestHeader) {
	if !x.trace.InAttempt() {
		return
	}
	x.traceparent = x.trace.AppendTraceparent(x.traceparent[:0])
	h.SetCanonical(hdrTraceparentCanonical, x.traceparent)
	if ts := x.trace.Tracestate(); ts != nil {
		h.SetCanonical(hdrTracestateCanonical, ts)
	}
}

// AttemptStart opens the client span of an attempt on addr and names it in the upstream
// request's traceparent (up.AttemptObserver).
func (x *exchange) AttemptStart(addr string, req *fasthttp.Request) {
	x.trace.StartAttempt(x.method, addr)
	x.setTraceHeaders(&req.Header)
}

// AttemptEnd ends the attempt's client span: a response head (err nil), or what failed.
func (x *exchange) AttemptEnd(err error, resp *fasthttp.Response) {
	switch {
	case !x.trace.Sampled():
		x.trace.EndAttempt(0, "")
	case err == nil:
		x.trace.EndAttempt(resp.StatusCode(), "")
	default:
		x.trace.EndAttempt(0, attemptFailure(err))
	}
}

// attemptFailure names what ended an attempt without a response, for its span's error.type.
func attemptFailure(err error) string {
	if errors.Is(err, up.ErrClientLeft) {
		return "client_left"
	}
	switch upstreamRejection(err) {
	case rejUpstreamTLS:
		return "tls_error"
	case rejUpstreamDialTimeout:
		return "connect_timeout"
	case rejUpstreamRefused:
		return "connect_refused"
	case rejUpstreamReset:
		return "reset"
	case rejUpstreamWriteTimeout:
		return "write_timeout"
	case rejUpstreamTimeout:
		return "response_header_timeout"
	}
	return "upstream_error"
}

var _ up.AttemptObserver = (*exchange)(nil)
