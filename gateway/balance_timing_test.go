package gateway

import (
	"testing"
	"time"

	"toron/internal/testnet"
)

// BenchmarkBalanceCPUPaired compares the CPU a small GET costs through a route of three
// targets with balance p2c (peak EWMA: a latency sample per request and a cost per candidate)
// against the same route with least_request, in paired rounds on the same machine load
// (measureCPUPaired). cpu-ratio is p2c's CPU over least_request's (issue 27: within 3%). The
// process holds the client and the upstreams too, the same for both halves, so the ratio is
// that of whole requests, not of the balancer alone (BenchmarkPick in package upstream).
func BenchmarkBalanceCPUPaired(b *testing.B) {
	ups := []string{startFastUpstream(b), startFastUpstream(b), startFastUpstream(b)}
	lr := startGatewayB(b, "", targetsRoute("/api", ups, "balance: least_request"), false)
	p2c := startGatewayB(b, "", targetsRoute("/api", ups, "balance: p2c"), false)
	measureCPUPaired(b, []func() time.Duration{pairedClient(b, lr.addr, "", nil), pairedClient(b, p2c.addr, "", nil)})
}

// cpuRound is how many requests one side of a paired round sends.
const cpuRound = 200

// measureCPUPaired compares the CPU per request of send[1] against send[0], both charged to
// this process, in paired rounds of cpuRound requests (testnet.PairedCPU: cpu-ratio,
// base-cpu-ns/req, cpu-ns/req, rounds, extra-allocs/req). The sends' latencies are not used.
func measureCPUPaired(b *testing.B, send []func() time.Duration) {
	var sides [2]testnet.PairedSide
	for i, s := range send[:2] {
		sides[i].Send = func() { s() }
	}
	testnet.PairedCPU(b, cpuRound, sides)
}
