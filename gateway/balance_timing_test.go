package gateway

import (
	"runtime"
	"slices"
	"testing"
	"time"
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

// measureCPUPaired compares the CPU per request of send[1] against send[0] in paired rounds:
// each round sends cpuRound requests with one, then as many with the other (the order
// alternates), and measures the process's CPU time (user + system) of each half, so that both
// see the same machine load. It reports cpu-ratio, the median over rounds of send[1]'s CPU over
// send[0]'s; base-cpu-ns/req, the median of send[0]'s CPU per request; the rounds; and
// extra-allocs/req, the process's heap allocations per request in send[1]'s halves beyond
// send[0]'s (background goroutines count in whichever half they run). b.N counts the requests of each side. Both are warmed first (connections,
// pools, estimates).
func measureCPUPaired(b *testing.B, send []func() time.Duration) {
	for _, s := range send {
		for range cpuRound {
			s()
		}
	}
	var ratios, base []float64
	var allocs [2]uint64
	var ms runtime.MemStats
	b.ReportAllocs()
	b.ResetTimer()
	for done, round := 0, 0; done < b.N; round++ {
		var cpu [2]int64
		for k := range 2 {
			side := (k + round) & 1
			runtime.ReadMemStats(&ms)
			m0 := ms.Mallocs
			start := processCPU()
			for range cpuRound {
				send[side]()
			}
			cpu[side] = processCPU() - start
			runtime.ReadMemStats(&ms)
			allocs[side] += ms.Mallocs - m0
		}
		done += cpuRound
		if cpu[0] > 0 {
			ratios = append(ratios, float64(cpu[1])/float64(cpu[0]))
			base = append(base, float64(cpu[0])/cpuRound)
		}
	}
	b.StopTimer()
	if len(ratios) > 0 {
		slices.Sort(ratios)
		slices.Sort(base)
		b.ReportMetric(ratios[len(ratios)/2], "cpu-ratio")
		b.ReportMetric(base[len(base)/2], "base-cpu-ns/req")
		b.ReportMetric(float64(len(ratios)), "rounds")
		b.ReportMetric((float64(allocs[1])-float64(allocs[0]))/float64(len(ratios)*cpuRound), "extra-allocs/req")
	}
}
