package gateway

import (
	"slices"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// trafficRulesRoute is SPEC 20's header rules and CORS on one route, as an operator writes them.
const trafficRulesRoute = `request_headers: {set: {X-Env: prod, X-Client: "{client_ip}"}, remove: [Cookie]}
response_headers: {set: {Strict-Transport-Security: max-age=63072000, X-Route: "{route}"}, remove: [Server]}
cors: {allow_origins: ["https://app.example.com"], allow_methods: [GET, POST], expose_headers: [X-Total]}`

// BenchmarkTrafficRulesPaired sends the small GET (with an Origin) alternately to a gateway
// without traffic rules and to one with header rules and CORS, request by request, so both see
// the same machine load, and reports the ratio of their median latencies (ratio-median; 1.00 is
// no cost) and of their summed latencies (ratio-sum). SPEC 20's target: within 3%.
func BenchmarkTrafficRulesPaired(b *testing.B) {
	up := startFastUpstream(b)
	plain := startGatewayB(b, "", upstreamRoute("/api", up, ""), false)
	feat := startGatewayB(b, "", upstreamRoute("/api", up, trafficRulesRoute), false)
	send := []func() time.Duration{originClient(b, plain.addr), originClient(b, feat.addr)}
	lat := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		first := i & 1
		lat[first] = append(lat[first], send[first]())
		lat[1-first] = append(lat[1-first], send[1-first]())
	}
	b.StopTimer()
	var sum [2]time.Duration
	for j := range lat {
		for _, d := range lat[j] {
			sum[j] += d
		}
		slices.Sort(lat[j])
	}
	b.ReportMetric(float64(lat[1][len(lat[1])/2])/float64(lat[0][len(lat[0])/2]), "ratio-median")
	b.ReportMetric(float64(sum[1])/float64(sum[0]), "ratio-sum")
}

// BenchmarkTrafficRulesSmallGET is the same small GET as sub-benchmarks (off, on), each with
// cpu-ns/op: the process's CPU per request (client, gateway and upstream are one process, so
// only the difference is the rules').
func BenchmarkTrafficRulesSmallGET(b *testing.B) {
	for _, v := range []struct{ name, route string }{{"off", ""}, {"on", trafficRulesRoute}} {
		b.Run(v.name, func(b *testing.B) {
			up := startFastUpstream(b)
			gw := startGatewayB(b, "", upstreamRoute("/api", up, v.route), false)
			send := originClient(b, gw.addr)
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				send()
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// originClient returns a function sending one small GET with an Origin on a keep-alive
// connection to addr, returning its latency.
func originClient(b *testing.B, addr string) func() time.Duration {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1}
	b.Cleanup(hc.CloseIdleConnections)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	b.Cleanup(func() { fasthttp.ReleaseRequest(req); fasthttp.ReleaseResponse(resp) })
	req.SetRequestURI("http://" + addr + "/api/users")
	req.Header.Set("Origin", "https://app.example.com")
	req.Header.Set("Cookie", "session=abc")
	return func() time.Duration {
		start := time.Now()
		if err := hc.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if resp.StatusCode() != 200 {
			b.Fatalf("status %d", resp.StatusCode())
		}
		return d
	}
}
