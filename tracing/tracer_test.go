package tracing

import (
	"bytes"
	"context"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"toron/internal/otlptest"
	"toron/internal/testnet"

	"github.com/VictoriaMetrics/metrics"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// collector is a real OTLP/HTTP receiver on a loopback port: it decodes each export request's
// protobuf body and keeps the spans.
type collector struct{ *otlptest.Collector }

func newCollector(t *testing.T) *collector { return &collector{otlptest.Start(t)} }

// wait returns the first n spans received, failing after a generous 10 s.
func (c *collector) wait(t *testing.T, n int) []*tracepb.Span {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		spans := c.Spans()
		if len(spans) >= n {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector received %d spans, want %d", len(spans), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newTestTracer builds a Tracer for endpoint with short batches; Shutdown is the test's cleanup.
func newTestTracer(t testing.TB, o Options) *Tracer {
	t.Helper()
	if o.BatchTimeout == 0 {
		o.BatchTimeout = 20 * time.Millisecond
	}
	tr, err := New(o, metrics.NewSet())
	if err != nil {
		t.Fatal(err)
	}
	testnet.ShutdownAtEnd(t, tr.Shutdown)
	return tr
}

func attrs(kv []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kv))
	for _, a := range kv {
		switch v := a.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			out[a.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[a.Key] = itoa(v.IntValue)
		}
	}
	return out
}

func itoa(n int64) string { return string(AppendInt(nil, n)) }

// AppendInt is strconv's, kept local to the test.
func AppendInt(dst []byte, n int64) []byte {
	if n < 0 {
		dst = append(dst, '-')
		n = -n
	}
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }

// serve runs one request through r the way the gateway does: one attempt per status in
// attempts (0: an attempt that failed with failure), then the end. It returns the traceparent
// of each attempt.
func serve(r *Request, tr *Tracer, traceparent, tracestate string, trusted bool, attempts []int, o Outcome) []string {
	var tp, ts []byte
	if traceparent != "" {
		tp = []byte(traceparent)
	}
	if tracestate != "" {
		ts = []byte(tracestate)
	}
	now := time.Now()
	r.Begin(tr, tp, ts, trusted, now)
	var out []string
	for _, status := range attempts {
		r.StartAttempt([]byte("GET"), "127.0.0.1:9001")
		out = append(out, string(r.AppendTraceparent(nil)))
		if status == 0 {
			r.EndAttempt(0, "connect_error")
		} else {
			r.EndAttempt(status, "")
		}
	}
	o.End = time.Now()
	if o.Method == nil {
		o.Method, o.Path, o.Route, o.RoutePrefix = []byte("GET"), []byte("/api/x"), "api", "/api"
		o.ClientIP = netip.MustParseAddr("192.0.2.7")
	}
	r.End(o)
	return out
}

func TestContinuedTrace(t *testing.T) {
	c := newCollector(t)
	tr := newTestTracer(t, Options{Endpoint: c.Endpoint(), SampleRatio: 0, TrustIncoming: true,
		ServiceName: "edge", Headers: map[string]string{"X-Api-Key": "k1"}})
	var r Request
	in := "00-" + sampleTrace + "-" + sampleParent + "-01"
	tps := serve(&r, tr, in, "congo=t61rcWkgMzE", true, []int{0, 200}, Outcome{Status: 200})
	if !r.Continued() || !r.Sampled() {
		t.Fatalf("continued=%v sampled=%v, want both (sampled parent, ratio 0)", r.Continued(), r.Sampled())
	}
	if got := string(r.Tracestate()); got != "congo=t61rcWkgMzE" {
		t.Errorf("tracestate to forward %q", got)
	}
	spans := c.wait(t, 3)
	var server *tracepb.Span
	var clients []*tracepb.Span
	for _, s := range spans {
		if hexOf(s.TraceId) != sampleTrace {
			t.Errorf("span %q in trace %x, want the caller's %s", s.Name, s.TraceId, sampleTrace)
		}
		switch s.Kind {
		case tracepb.Span_SPAN_KIND_SERVER:
			server = s
		case tracepb.Span_SPAN_KIND_CLIENT:
			clients = append(clients, s)
		}
	}
	if server == nil || len(clients) != 2 {
		t.Fatalf("got %d spans, want a server span and 2 client spans (a retry)", len(spans))
	}
	if hexOf(server.ParentSpanId) != sampleParent {
		t.Errorf("server span parent %x, want the caller's span %s", server.ParentSpanId, sampleParent)
	}
	if hexOf(server.SpanId) != hexOf(r.spanID[:]) {
		t.Errorf("server span id %x, want the id Toron chose %x", server.SpanId, r.spanID)
	}
	if server.TraceState != "congo=t61rcWkgMzE" {
		t.Errorf("server span tracestate %q", server.TraceState)
	}
	if server.Name != "GET /api" {
		t.Errorf("server span name %q", server.Name)
	}
	a := attrs(server.Attributes)
	for k, want := range map[string]string{"http.request.method": "GET", "http.route": "/api", "url.path": "/api/x",
		"http.response.status_code": "200", "client.address": "192.0.2.7", "toron.route": "api"} {
		if a[k] != want {
			t.Errorf("server span %s = %q, want %q", k, a[k], want)
		}
	}
	if server.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Error("a 200 is an error span")
	}
	for i, s := range clients {
		if !bytes.Equal(s.ParentSpanId, server.SpanId) {
			t.Errorf("client span %d parent %x, want the server span %x", i, s.ParentSpanId, server.SpanId)
		}
		ca := attrs(s.Attributes)
		if ca["server.address"] != "127.0.0.1" || ca["server.port"] != "9001" {
			t.Errorf("client span %d target %s:%s", i, ca["server.address"], ca["server.port"])
		}
		// The upstream's traceparent names this attempt's client span, sampled.
		want := "00-" + sampleTrace + "-" + hexOf(s.SpanId) + "-01"
		found := false
		for _, tp := range tps {
			found = found || tp == want
		}
		if !found {
			t.Errorf("no attempt carried traceparent %s (got %v)", want, tps)
		}
	}
	outcomes := map[string]bool{}
	for _, s := range clients {
		ca := attrs(s.Attributes)
		outcomes[ca["toron.outcome"]] = true
		if ca["toron.outcome"] == "connect_error" && s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Error("a failed dial is not an error span")
		}
	}
	if !outcomes["connect_error"] || !outcomes["ok"] {
		t.Errorf("client outcomes %v, want connect_error and ok", outcomes)
	}
	res := attrs(c.Resource())
	if res["service.name"] != "edge" {
		t.Errorf("service.name %q", res["service.name"])
	}
	key := c.Header("X-Api-Key")
	if key != "k1" {
		t.Errorf("export request header X-Api-Key = %q", key)
	}
}

