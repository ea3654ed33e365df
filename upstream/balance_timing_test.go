package upstream

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPick measures one Pick, its Observe and its Done per balancer over 1 and 3 targets: the cost the
// request path adds per attempt.
func BenchmarkPick(b *testing.B) {
	ip := []byte{192, 0, 2, 7}
	for _, bal := range []Balance{P2C, LeastRequest, RoundRobin, ClientIPHash} {
		for _, n := range []int{1, 3} {
			cfg := Config{Route: "r", Balance: bal}
			for i := range n {
				cfg.Targets = append(cfg.Targets, TargetConfig{Addr: fmt.Sprintf("10.0.0.%d:80", i+1)})
			}
			s, err := NewSet(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/%d", bal, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						t := s.Pick(ip)
						t.Observe(time.Millisecond, Success)
						t.Done(Success, 200)
					}
				})
			})
			s.Close()
		}
	}
}
