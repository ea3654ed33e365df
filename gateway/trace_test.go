package gateway

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"toron/internal/otlptest"
	"toron/internal/testnet"
)

// SPEC 21 through the whole request path: a real OTLP/HTTP receiver decodes what the gateway
// exports, and a real upstream records the traceparent it was sent.

// otlpCollector is an OTLP/HTTP traces receiver on loopback.
type otlpCollector struct{ *otlptest.Collector }

func startCollector(t *testing.T) *otlpCollector { return &otlpCollector{otlptest.Start(t)} }

// tracingYAML is the server.tracing block pointing at c.
func (c *otlpCollector) tracingYAML(ratio string, extra string) string {
	return fmt.Sprintf("tracing:\n  endpoint: %s\n  sample_ratio: %s\n%s", c.Endpoint(), ratio, indent(extra, "  "))
}

// trace waits (10 s at most) for the server span of trace id and its n client spans.
func (c *otlpCollector) trace(t *testing.T, id string, n int) (server *tracepb.Span, clients []*tracepb.Span) {
	t.Helper()
	ok := testnet.WaitUntil(10*time.Second, func() bool {
		server, clients = nil, nil
		for _, s := range c.Spans() {
			if hex.EncodeToString(s.TraceId) != id {
				continue
			}
			if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
				server = s
			} else {
				clients = append(clients, s)
			}
		}
		return server != nil && len(clients) >= n
	})
	if !ok {
		t.Fatalf("trace %s: server span %v, %d client spans, want %d", id, server != nil, len(clients), n)
	}
	return server, clients
}

func spanAttrs(s *tracepb.Span) map[string]string {
	out := map[string]string{}
	for _, a := range s.Attributes {
		switch v := a.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			out[a.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[a.Key] = fmt.Sprint(v.IntValue)
		}
	}
	return out
}

// traceUpstream records the traceparent and tracestate of every request it answers.
type traceUpstream struct {
	*upstream
	mu      sync.Mutex
	parents []string
	states  []string
}

func startTraceUpstream(t *testing.T) *traceUpstream {
	tu := &traceUpstream{}
	tu.upstream = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		tu.mu.Lock()
		tu.parents = append(tu.parents, strings.Join(r.Header.Values("Traceparent"), "|"))
		tu.states = append(tu.states, strings.Join(r.Header.Values("Tracestate"), "|"))
		tu.mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})
	return tu
}

func (tu *traceUpstream) last() (parent, state string) {
	tu.mu.Lock()
	defer tu.mu.Unlock()
	if len(tu.parents) == 0 {
		return "", ""
	}
	return tu.parents[len(tu.parents)-1], tu.states[len(tu.states)-1]
}

const (
	inTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	inParent = "00f067aa0ba902b7"
)

// traceOf returns the trace id of a traceparent.
func traceOf(t *testing.T, tp string) string {
	t.Helper()
	if len(tp) != 55 || tp[:3] != "00-" {
		t.Fatalf("traceparent %q is not Toron's (version 00, 55 bytes)", tp)
	}
	return tp[3:35]
}

