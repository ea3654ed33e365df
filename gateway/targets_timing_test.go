package gateway

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkTargetsPaired compares a small GET through a route of three targets (p2c, and each
// of the other balancers) with the same GET through a route of one target, request by request
// on the same machine load (as BenchmarkClientIdentityPaired): ratio-median is the three-target
// route's median latency over the one-target route's (issue 16: within 5%).
func BenchmarkTargetsPaired(b *testing.B) {
	for _, balance := range []string{"p2c", "round_robin", "client_ip_hash"} {
		b.Run(balance, func(b *testing.B) {
			ups := []string{startFastUpstream(b), startFastUpstream(b), startFastUpstream(b)}
			one := startGatewayB(b, "", targetsRoute("/api", ups[:1], "balance: "+balance), false)
			three := startGatewayB(b, "", targetsRoute("/api", ups, "balance: "+balance), false)
			send := []func() time.Duration{pairedClient(b, one.addr, "", nil), pairedClient(b, three.addr, "", nil)}
			lat := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				first := i & 1
				lat[first] = append(lat[first], send[first]())
				lat[1-first] = append(lat[1-first], send[1-first]())
			}
			b.StopTimer()
			for j := range lat {
				slices.Sort(lat[j])
			}
			b.ReportMetric(float64(lat[1][len(lat[1])/2])/float64(lat[0][len(lat[0])/2]), "ratio-median")
		})
	}
}