func TestUnsampledParentFollowed(t *testing.T) {
	c := newCollector(t)
	tr := newTestTracer(t, Options{Endpoint: c.Endpoint(), SampleRatio: 1, TrustIncoming: true})
	var r Request
	tps := serve(&r, tr, "00-"+sampleTrace+"-"+sampleParent+"-00", "", true, []int{200}, Outcome{Status: 200})
	if r.Sampled() {
		t.Fatal("an unsampled parent was sampled (ratio 1 applies to new traces only)")
	}
	if len(tps) != 1 || tps[0][:36] != "00-"+sampleTrace+"-" || tps[0][52:] != "-00" || tps[0][36:52] == sampleParent {
		t.Errorf("upstream traceparent %v: want the caller's trace, a span of Toron's, flags 00", tps)
	}
	// A sampled request after it proves the export path works: only its spans arrive.
	serve(&r, tr, "", "", true, []int{200}, Outcome{Status: 200})
	spans := c.wait(t, 2)
	time.Sleep(100 * time.Millisecond) // a stray span of the first request would arrive by now
	for _, s := range c.Spans() {
		if hexOf(s.TraceId) == sampleTrace {
			t.Fatalf("span %q of the unsampled trace was exported", s.Name)
		}
	}
	for _, s := range spans {
		if s.Kind == tracepb.Span_SPAN_KIND_SERVER && len(s.ParentSpanId) != 0 {
			t.Errorf("a new trace's server span has parent %x", s.ParentSpanId)
		}
	}
}