// TestTraceRetryShowsTwoClientSpans: a refused dial retried on the other target gives two
// client spans under one server span, and the upstream's traceparent names the second.
func TestTraceRetryShowsTwoClientSpans(t *testing.T) {
	c := startCollector(t)
	live := startTraceUpstream(t)
	dead := refusedAddr(t)
	gw := startGateway(t, c.tracingYAML("1", ""), targetsRoute("/api", []string{dead, live.addr}, "balance: round_robin\nretries: 1"))
	var retried bool
	for i := 0; i < 4 && !retried; i++ {
		s, _, _, err := getStatus(gw.addr, "/api/x")
		if err != nil || s != 200 {
			t.Fatalf("request %d: %d %v", i, s, err)
		}
		tp, _ := live.last()
		server, clients := c.trace(t, traceOf(t, tp), 1)
		if len(clients) < 2 {
			continue
		}
		retried = true
		if len(clients) != 2 {
			t.Fatalf("%d client spans for one retry", len(clients))
		}
		var failed, ok *tracepb.Span
		for _, s := range clients {
			if string(s.ParentSpanId) != string(server.SpanId) {
				t.Errorf("client span %q not under the server span", s.Name)
			}
			switch spanAttrs(s)["toron.outcome"] {
			case "connect_refused":
				failed = s
			case "ok":
				ok = s
			}
		}
		if failed == nil || ok == nil {
			t.Fatalf("client spans %v, %v: want one connect_refused, one ok", spanAttrs(clients[0]), spanAttrs(clients[1]))
		}
		if failed.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || spanAttrs(failed)["server.port"] != dead[strings.LastIndexByte(dead, ':')+1:] {
			t.Errorf("failed attempt: status %v, attributes %v", failed.Status, spanAttrs(failed))
		}
		if want := "00-" + traceOf(t, tp) + "-" + hex.EncodeToString(ok.SpanId) + "-01"; tp != want {
			t.Errorf("upstream traceparent %s, want %s (its parent is the attempt that reached it)", tp, want)
		}
		if a := spanAttrs(server); a["http.route"] != "/api" || a["http.response.status_code"] != "200" || a["url.path"] != "/api/x" || a["client.address"] != "127.0.0.1" {
			t.Errorf("server span attributes %v", a)
		}
	}
	if !retried {
		t.Fatal("no request was retried: round_robin never picked the refused target first")
	}
}

// TestTraceRejectionsAreErrorSpans: a 413, a 429 and a 503 each give an error span with the
// reject reason.
func TestTraceRejectionsAreErrorSpans(t *testing.T) {
	c := startCollector(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	slow := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		_, _ = io.WriteString(w, "late")
	})
	fast := startTraceUpstream(t)
	gw := startGateway(t, c.tracingYAML("1", ""),
		upstreamRoute("/up", fast.addr, "max_body_bytes: 10")+
			upstreamRoute("/rl", fast.addr, "rate_limit: {requests_per_second: 0.01, burst: 1}")+
			upstreamRoute("/one", slow.addr, "max_concurrency: 1"))

	// 413 from the declared length, 429 on the second request, 503 while /one is busy.
	rr := rawRequest(t, gw.addr, "POST /up/x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n")
	want := []struct {
		status int
		reason string
		id     string
	}{{413, "body_too_large", rr.Header.Get("X-Request-Id")}}
	conn := dialRaw(t, gw.addr)
	getOn(t, conn, "/rl/x", "")
	rr = getOn(t, conn, "/rl/x", "")
	want = append(want, struct {
		status int
		reason string
		id     string
	}{rr.StatusCode, "rate_limited", rr.Header.Get("X-Request-Id")})
	done := make(chan error, 1)
	go func() {
		s, _, _, err := getStatus(gw.addr, "/one/a")
		if err == nil && s != 200 {
			err = fmt.Errorf("status %d", s)
		}
		done <- err
	}()
	if !testnet.WaitUntil(5*time.Second, func() bool { return slow.inflight.Load() == 1 }) {
		t.Fatal("the first /one request never reached its upstream")
	}
	rr = rawRequest(t, gw.addr, "GET /one/b HTTP/1.1\r\nHost: a\r\n\r\n")
	want = append(want, struct {
		status int
		reason string
		id     string
	}{rr.StatusCode, "concurrency", rr.Header.Get("X-Request-Id")})
	releaseOnce.Do(func() { close(release) })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want[1].status != 429 || want[2].status != 503 {
		t.Fatalf("statuses %d, %d: want 429 and 503", want[1].status, want[2].status)
	}
	for _, w := range want {
		var span *tracepb.Span
		if !testnet.WaitUntil(10*time.Second, func() bool {
			for _, s := range c.Spans() {
				if a := spanAttrs(s); s.Kind == tracepb.Span_SPAN_KIND_SERVER && a["toron.reject_reason"] == w.reason {
					span = s
					return true
				}
			}
			return false
		}) {
			t.Errorf("no server span with toron.reject_reason %s", w.reason)
			continue
		}
		a := spanAttrs(span)
		if span.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || a["http.response.status_code"] != fmt.Sprint(w.status) || a["error.type"] != w.reason {
			t.Errorf("%s: status %v, attributes %v; want an error span with status code %d", w.reason, span.Status, a, w.status)
		}
	}
}

