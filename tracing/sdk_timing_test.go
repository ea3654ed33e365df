package tracing

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// The floor of a sampled request, measured piece by piece: what the OpenTelemetry SDK costs
// for Toron's two spans (Start and End, attributes included) and what its OTLP exporter costs
// to turn them into the protobuf body of an export request. Neither is Toron's code; together
// they bound from below what tracing at sample_ratio 1 can cost per request.

// spanSink is a span processor that keeps the ended spans (up to keep) and drops the rest.
type spanSink struct {
	mu    sync.Mutex
	keep  int
	spans []sdktrace.ReadOnlySpan
}

func (s *spanSink) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (s *spanSink) OnEnd(sp sdktrace.ReadOnlySpan) {
	s.mu.Lock()
	if len(s.spans) < s.keep {
		s.spans = append(s.spans, sp)
	}
	s.mu.Unlock()
}
func (s *spanSink) Shutdown(context.Context) error   { return nil }
func (s *spanSink) ForceFlush(context.Context) error { return nil }

// sinkTracer is offlineTracer(tb, 1) whose spans end in sink instead of the exporter: the
// SDK's span work alone.
func sinkTracer(tb testing.TB, sink *spanSink) *Tracer {
	tr := offlineTracer(tb, 1)
	p := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithIDGenerator(idGenerator{}), sdktrace.WithResource(tr.resource),
		sdktrace.WithSpanProcessor(sink))
	tr.tracer = p.Tracer("toron")
	return tr
}

// BenchmarkSampledSpans is a sampled request's spans without export: Toron's calls and the
// SDK's Start, SetAttributes and End of the server span and one client span.
func BenchmarkSampledSpans(b *testing.B) {
	tr := sinkTracer(b, &spanSink{})
	var r Request
	head := make([]byte, 0, 256)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		head = oneRequest(&r, tr, nil, nil, head, now)
	}
}

// marshalClient is an otlptrace.Client doing what otlptracehttp's does before the network:
// the export request marshalled to protobuf.
type marshalClient struct{ bytes int }

func (c *marshalClient) Start(context.Context) error { return nil }
func (c *marshalClient) Stop(context.Context) error  { return nil }
func (c *marshalClient) UploadTraces(_ context.Context, rs []*tracepb.ResourceSpans) error {
	body, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: rs})
	c.bytes = len(body)
	return err
}

// BenchmarkExportMarshal is the OTLP exporter's work per span for a batch of
// DefaultBatchSize spans of Toron's requests: the SDK's conversion to OTLP messages and their
// protobuf encoding (otlptracehttp adds one HTTP request per batch). ns/span is the figure.
func BenchmarkExportMarshal(b *testing.B) {
	sink := &spanSink{keep: DefaultBatchSize}
	tr := sinkTracer(b, sink)
	var r Request
	head := make([]byte, 0, 256)
	for range DefaultBatchSize / 2 {
		head = oneRequest(&r, tr, nil, nil, head, time.Now())
	}
	c := &marshalClient{}
	exp := otlptrace.NewUnstarted(c)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := exp.ExportSpans(ctx, sink.spans); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(sink.spans)), "ns/span")
	b.ReportMetric(float64(c.bytes)/float64(len(sink.spans)), "bytes/span")
}
