package gateway

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"toron/internal/testnet"
	"toron/limits"
)

// The costs of SPEC 16-17 on the hot path: the small GET of BenchmarkProxySmallGET
// (proxy_timing_test.go) on one keep-alive connection, as sub-benchmarks to run interleaved
// with -count: plain, with a rate limit that never limits, from a trusted proxy with a
// two-entry X-Forwarded-For, and with the PROXY protocol on. Besides ns/op (latency of one
// request, round trips included) each reports cpu-ns/op, the process's user+system CPU per
// request (client, gateway and upstream are one process, so only the differences between
// variants are the gateway's).
func BenchmarkClientIdentitySmallGET(b *testing.B) {
	const unlimited = "rate_limit: {requests_per_second: 1000000000}"
	proxyHeader := []byte("PROXY TCP4 203.0.113.7 10.0.0.1 56324 8080\r\n")
	for _, v := range []struct {
		name, server, route string
		xff                 string
		header              []byte
	}{
		{name: "plain"},
		{name: "ratelimit", route: unlimited},
		{name: "trustedxff", server: "trusted_proxies: [127.0.0.1, 10.0.0.0/8]\n", route: unlimited, xff: "203.0.113.7, 10.0.0.2"},
		{name: "proxyprotocol", server: "proxy_protocol: {enabled: true}\n", header: proxyHeader},
	} {
		b.Run(v.name, func(b *testing.B) {
			gw := startFastGatewayB(b, v.server, "/api", v.route)
			hc := &fasthttp.HostClient{Addr: gw.addr, MaxConns: 1}
			if v.header != nil {
				// A balancer's keep-alive connection: the header once, then requests.
				hc.Dial = dialWithHeader(v.header)
			}
			var headers []string
			if v.xff != "" {
				headers = []string{"X-Forwarded-For", v.xff}
			}
			cpu0 := processCPU()
			benchmarkGET(b, hc, 200, headers...)
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the process's user and system CPU time so far, in nanoseconds.
func processCPU() int64 { return int64(testnet.ProcessCPU()) }

// BenchmarkProxySmallGETNewConnProxyProtocol: the PROXY header's per-connection cost, beside
// BenchmarkProxySmallGETNewConn.
func BenchmarkProxySmallGETNewConnProxyProtocol(b *testing.B) {
	gw := startFastGatewayB(b, "proxy_protocol: {enabled: true}\n", "/api", "")
	benchmarkRaw(b, gw.addr, "PROXY TCP4 203.0.113.7 10.0.0.1 56324 8080\r\nGET /api/users HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 200)
}

// BenchmarkRateLimitReject is the 429 on a keep-alive connection (a client over its limit),
// beside BenchmarkBulkheadRejectKeepAlive.
func BenchmarkRateLimitReject(b *testing.B) {
	gw := startFastGatewayB(b, "", "/api", "rate_limit: {requests_per_second: 0.001}")
	// Spend the client's only token.
	gw.g.snap.Load().routes[0].rl.lim.Allow(limits.IPKey(netip.MustParseAddr("127.0.0.1")), time.Now())
	benchmarkSmallGET(b, gw.addr, 429)
}

// BenchmarkClientFromXFF is the X-Forwarded-For walk of a request from a trusted proxy: two
// lines, three entries, two trusted ranges.
func BenchmarkClientFromXFF(b *testing.B) {
	ts := trustedSet{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	peer := netip.MustParseAddr("10.0.0.1")
	lines := [][]byte{[]byte("198.51.100.4, 2001:db8:1::5"), []byte("10.0.0.9")}
	b.ReportAllocs()
	for b.Loop() {
		clientFromXFF(lines, ts, peer)
	}
}

// BenchmarkClientIdentityPaired sends the small GET alternately to a plain gateway and to one
// with the feature on, request by request, so that both see the same machine load at the same
// moment (the shared machine's load drifts more between rounds than the features cost), and
// reports the ratio of their median latencies (ratio-median; 1.00 is no cost) and of their
// summed latencies (ratio-sum).
func BenchmarkClientIdentityPaired(b *testing.B) {
	const unlimited = "rate_limit: {requests_per_second: 1000000000}"
	for _, v := range []struct {
		name, server, route, xff string
		header                   []byte
	}{
		{name: "ratelimit", route: unlimited},
		{name: "trustedxff", server: "trusted_proxies: [127.0.0.1, 10.0.0.0/8]\n", route: unlimited, xff: "203.0.113.7, 10.0.0.2"},
		{name: "proxyprotocol", server: "proxy_protocol: {enabled: true}\n", header: []byte("PROXY TCP4 203.0.113.7 10.0.0.1 56324 8080\r\n")},
	} {
		b.Run(v.name, func(b *testing.B) {
			up := startFastUpstream(b)
			plain := startGatewayB(b, "", upstreamRoute("/api", up, ""), false)
			feat := startGatewayB(b, v.server, upstreamRoute("/api", up, v.route), false)
			// Both get the same request bytes; only the gateway differs.
			send := []func() time.Duration{pairedClient(b, plain.addr, v.xff, nil), pairedClient(b, feat.addr, v.xff, v.header)}
			measurePaired(b, send)
		})
	}
}

// measurePaired sends b.N requests with each of send, alternating which goes first so that
// neither always follows the other, and reports the second's latency over the first's: the
// ratio of the medians and of the sums.
func measurePaired(b *testing.B, send []func() time.Duration) {
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

// pairedClient returns a function sending one small GET on a keep-alive connection to addr and
// returning its latency: with X-Forwarded-For xff when it is not empty, and header written
// first on each new connection (a PROXY protocol header) when it is not nil.
func pairedClient(b *testing.B, addr, xff string, header []byte) func() time.Duration {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1}
	if header != nil {
		hc.Dial = dialWithHeader(header)
	}
	if xff != "" {
		return timedGET(b, hc, "X-Forwarded-For", xff)
	}
	return timedGET(b, hc)
}

// dialWithHeader is a HostClient's Dial that writes header (a PROXY protocol header) first on
// each new connection.
func dialWithHeader(header []byte) fasthttp.DialFunc {
	return func(addr string) (net.Conn, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		if _, err := c.Write(header); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// timedGET returns a function sending GET /api/users through hc with the header pairs
// (name, value, ...) and returning its latency; it fails the benchmark on an error or a
// status other than 200.
func timedGET(b *testing.B, hc *fasthttp.HostClient, headers ...string) func() time.Duration {
	return timedGETStatus(b, hc, 200, headers...)
}

// timedGETStatus is timedGET expecting the status want.
func timedGETStatus(b *testing.B, hc *fasthttp.HostClient, want int, headers ...string) func() time.Duration {
	b.Cleanup(hc.CloseIdleConnections)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	resp.KeepBodyBuffer = true // the client's own allocations stay out of allocs/op
	b.Cleanup(func() { fasthttp.ReleaseRequest(req); fasthttp.ReleaseResponse(resp) })
	req.SetRequestURI("http://" + hc.Addr + "/api/users")
	for k := 0; k+1 < len(headers); k += 2 {
		req.Header.Set(headers[k], headers[k+1])
	}
	return func() time.Duration {
		start := time.Now()
		if err := hc.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if resp.StatusCode() != want {
			b.Fatalf("status %d, want %d", resp.StatusCode(), want)
		}
		return d
	}
}
