// Package tracing is Toron's OpenTelemetry side (SPEC 21): W3C traceparent and tracestate
// parsed and written by hand, parent-based sampling at a ratio, a server span per sampled
// request with one client span per upstream attempt, and a bounded exporter that drops (and
// counts) rather than waits. Nothing else in Toron imports the OpenTelemetry SDK.
//
// The gateway keeps one Request by value in each connection's exchange. An unsampled request
// touches only that value: ids are drawn, the incoming tracestate is copied into its reused
// buffer, Toron's traceparent is appended to the upstream head, and nothing is allocated. Only
// a sampled request creates SDK spans.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// MetricSpansDropped counts the spans that never reached the collector: the queue was full
// (the collector is slow or gone), or their export failed (SPEC 21).
const MetricSpansDropped = "toron_tracing_spans_dropped_total"

// Defaults of Options, each with why.
const (
	// DefaultQueueSize bounds the ended spans waiting for export: the SDK's default, about
	// 2 MiB of spans at a few hundred bytes each. A collector gone for good costs no more.
	DefaultQueueSize = 2048
	// DefaultBatchSize is the most spans in one export request (the SDK's default).
	DefaultBatchSize = 512
	// DefaultBatchTimeout is the longest an ended span waits for its batch: one second keeps a
	// trace visible almost at once and costs one small request a second at low traffic.
	DefaultBatchTimeout = time.Second
	// DefaultExportTimeout bounds one export request, connecting included. A collector that
	// hangs holds the export goroutine this long, never a request: the queue fills and drops.
	DefaultExportTimeout = 5 * time.Second
	// DefaultServiceName is the service.name of Toron's spans.
	DefaultServiceName = "toron"
	// errorInterval is the least time between two reports of export errors to OnError: a
	// collector that is down fails every batch, and one line every half a minute says it.
	errorInterval = 30 * time.Second
)

// ErrEndpoint is returned by New for an endpoint that is not an http:// or https:// URL.
var ErrEndpoint = errors.New("tracing: endpoint must be an http:// or https:// URL with a host")

// Options configure a Tracer. The gateway builds them from server.tracing.
type Options struct {
	// Endpoint is the OTLP/HTTP traces URL, path included ("http://collector:4318/v1/traces").
	// Required.
	Endpoint string
	// Headers are sent with every export request (an API key); nil: none.
	Headers map[string]string
	// ServiceName is the resource's service.name; "" means DefaultServiceName.
	ServiceName string
	// ServiceVersion is the resource's service.version; "" leaves it out.
	ServiceVersion string
	// SampleRatio is the share of new traces that are sampled, 0..1; a continued trace follows
	// its caller's sampled flag instead.
	SampleRatio float64
	// TrustIncoming continues a valid incoming traceparent (when the peer is trusted); false
	// starts a new trace for every request.
	TrustIncoming bool
	// QueueSize bounds the spans waiting for export; 0 means DefaultQueueSize.
	QueueSize int
	// BatchSize is the most spans in one export request; 0 means DefaultBatchSize.
	BatchSize int
	// BatchTimeout is the longest a span waits for its batch; 0 means DefaultBatchTimeout.
	BatchTimeout time.Duration
	// ExportTimeout bounds one export request; 0 means DefaultExportTimeout.
	ExportTimeout time.Duration
	// OnError, when set, hears about failed exports, at most once per 30 s (the count of every
	// lost span is in MetricSpansDropped). It is called on the export goroutine.
	OnError func(error)
}

// Tracer samples requests and exports their spans. A nil *Tracer is tracing off: Request.Begin
// with it makes every other Request method a no-op.
type Tracer struct {
	provider  *sdktrace.TracerProvider
	tracer    trace.Tracer
	resource  *resource.Resource
	transport *http.Transport
	proc      *boundedProcessor

	// threshold is the sampling decision on a new trace id, as the SDK's TraceIDRatioBased
	// makes it: sampled when the id's last 8 bytes, shifted right once, are below it.
	threshold atomic.Uint64
	trust     atomic.Bool

	dropped *metrics.Counter
	onError func(error)
	lastErr atomic.Int64 // unix nanoseconds of the last OnError call
}

// DroppedCounter returns the MetricSpansDropped counter of set, creating it: the gateway calls
// it with tracing off too, so that the metric (and its alert) exists from the start.
func DroppedCounter(set *metrics.Set) *metrics.Counter {
	if set == nil {
		return new(metrics.Counter)
	}
	return set.GetOrCreateCounter(MetricSpansDropped)
}

