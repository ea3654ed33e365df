package limits

import "testing"

// BenchmarkWorkerPoolAcquireRelease is the cost of one worker per request on an unsaturated
// pool, from two goroutines at once (the gateway's two cores).
func BenchmarkWorkerPoolAcquireRelease(b *testing.B) {
	p := NewWorkerPool(128)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !p.Acquire(0) {
				b.Fatal("saturated")
			}
			p.Release()
		}
	})
}