// TestTraceIncomingTrust: a continued trace keeps its id, sampled flag and tracestate; with
// trusted_proxies set and the peer outside it, or trust_incoming false, the incoming
// traceparent is ignored and a new trace starts. Toron's traceparent always replaces the
// client's, sampled or not.
func TestTraceIncomingTrust(t *testing.T) {
	c := startCollector(t)
	for _, tc := range []struct {
		name, server string
		continued    bool
	}{
		{"trusted by default", "", true},
		{"peer in trusted_proxies", "trusted_proxies: [127.0.0.1/32]", true},
		{"peer not in trusted_proxies", "trusted_proxies: [10.0.0.0/8]", false},
		{"trust_incoming false", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := ""
			if tc.name == "trust_incoming false" {
				extra = "trust_incoming: false"
			}
			tu := startTraceUpstream(t)
			gw := startGateway(t, c.tracingYAML("0", extra)+tc.server, upstreamRoute("/api", tu.addr, ""))
			conn := dialRaw(t, gw.addr)
			rr := getOn(t, conn, "/api/x", "traceparent: 00-"+inTrace+"-"+inParent+"-01\r\ntracestate: congo=t61rcWkgMzE\r\n")
			if rr.StatusCode != 200 {
				t.Fatalf("status %d", rr.StatusCode)
			}
			tp, ts := tu.last()
			id := traceOf(t, tp)
			if (id == inTrace) != tc.continued {
				t.Fatalf("upstream traceparent %s: continued=%v, want %v", tp, id == inTrace, tc.continued)
			}
			if tp[36:52] == inParent {
				t.Errorf("upstream traceparent %s names the client's span, not Toron's", tp)
			}
			if tc.continued {
				if ts != "congo=t61rcWkgMzE" || tp[53:] != "01" {
					t.Errorf("continued: tracestate %q, flags %s; want the client's, sampled", ts, tp[53:])
				}
				server, _ := c.trace(t, inTrace, 1)
				if hex.EncodeToString(server.ParentSpanId) != inParent {
					t.Errorf("server span parent %x, want the client's %s", server.ParentSpanId, inParent)
				}
			} else if ts != "" || tp[53:] != "00" {
				// A new trace at ratio 0: not sampled, and no tracestate of a trace it is not in.
				t.Errorf("new trace: tracestate %q, flags %s; want none and 00", ts, tp[53:])
			}
		})
	}
}

// TestTracingOffForwardsHeaders: without server.tracing the client's trace headers go upstream
// untouched and nothing is added.
func TestTracingOffForwardsHeaders(t *testing.T) {
	tu := startTraceUpstream(t)
	gw := startGateway(t, "", upstreamRoute("/api", tu.addr, ""))
	conn := dialRaw(t, gw.addr)
	in := "00-" + inTrace + "-" + inParent + "-01"
	getOn(t, conn, "/api/x", "traceparent: "+in+"\r\n")
	if tp, _ := tu.last(); tp != in {
		t.Errorf("upstream traceparent %q, want the client's %q", tp, in)
	}
	getOn(t, conn, "/api/x", "")
	if tp, _ := tu.last(); tp != "" {
		t.Errorf("upstream traceparent %q with tracing off", tp)
	}
	if got := metricLine(gw.g, "toron_tracing_spans_dropped_total"); got != "0" {
		t.Errorf("toron_tracing_spans_dropped_total = %q, want 0 with tracing off", got)
	}
}