// New builds a Tracer exporting to o.Endpoint. Nothing is sent until spans end; an endpoint
// that does not answer is not an error here (it is counted as drops later). The dropped count
// is MetricSpansDropped of set (nil: a counter of its own).
func New(o Options, set *metrics.Set) (*Tracer, error) {
	u, err := url.Parse(o.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w, not %q", ErrEndpoint, o.Endpoint)
	}
	if o.SampleRatio < 0 || o.SampleRatio > 1 || math.IsNaN(o.SampleRatio) {
		return nil, fmt.Errorf("tracing: sample ratio must be within 0..1, not %v", o.SampleRatio)
	}
	o.QueueSize = orDefault(o.QueueSize, DefaultQueueSize)
	o.BatchSize = min(orDefault(o.BatchSize, DefaultBatchSize), o.QueueSize)
	o.BatchTimeout = orDefault(o.BatchTimeout, DefaultBatchTimeout)
	o.ExportTimeout = orDefault(o.ExportTimeout, DefaultExportTimeout)
	if o.ServiceName == "" {
		o.ServiceName = DefaultServiceName
	}

	t := &Tracer{dropped: DroppedCounter(set), onError: o.OnError}
	t.SetSampling(o.SampleRatio, o.TrustIncoming)
	// A transport of the tracer's own: its connections are closed at Shutdown, and its
	// timeouts bound a collector that accepts and then says nothing.
	t.transport = &http.Transport{
		Proxy:                 nil, // the collector is addressed directly, never through HTTP(S)_PROXY
		DialContext:           (&net.Dialer{Timeout: o.ExportTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   o.ExportTimeout,
		ResponseHeaderTimeout: o.ExportTimeout,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   2,
		ForceAttemptHTTP2:     true,
	}
	opts := []otlptracehttp.Option{
		otlptracehttp.WithEndpointURL(o.Endpoint),
		otlptracehttp.WithHTTPClient(&http.Client{Transport: t.transport, Timeout: o.ExportTimeout}),
		otlptracehttp.WithTimeout(o.ExportTimeout),
		// A retry would hold the export goroutine past ExportTimeout while the queue fills
		// behind it; a span is worth less than the spans queued after it.
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}),
	}
	if len(o.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(o.Headers))
	}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: cannot build the OTLP/HTTP exporter for %s: %w", o.Endpoint, err)
	}
	t.proc = newBoundedProcessor(t, exp, o)

	attrs := []attribute.KeyValue{attribute.String("service.name", o.ServiceName)}
	if o.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", o.ServiceVersion))
	}
	t.resource = resource.NewSchemaless(attrs...)
	t.provider = sdktrace.NewTracerProvider(
		// Toron decides sampling itself, before any SDK call (Request.Begin): the SDK sees
		// sampled requests only, and records all it sees.
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithIDGenerator(idGenerator{}),
		sdktrace.WithResource(t.resource),
		sdktrace.WithSpanProcessor(t.proc),
	)
	t.tracer = t.provider.Tracer("toron")
	// The SDK reports its own failures to a global handler that writes to stderr by default:
	// every failed export would print a line. Toron counts them instead (boundedProcessor).
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {}))
	return t, nil
}

// SetSampling changes the sample ratio (0..1, clamped) and trust_incoming of a running
// Tracer: a reload that changes only those keeps the exporter and its queue.
func (t *Tracer) SetSampling(ratio float64, trustIncoming bool) {
	switch {
	case !(ratio > 0): // NaN included
		t.threshold.Store(0)
	case ratio >= 1:
		t.threshold.Store(math.MaxUint64)
	default:
		t.threshold.Store(uint64(ratio * (1 << 63)))
	}
	t.trust.Store(trustIncoming)
}

// sampleNew makes the sampling decision on a new trace: the SDK's TraceIDRatioBased rule, so
// that the same trace id gets the same answer from Toron as from any OpenTelemetry SDK.
func (t *Tracer) sampleNew(id TraceID) bool {
	th := t.threshold.Load()
	return th == math.MaxUint64 || getUint64(id[8:])>>1 < th
}

// Dropped returns how many spans were dropped so far.
func (t *Tracer) Dropped() uint64 { return t.dropped.Get() }

// Shutdown exports the spans still queued and stops the exporter, within ctx's deadline:
// what is not sent by then is dropped and counted. Spans that end afterwards are discarded.
// Safe on a nil Tracer and when called twice.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	err := t.provider.Shutdown(ctx)
	t.transport.CloseIdleConnections()
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing: spans still queued at the end of the drain were dropped: %w", err)
	}
	return err
}

// reportError hands an export error to OnError, at most once per errorInterval.
func (t *Tracer) reportError(err error) {
	if t.onError == nil {
		return
	}
	now := time.Now().UnixNano()
	last := t.lastErr.Load()
	if last != 0 && now-last < int64(errorInterval) {
		return
	}
	if t.lastErr.CompareAndSwap(last, now) {
		t.onError(err)
	}
}

func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// presetKey carries, in the context of an SDK Start call (spanCtx), the ids Toron already chose
// for the span: the SDK must not draw ids of its own, since the upstream's traceparent and the
// access line already name them.
type presetKey struct{}

// preset holds the ids of the next SDK span of a Request.
type preset struct {
	trace TraceID
	span  SpanID
}

// idGenerator gives the SDK the ids of the context's preset, else random ones.
type idGenerator struct{}

// NewIDs returns the preset trace and span ids of a root span.
func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if p, ok := ctx.Value(presetKey{}).(*preset); ok {
		return trace.TraceID(p.trace), trace.SpanID(p.span)
	}
	return trace.TraceID(newTraceID()), trace.SpanID(newSpanID())
}

// NewSpanID returns the preset span id of a span with a parent.
func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if p, ok := ctx.Value(presetKey{}).(*preset); ok {
		return trace.SpanID(p.span)
	}
	return trace.SpanID(newSpanID())
}

var _ sdktrace.IDGenerator = idGenerator{}
