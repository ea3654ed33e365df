package tracing

import (
	"context"
	"sync"
	"testing"
	"time"

	"toron/internal/testnet"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
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

// BenchmarkSDKSpansAlone is the SDK's part of BenchmarkRequest/sampled-no-export: the same two spans with
// the same attributes, started and ended by direct SDK calls (context.Background, no preset
// ids), with nothing of Toron's around them. sampled-no-export minus this is Toron's own
// cost of a sampled request's spans.
func BenchmarkSDKSpansAlone(b *testing.B) {
	tr := sinkTracer(b, &spanSink{})
	ctx := context.Background()
	start := time.Now()
	b.ReportAllocs()
	cpu := testnet.ProcessCPU()
	for b.Loop() {
		sctx, server := tr.tracer.Start(ctx, "HTTP", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start))
		_, client := tr.tracer.Start(sctx, "GET", trace.WithSpanKind(trace.SpanKindClient))
		client.SetAttributes(attribute.String(attrMethod, "GET"), attribute.String(attrServerAddr, "127.0.0.1"),
			attribute.Int(attrServerPort, 9001), attribute.Int(attrAttempt, 1), attribute.String(attrOutcome, "ok"),
			attribute.Int(attrStatus, 200))
		client.End()
		server.SetName("GET /api")
		server.SetAttributes(attribute.String(attrMethod, "GET"), attribute.String(attrPath, string(pathAPI)),
			attribute.String(attrRouteName, "api"), attribute.Int(attrStatus, 200), attribute.String(attrRoute, "/api"),
			attribute.String(attrClientAddr, "192.0.2.7"))
		server.End(trace.WithTimestamp(start))
	}
	b.ReportMetric(float64(testnet.ProcessCPU()-cpu)/float64(b.N), "cpu-ns/op")
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
// protobuf encoding (otlptracehttp adds one HTTP request per batch). cpu-ns/span is the figure.
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
	cpu := testnet.ProcessCPU()
	for b.Loop() {
		if err := exp.ExportSpans(ctx, sink.spans); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(testnet.ProcessCPU()-cpu)/float64(b.N*len(sink.spans)), "cpu-ns/span")
	b.ReportMetric(float64(c.bytes)/float64(len(sink.spans)), "bytes/span")
}
