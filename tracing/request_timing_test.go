package tracing

import (
	"net/netip"
	"testing"
	"time"

	"toron/internal/testnet"
)

// offlineTracer is a Tracer whose collector is never reached: its spans queue (then drop)
// without a network round trip in the measured loop. Shutdown drops what is left.
func offlineTracer(tb testing.TB, ratio float64) *Tracer {
	tb.Helper()
	return newTestTracer(tb, Options{Endpoint: "http://127.0.0.1:9/v1/traces", SampleRatio: ratio, TrustIncoming: true,
		BatchTimeout: time.Hour})
}

// oneRequest is the gateway's sequence for a request with one upstream attempt.
func oneRequest(r *Request, tr *Tracer, tp, ts []byte, head []byte, now time.Time) []byte {
	r.Begin(tr, tp, ts, true, now)
	r.StartAttempt(methodGET, "127.0.0.1:9001")
	head = r.AppendTraceparent(head[:0])
	if st := r.Tracestate(); st != nil {
		head = append(head, st...)
	}
	r.EndAttempt(200, "")
	head = r.AppendTraceID(head)
	r.End(Outcome{Method: methodGET, Path: pathAPI, Route: "api", RoutePrefix: "/api", Status: 200,
		ClientIP: clientIP, End: now})
	return head
}

var (
	methodGET = []byte("GET")
	pathAPI   = []byte("/api/users")
	clientIP  = netip.MustParseAddr("192.0.2.7")
)

// TestUnsampledRequestAllocs: SPEC 21's promise, an unsampled request allocates nothing for
// tracing, for a new trace and for a continued unsampled one with a tracestate.
func TestUnsampledRequestAllocs(t *testing.T) {
	tr := offlineTracer(t, 0)
	var r Request
	head := make([]byte, 0, 256)
	now := time.Now()
	tp := []byte("00-" + sampleTrace + "-" + sampleParent + "-00")
	ts := []byte("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
	for name, hdr := range map[string][2][]byte{"new trace": {nil, nil}, "continued, unsampled": {tp, ts}} {
		oneRequest(&r, tr, hdr[0], hdr[1], head, now) // the tracestate buffer grows once
		if n := testing.AllocsPerRun(200, func() { head = oneRequest(&r, tr, hdr[0], hdr[1], head, now) }); n != 0 {
			t.Errorf("%s: %v allocs per request, want 0", name, n)
		}
		if r.Sampled() {
			t.Errorf("%s: sampled", name)
		}
	}
}

// BenchmarkRequest is the gateway's sequence of calls for one request with one attempt: tracing
// off, on and unsampled, sampled (the spans queue for an exporter that cannot reach its
// collector), and sampled with the spans ending in a sink (the span work without export: see
// sdk_timing_test.go). cpu-ns/op is the process's CPU per request.
func BenchmarkRequest(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tracer func(testing.TB) *Tracer
	}{
		{"off", func(testing.TB) *Tracer { return nil }},
		{"unsampled", func(tb testing.TB) *Tracer { return offlineTracer(tb, 0) }},
		{"sampled", func(tb testing.TB) *Tracer { return offlineTracer(tb, 1) }},
		{"sampled-no-export", func(tb testing.TB) *Tracer { return sinkTracer(tb, &spanSink{}) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tr := bc.tracer(b)
			var r Request
			head := make([]byte, 0, 256)
			now := time.Now()
			b.ReportAllocs()
			cpu := testnet.ProcessCPU()
			for b.Loop() {
				head = oneRequest(&r, tr, nil, nil, head, now)
			}
			b.ReportMetric(float64(testnet.ProcessCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
