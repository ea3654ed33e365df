package testnet

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

// PairedSide is one side of a paired CPU comparison: Send makes one request, CPU reads the
// clock its work is charged to (nil: this process's, ProcessCPU; or, say, a gateway
// process's threads read from /proc).
type PairedSide struct {
	Send func()
	CPU  func() time.Duration
}

// PairedCPU compares the CPU per request of sides[1] against sides[0] in paired rounds, so that
// both halves of a round see the same load of a shared machine: each round sends round requests
// with one side, then as many with the other (the order alternating), and reads each side's
// clock before and after its half. b.N counts the requests of each side; one unmeasured round of
// each warms connections, pools and estimates first.
//
// It reports cpu-ratio, the median over rounds of side 1's CPU over side 0's; base-cpu-ns/req
// and cpu-ns/req, the medians of each side's CPU per request; and rounds. When both sides are
// charged to this process it also reports extra-allocs/req, the heap allocations per request in
// side 1's halves beyond side 0's (background goroutines count in whichever half they run).
func PairedCPU(b *testing.B, round int, sides [2]PairedSide) {
	self := sides[0].CPU == nil && sides[1].CPU == nil
	var clock [2]func() time.Duration
	for i, s := range sides {
		clock[i] = s.CPU
		if clock[i] == nil {
			clock[i] = ProcessCPU
		}
		for range round {
			s.Send()
		}
	}
	var ratios []float64
	var perReq [2][]float64
	var allocs [2]uint64
	var ms runtime.MemStats
	b.ReportAllocs()
	b.ResetTimer()
	done := 0
	for r := 0; done < b.N; r++ {
		var spent [2]time.Duration
		for k := range 2 {
			side := (k + r) & 1
			if self {
				runtime.ReadMemStats(&ms)
				allocs[side] -= ms.Mallocs
			}
			start := clock[side]()
			for range round {
				sides[side].Send()
			}
			spent[side] = clock[side]() - start
			if self {
				runtime.ReadMemStats(&ms)
				allocs[side] += ms.Mallocs
			}
		}
		done += round
		if spent[0] > 0 {
			ratios = append(ratios, float64(spent[1])/float64(spent[0]))
			for side := range 2 {
				perReq[side] = append(perReq[side], float64(spent[side])/float64(round))
			}
		}
	}
	b.StopTimer()
	if len(ratios) == 0 {
		return
	}
	median := func(v []float64) float64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.ReportMetric(median(ratios), "cpu-ratio")
	b.ReportMetric(median(perReq[0]), "base-cpu-ns/req")
	b.ReportMetric(median(perReq[1]), "cpu-ns/req")
	b.ReportMetric(float64(len(ratios)), "rounds")
	if self {
		b.ReportMetric((float64(allocs[1])-float64(allocs[0]))/float64(done), "extra-allocs/req")
	}
}