// TestTraceCollectorDown: with the collector gone, requests are answered as before and their
// spans are counted as dropped.
func TestTraceCollectorDown(t *testing.T) {
	tu := startTraceUpstream(t)
	gw := startGateway(t, "tracing: {endpoint: \"http://"+refusedAddr(t)+"/v1/traces\", sample_ratio: 1}", upstreamRoute("/api", tu.addr, ""))
	for i := range 5 {
		if s, _, _, err := getStatus(gw.addr, "/api/x"); err != nil || s != 200 {
			t.Fatalf("request %d: %d %v", i, s, err)
		}
	}
	if !testnet.WaitUntil(10*time.Second, func() bool { return metricLine(gw.g, "toron_tracing_spans_dropped_total") == "10" }) {
		t.Errorf("toron_tracing_spans_dropped_total = %q, want 10 (a server and a client span per request)", metricLine(gw.g, "toron_tracing_spans_dropped_total"))
	}
}

// TestTraceTunnelUpTo101: a WebSocket tunnel's server span ends with its 101 while the tunnel
// stays open, and the handshake went upstream with Toron's traceparent.
func TestTraceTunnelUpTo101(t *testing.T) {
	c := startCollector(t)
	up := startWSUpstream(t, nil)
	gw := startGateway(t, c.tracingYAML("1", ""), wsRoute(up.addr, ""))
	conn, _, resp := openTunnel(t, gw.addr, upgradeRequest("/ws"))
	if resp.StatusCode != 101 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var head string
	select {
	case head = <-up.heads:
	case <-time.After(10 * time.Second):
		t.Fatal("the handshake never reached the upstream")
	}
	tp := headerOf(head, "Traceparent")
	server, clients := c.trace(t, traceOf(t, tp), 1) // exported while the tunnel is open
	if a := spanAttrs(server); a["http.response.status_code"] != "101" || server.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("tunnel server span: attributes %v, status %v", a, server.Status)
	}
	if want := hex.EncodeToString(clients[0].SpanId); tp[36:52] != want {
		t.Errorf("handshake traceparent %s, want parent %s (the handshake's client span)", tp, want)
	}
	_ = conn.Close()
}

// TestTraceCollectorHangsLatencyUnchanged: a collector that accepts and never answers holds
// only the export goroutine. Requests alternate between a gateway exporting every request's
// spans to it and one with tracing off (paired, so both see the same machine): the medians stay
// alike and no request waits for an export (whose timeout is 5 s).
func TestTraceCollectorHangsLatencyUnchanged(t *testing.T) {
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	t.Cleanup(hang.Close)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	tu := startTraceUpstream(t)
	traced := startGateway(t, "tracing: {endpoint: \""+hang.URL+"/v1/traces\", sample_ratio: 1}", upstreamRoute("/api", tu.addr, ""))
	plain := startGateway(t, "", upstreamRoute("/api", tu.addr, ""))
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the gateways' flush
	const n = 60
	var on, off []time.Duration
	for i := range 2 * n {
		addr := plain.addr
		if i%2 == 0 {
			addr = traced.addr
		}
		start := time.Now()
		if s, _, _, err := getStatus(addr, "/api/x"); err != nil || s != 200 {
			t.Fatalf("request %d: %d %v", i, s, err)
		}
		if i%2 == 0 {
			on = append(on, time.Since(start))
		} else {
			off = append(off, time.Since(start))
		}
	}
	slices.Sort(on)
	slices.Sort(off)
	t.Logf("median %v traced to a hanging collector, %v untraced; slowest %v, %v", on[n/2], off[n/2], on[n-1], off[n-1])
	if on[n/2] > 3*off[n/2]+20*time.Millisecond {
		t.Errorf("median latency %v behind a hanging collector, %v without tracing", on[n/2], off[n/2])
	}
	if on[n-1] > 4*time.Second {
		t.Errorf("a request took %v: it waited for an export", on[n-1])
	}
}
