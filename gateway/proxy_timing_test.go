package gateway

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// startFastUpstream serves a tiny JSON answer with fasthttp: the upstream of the small-request
// benchmarks, so that the gateway's own cost is what differs between direct and proxied.
func startFastUpstream(tb testing.TB) string {
	tb.Helper()
	body := []byte(`{"service":"api","ok":true}`)
	return serveFast(tb, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	}})
}

// serveFast serves srv on a loopback port until the test ends and returns its address.
func serveFast(tb testing.TB, srv *fasthttp.Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// benchmarkSmallGET sends GET /api/users, with the header pairs (name, value, ...), on one
// keep-alive connection per iteration and expects wantStatus.
func benchmarkSmallGET(b *testing.B, addr string, wantStatus int, headers ...string) {
	benchmarkGET(b, &fasthttp.HostClient{Addr: addr, MaxConns: 1}, wantStatus, headers...)
}

// benchmarkGET sends GET /api/users through hc (over TLS when hc.IsTLS), with the header pairs
// (name, value, ...), once per iteration and expects wantStatus.
func benchmarkGET(b *testing.B, hc *fasthttp.HostClient, wantStatus int, headers ...string) {
	defer hc.CloseIdleConnections()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	// The client keeps its body buffer: fasthttp's pool of them allocates anew for a while
	// after another benchmark's answers recalibrated it, which allocs/op would count.
	resp.KeepBodyBuffer = true
	scheme := "http://"
	if hc.IsTLS {
		scheme = "https://"
	}
	req.SetRequestURI(scheme + hc.Addr + "/api/users")
	for k := 0; k+1 < len(headers); k += 2 {
		req.Header.Set(headers[k], headers[k+1])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := hc.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode() != wantStatus {
			b.Fatalf("status %d", resp.StatusCode())
		}
	}
}

// startFastGatewayB is a gateway with serverYAML (access log off) in front of a new fast
// upstream, on one route: prefix, with the route keys extra.
func startFastGatewayB(b *testing.B, serverYAML, prefix, extra string) *testGateway {
	return startGatewayB(b, serverYAML, upstreamRoute(prefix, startFastUpstream(b), extra), false)
}

// BenchmarkDirectSmallGET is the baseline: the same request straight to the upstream.
func BenchmarkDirectSmallGET(b *testing.B) {
	benchmarkSmallGET(b, startFastUpstream(b), 200)
}

// BenchmarkProxySmallGET is a small GET through the gateway (access log off).
func BenchmarkProxySmallGET(b *testing.B) {
	gw := startFastGatewayB(b, "", "/api", "")
	benchmarkSmallGET(b, gw.addr, 200)
}

// BenchmarkProxySmallGETAccessLog is the same with the JSON access log on, as the binary
// writes it (startGatewayB: through its LogSink, into a file).
func BenchmarkProxySmallGETAccessLog(b *testing.B) {
	up := startFastUpstream(b)
	gw := startGatewayB(b, "", upstreamRoute("/api", up, ""), true)
	benchmarkSmallGET(b, gw.addr, 200)
}

// benchmarkRaw sends one fixed request per iteration on a fresh connection (rejections close
// the connection) and reads the answer.
func benchmarkRaw(b *testing.B, addr, req string, wantStatus int) {
	buf := make([]byte, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write([]byte(req)); err != nil {
			b.Fatal(err)
		}
		n, err := c.Read(buf)
		if err != nil || n < 12 || string(buf[9:12]) != strconv.Itoa(wantStatus) {
			b.Fatalf("answer %q %v", buf[:n], err)
		}
		c.Close()
	}
}

// BenchmarkRejectOversized is the Tier-1 413 of a headers-only client declaring 1 GiB.
func BenchmarkRejectOversized(b *testing.B) {
	gw := startFastGatewayB(b, "", "/api", "")
	benchmarkRaw(b, gw.addr, "POST /api/up HTTP/1.1\r\nHost: a\r\nContent-Length: 1073741824\r\n\r\n", 413)
}

// BenchmarkBulkheadReject is the bulkhead 503 of a full route (max_concurrency 1, held).
func BenchmarkBulkheadReject(b *testing.B) {
	gw := startFastGatewayB(b, "", "/legacy", "max_concurrency: 1")
	gw.g.stats.get("/legacy").bulkhead.TryAcquire() // hold the only slot
	defer gw.g.stats.get("/legacy").bulkhead.Release()
	benchmarkRaw(b, gw.addr, "GET /legacy/r HTTP/1.1\r\nHost: a\r\n\r\n", 503)
}

// BenchmarkProxySmallGETNewConn is a proxied small GET on a fresh connection: the same
// connection cost as the rejection benchmarks, for their ratio.
func BenchmarkProxySmallGETNewConn(b *testing.B) {
	gw := startFastGatewayB(b, "", "/api", "")
	benchmarkRaw(b, gw.addr, "GET /api/users HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 200)
}

// BenchmarkBulkheadRejectKeepAlive is the bulkhead 503 on a keep-alive connection: the
// rejection's own cost, to set beside BenchmarkProxySmallGET.
func BenchmarkBulkheadRejectKeepAlive(b *testing.B) {
	gw := startFastGatewayB(b, "", "/api", "max_concurrency: 1")
	bh := gw.g.stats.get("/api").bulkhead
	bh.TryAcquire() // hold the only slot
	defer bh.Release()
	benchmarkSmallGET(b, gw.addr, 503)
}

// BenchmarkAccessLogPaired compares the CPU of a small GET through a gateway with the access
// log on (the binary's JSON lines through its sink, into a file) with the same gateway with it
// off, in paired rounds (measureCPUPaired): cpu-ratio is the median over rounds of on over off,
// base-cpu-ns/req the log-off request's. The process holds client and upstream too, so the
// ratio is of whole requests: the log's own CPU per request, (cpu-ratio-1) x base-cpu-ns/req,
// set against the gateway's share of base-cpu-ns/req is issue 32's figure (at most 5%).
func BenchmarkAccessLogPaired(b *testing.B) {
	up := startFastUpstream(b)
	off := startGatewayB(b, "", upstreamRoute("/api", up, ""), false)
	on := startGatewayB(b, "", upstreamRoute("/api", up, ""), true)
	measureCPUPaired(b, []func() time.Duration{pairedClient(b, off.addr, "", nil), pairedClient(b, on.addr, "", nil)})
}

// BenchmarkBulkheadRejectPaired compares the CPU of the bulkhead 503 on a keep-alive connection
// (BenchmarkBulkheadRejectKeepAlive) with a proxied small GET, in paired rounds
// (measureCPUPaired): base-cpu-ns/req is the proxied GET's process CPU per request, cpu-ratio
// the 503's over the GET's; with the access log off and on (the default). Both include the
// client's CPU, the GET its upstream's too.
func BenchmarkBulkheadRejectPaired(b *testing.B) {
	for _, v := range []struct {
		name string
		log  bool
	}{{"log-off", false}, {"log-on", true}} {
		b.Run(v.name, func(b *testing.B) {
			up := startFastUpstream(b)
			get := startGatewayB(b, "", upstreamRoute("/api", up, ""), v.log)
			full := startGatewayB(b, "", upstreamRoute("/api", up, "max_concurrency: 1"), v.log)
			bh := full.g.stats.get("/api").bulkhead
			bh.TryAcquire() // hold the only slot
			defer bh.Release()
			send := []func() time.Duration{
				timedGET(b, &fasthttp.HostClient{Addr: get.addr, MaxConns: 1}),
				timedGETStatus(b, &fasthttp.HostClient{Addr: full.addr, MaxConns: 1}, 503),
			}
			measureCPUPaired(b, send)
		})
	}
}