func TestNewTraceSampling(t *testing.T) {
	c := newCollector(t)
	tr := newTestTracer(t, Options{Endpoint: c.Endpoint(), SampleRatio: 0, TrustIncoming: true})
	var r Request
	for range 50 {
		serve(&r, tr, "", "", true, []int{200}, Outcome{Status: 200})
		if r.Sampled() || r.Continued() {
			t.Fatal("ratio 0 sampled a new trace")
		}
	}
	tr.SetSampling(1, true)
	tps := serve(&r, tr, "", "", true, []int{200}, Outcome{Status: 200})
	if !r.Sampled() || tps[0][53:] != "01" {
		t.Fatalf("ratio 1: sampled=%v traceparent %v", r.Sampled(), tps)
	}
	spans := c.wait(t, 2)
	if len(spans) != 2 {
		t.Errorf("%d spans, want 2 (the ratio-0 requests exported nothing)", len(spans))
	}
	// About half of new traces at 0.5, by the trace id rule.
	tr.SetSampling(0.5, true)
	n := 0
	for range 2000 {
		r.Begin(tr, nil, nil, true, time.Now())
		if r.Sampled() {
			n++
			r.End(Outcome{Status: 200, End: time.Now()})
		}
	}
	if n < 800 || n > 1200 {
		t.Errorf("ratio 0.5 sampled %d of 2000", n)
	}
}

func TestIncomingNotTrusted(t *testing.T) {
	c := newCollector(t)
	in := "00-" + sampleTrace + "-" + sampleParent + "-01"
	for _, tc := range []struct {
		name          string
		trustIncoming bool
		trustedPeer   bool
	}{
		{"trust_incoming false", false, true},
		{"peer not trusted", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTestTracer(t, Options{Endpoint: c.Endpoint(), SampleRatio: 0, TrustIncoming: tc.trustIncoming})
			var r Request
			tps := serve(&r, tr, in, "congo=x", tc.trustedPeer, []int{200}, Outcome{Status: 200})
			if r.Continued() || r.Sampled() {
				t.Fatalf("continued=%v sampled=%v: the incoming traceparent was followed", r.Continued(), r.Sampled())
			}
			id := r.TraceID()
			if hexOf(id[:]) == sampleTrace || tps[0][3:35] == sampleTrace {
				t.Errorf("trace id kept from the incoming header: %v", tps)
			}
			if r.Tracestate() != nil {
				t.Errorf("tracestate %q passed on for a new trace", r.Tracestate())
			}
		})
	}
}

func TestRejectionIsErrorSpan(t *testing.T) {
	c := newCollector(t)
	tr := newTestTracer(t, Options{Endpoint: c.Endpoint(), SampleRatio: 1})
	var r Request
	serve(&r, tr, "", "", true, nil, Outcome{Method: []byte("POST"), Path: []byte("/up"), Route: "up",
		RoutePrefix: "/up", Status: 413, RejectReason: "body_too_large"})
	s := c.wait(t, 1)[0]
	a := attrs(s.Attributes)
	if s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || a["toron.reject_reason"] != "body_too_large" || a["http.response.status_code"] != "413" {
		t.Errorf("rejection span: status %v, attributes %v", s.Status, a)
	}
}

