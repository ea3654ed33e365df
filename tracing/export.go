package tracing

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// boundedProcessor is the SDK span processor between Span.End and the OTLP exporter: ended
// spans wait in a bounded queue and are exported in batches, in the background. It does what
// the SDK's BatchSpanProcessor does, with two differences measured to matter (the small-GET
// benchmarks at sample_ratio 1): a span is queued under a mutex, without the batch
// processor's channel send per span that woke its goroutine (and often an idle thread) twice
// per request, so the export goroutine wakes once per batch or per BatchTimeout; and every
// span lost is counted (the batch processor keeps its count to itself).
//
// A span is admitted only while fewer than QueueSize spans are waiting (in the queue or in an
// export that has not returned), so a collector that hangs turns new spans away after
// QueueSize: turned away at OnEnd, or handed to an export that failed, each is counted.
type boundedProcessor struct {
	t     *Tracer
	exp   sdktrace.SpanExporter
	batch int
	every time.Duration // BatchTimeout
	limit time.Duration // ExportTimeout

	pending atomic.Int64 // spans admitted whose export has not returned yet
	max     int64

	mu     sync.Mutex
	queue  []sdktrace.ReadOnlySpan
	closed bool // Shutdown began: spans that end now are discarded

	wake  chan struct{}      // a full batch waits (buffered: a send never blocks)
	flush chan chan struct{} // ForceFlush: export everything queued, then close the channel
	stop  chan struct{}      // closed by Shutdown
	done  chan struct{}      // closed when the export goroutine returned
	once  sync.Once
	// settled is set when Shutdown gave up waiting and counted what was still pending: an
	// export that finishes (or fails) after that is not counted a second time.
	settled atomic.Bool
}

func newBoundedProcessor(t *Tracer, exp sdktrace.SpanExporter, o Options) *boundedProcessor {
	p := &boundedProcessor{t: t, exp: exp, batch: o.BatchSize, every: o.BatchTimeout, limit: o.ExportTimeout,
		max: int64(o.QueueSize), queue: make([]sdktrace.ReadOnlySpan, 0, o.BatchSize),
		wake: make(chan struct{}, 1), flush: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p
}

// OnStart does nothing: spans are handled when they end.
func (p *boundedProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd admits an ended span into the queue, or drops and counts it. It never blocks: it runs
// on the request's goroutine, inside Span.End.
func (p *boundedProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if p.pending.Add(1) > p.max {
		p.pending.Add(-1)
		p.t.dropped.Inc()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.pending.Add(-1)
		return
	}
	p.queue = append(p.queue, s)
	full := len(p.queue) == p.batch
	p.mu.Unlock()
	if full {
		select {
		case p.wake <- struct{}{}:
		default: // already woken
		}
	}
}

// loop is the export goroutine: a full batch is exported at once, a partial one after
// BatchTimeout.
func (p *boundedProcessor) loop() {
	defer close(p.done)
	timer := time.NewTimer(p.every)
	defer timer.Stop()
	for {
		select {
		case <-p.wake:
			p.export(false)
			continue // the timer keeps running for the partial batch after
		case <-timer.C:
			p.export(true)
		case f := <-p.flush:
			p.export(true)
			close(f)
		case <-p.stop:
			p.export(true)
			return
		}
		timer.Reset(p.every)
	}
}

// export sends the queue in batches of at most BatchSize: every span when all is true, else
// only full batches.
func (p *boundedProcessor) export(all bool) {
	for {
		p.mu.Lock()
		n := len(p.queue)
		if n == 0 || (!all && n < p.batch) {
			p.mu.Unlock()
			return
		}
		n = min(n, p.batch)
		batch := make([]sdktrace.ReadOnlySpan, n)
		copy(batch, p.queue)
		p.queue = append(p.queue[:0], p.queue[n:]...)
		clear(p.queue[len(p.queue):cap(p.queue)]) // the spans moved out are not kept alive here
		p.mu.Unlock()
		p.exportBatch(batch)
	}
}

// exportBatch exports one batch within ExportTimeout. Its spans held their places at the gate
// until now, so that a hanging collector turns new spans away after QueueSize; a failed export
// counts its spans as dropped.
func (p *boundedProcessor) exportBatch(spans []sdktrace.ReadOnlySpan) {
	ctx, cancel := context.WithTimeout(context.Background(), p.limit)
	err := p.exp.ExportSpans(ctx, spans)
	cancel()
	if p.settled.Load() {
		return
	}
	p.pending.Add(-int64(len(spans)))
	if err != nil {
		p.t.dropped.Add(len(spans))
		p.t.reportError(err)
	}
}

// ForceFlush exports every span queued, within ctx.
func (p *boundedProcessor) ForceFlush(ctx context.Context) error {
	f := make(chan struct{})
	select {
	case p.flush <- f:
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports the spans still queued and shuts the exporter down, within ctx. Spans it
// could not export by then are lost: they are counted here. Spans that end afterwards are
// discarded.
func (p *boundedProcessor) Shutdown(ctx context.Context) error {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.stop)
	})
	var err error
	select {
	case <-p.done:
		err = p.exp.Shutdown(ctx)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil && p.settled.CompareAndSwap(false, true) {
		if n := p.pending.Swap(0); n > 0 {
			p.t.dropped.Add(int(n))
		}
	}
	return err
}

var _ sdktrace.SpanProcessor = (*boundedProcessor)(nil)
