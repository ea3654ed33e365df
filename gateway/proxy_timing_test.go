package gateway

import (
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// startFastUpstream serves a tiny JSON answer with fasthttp: the upstream of the small-request
// benchmarks, so that the gateway's own cost is what differs between direct and proxied.
func startFastUpstream(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	body := []byte(`{"service":"api","ok":true}`)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	}}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

func benchmarkSmallGET(b *testing.B, addr string) {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1}
	defer hc.CloseIdleConnections()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/api/users")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := hc.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode() != 200 {
			b.Fatalf("status %d", resp.StatusCode())
		}
	}
}

// BenchmarkDirectSmallGET is the baseline: the same request straight to the upstream.
func BenchmarkDirectSmallGET(b *testing.B) {
	benchmarkSmallGET(b, startFastUpstream(b))
}

// BenchmarkProxySmallGET is a small GET through the gateway (access log off).
func BenchmarkProxySmallGET(b *testing.B) {
	up := startFastUpstream(b)
	gw := startGatewayB(b, "", upstreamRoute("/api", up, ""), false)
	benchmarkSmallGET(b, gw.addr)
}

// BenchmarkProxySmallGETAccessLog is the same with the JSON access log on (to a discarded sink).
func BenchmarkProxySmallGETAccessLog(b *testing.B) {
	up := startFastUpstream(b)
	gw := startGatewayB(b, "", upstreamRoute("/api", up, ""), true)
	benchmarkSmallGET(b, gw.addr)
}
