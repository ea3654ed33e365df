package gateway

import (
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
			measurePaired(b, send)
		})
	}
}
