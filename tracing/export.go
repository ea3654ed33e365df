package tracing

import (
	"context"
	"sync/atomic"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// boundedProcessor puts the SDK's BatchSpanProcessor behind a gate that counts. The batch
// processor drops a span when its queue is full (it never blocks: BlockOnQueueFull is off) but
// keeps the count to itself; the gate admits a span only while fewer than QueueSize spans are
// waiting (in the queue, in the batch being filled, or being exported), so the batch processor's own queue never
// overflows and every span lost is counted here: turned away at the gate, or handed to an
// export that failed.
type boundedProcessor struct {
	sdktrace.SpanProcessor // the batch processor

	t       *Tracer
	pending atomic.Int64 // spans admitted whose export has not returned yet
	max     int64
	// settled is set when Shutdown gave up waiting and counted what was still pending: an
	// export that finishes (or fails) after that is not counted a second time.
	settled atomic.Bool
}

func newBoundedProcessor(t *Tracer, exp sdktrace.SpanExporter, o Options) *boundedProcessor {
	p := &boundedProcessor{t: t, max: int64(o.QueueSize)}
	p.SpanProcessor = sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, p: p},
		sdktrace.WithMaxQueueSize(o.QueueSize),
		sdktrace.WithMaxExportBatchSize(o.BatchSize),
		sdktrace.WithBatchTimeout(o.BatchTimeout),
		sdktrace.WithExportTimeout(o.ExportTimeout),
	)
	return p
}

// OnEnd admits an ended span into the queue, or drops and counts it. It never blocks: it runs
// on the request's goroutine, inside Span.End.
func (p *boundedProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if p.pending.Add(1) > p.max {
		p.pending.Add(-1)
		p.t.dropped.Inc()
		return
	}
	p.SpanProcessor.OnEnd(s)
}

// Shutdown flushes the batch processor within ctx. Spans it could not export by then are lost:
// they are counted here.
func (p *boundedProcessor) Shutdown(ctx context.Context) error {
	err := p.SpanProcessor.Shutdown(ctx)
	if err != nil && p.settled.CompareAndSwap(false, true) {
		if n := p.pending.Swap(0); n > 0 {
			p.t.dropped.Add(int(n))
		}
	}
	return err
}

// countingExporter releases the gate's places of the spans it is handed, and counts as dropped
// the spans of an export that failed (collector down, refusing, or past ExportTimeout).
type countingExporter struct {
	sdktrace.SpanExporter
	p *boundedProcessor
}

// ExportSpans exports one batch. Its spans hold their places at the gate until the export
// returned, so that a hanging collector turns new spans away after QueueSize, however the batch
// processor splits them between its queue and its batch.
func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if e.p.settled.Load() {
		return err
	}
	e.p.pending.Add(-int64(len(spans)))
	if err != nil {
		e.p.t.dropped.Add(len(spans))
		e.p.t.reportError(err)
	}
	return err
}

var (
	_ sdktrace.SpanProcessor = (*boundedProcessor)(nil)
	_ sdktrace.SpanExporter  = (*countingExporter)(nil)
)