// TestBatchExport: a full batch is exported at once, without waiting for BatchTimeout; a
// partial one waits for it, or for Shutdown, which flushes it.
func TestBatchExport(t *testing.T) {
	c := newCollector(t)
	tr := newTestTracer(t, Options{Endpoint: c.Endpoint(), SampleRatio: 1, BatchSize: 4, BatchTimeout: time.Hour})
	var r Request
	for range 3 { // 6 spans: one full batch of 4, and 2 left
		serve(&r, tr, "", "", true, []int{200}, Outcome{Status: 200})
	}
	c.wait(t, 4)
	time.Sleep(50 * time.Millisecond)
	if n := len(c.Spans()); n != 4 {
		t.Errorf("collector has %d spans before the batch timeout, want the full batch of 4", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Spans()); n != 6 || tr.Dropped() != 0 {
		t.Errorf("after Shutdown the collector has %d spans (want 6), %d dropped", n, tr.Dropped())
	}
}

// TestTracingOff: a nil Tracer makes every method a no-op.
func TestTracingOff(t *testing.T) {
	var r Request
	tps := serve(&r, nil, "00-"+sampleTrace+"-"+sampleParent+"-01", "", true, []int{200}, Outcome{Status: 200})
	if r.Active() || r.Sampled() || tps[0] != "" || len(r.AppendTraceID(nil)) != 0 {
		t.Errorf("tracing off: active=%v traceparent %q", r.Active(), tps[0])
	}
	if err := (*Tracer)(nil).Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestCollectorDown: export fails at once (nothing listens); requests do not notice, and every
// span is counted as dropped.
func TestCollectorDown(t *testing.T) {
	addr := testnet.RefusedAddr(t)
	errs := make(chan error, 10)
	tr := newTestTracer(t, Options{Endpoint: "http://" + addr + "/v1/traces", SampleRatio: 1,
		OnError: func(err error) { errs <- err }})
	var r Request
	const n = 20
	for range n {
		serve(&r, tr, "", "", true, []int{200}, Outcome{Status: 200})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tr.Shutdown(ctx)
	if got := tr.Dropped(); got != 2*n {
		t.Errorf("dropped %d spans, want %d (every span of %d requests)", got, 2*n, n)
	}
	select {
	case <-errs:
	default:
		t.Error("OnError never heard of the failed exports")
	}
	if len(errs) > 0 {
		t.Errorf("OnError called %d more times within 30 s", len(errs))
	}
}

// TestCollectorHangs: a collector that accepts and never answers holds the export goroutine
// only: ending spans does not wait for it, the queue bound turns spans away (counted), and
// Shutdown returns at its deadline, counting what it could not send.
func TestCollectorHangs(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	t.Cleanup(srv.Close) // after the release below (cleanups run last-in first-out)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })

	set := metrics.NewSet()
	tr, err := New(Options{Endpoint: srv.URL + "/v1/traces", SampleRatio: 1, QueueSize: 8, BatchSize: 4,
		BatchTimeout: 10 * time.Millisecond, ExportTimeout: time.Minute}, set)
	if err != nil {
		t.Fatal(err)
	}
	var r Request
	serve(&r, tr, "", "", true, nil, Outcome{Status: 200})
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no export request reached the collector")
	}
	const n = 200
	begin := time.Now()
	for range n {
		serve(&r, tr, "", "", true, []int{200}, Outcome{Status: 200})
	}
	// An export waits a minute here: a request that waited for one would take that long.
	if d := time.Since(begin); d > 20*time.Second {
		t.Errorf("%d requests took %s behind a hanging collector", n, d)
	}
	if got := tr.Dropped(); got < 2*n-8 {
		t.Errorf("dropped %d spans before shutdown, want at least %d (queue of 8)", got, 2*n-8)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin = time.Now()
	if err := tr.Shutdown(ctx); err == nil {
		t.Error("Shutdown reported a flush that cannot have happened")
	}
	if d := time.Since(begin); d > 20*time.Second {
		t.Errorf("Shutdown took %s past its 200ms bound", d)
	}
	if got := tr.Dropped(); got != 2*n+1 {
		t.Errorf("dropped %d spans after shutdown, want every one (%d)", got, 2*n+1)
	}
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	if !bytes.Contains(buf.Bytes(), []byte(MetricSpansDropped+" ")) {
		t.Errorf("/metrics lacks %s:\n%s", MetricSpansDropped, buf.String())
	}
	once.Do(func() { close(release) })
}
