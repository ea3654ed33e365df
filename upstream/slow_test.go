package upstream

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// serveShare runs workers concurrent clients against a Set for d, each attempt holding its
// target for the target's service time, and returns each target's share of the attempts. It
// is the balancer's half of the slow-target benchmark: the gateway's half (real
// upstreams, p99) needs the request path wired.
func serveShare(t *testing.T, b Balance, service []time.Duration, workers int, d time.Duration) []float64 {
	t.Helper()
	cfg := Config{Route: "r", Balance: b}
	for i := range service {
		cfg.Targets = append(cfg.Targets, TargetConfig{Addr: fmt.Sprintf("t%d:80", i)})
	}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	index := map[*Target]int{}
	for i, tg := range s.Targets() {
		index[tg] = i
	}
	counts := make([]atomic.Int64, len(service))
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				tg := s.Pick(nil)
				i := index[tg]
				time.Sleep(service[i])
				counts[i].Add(1)
				tg.Done(Success, 200)
			}
		})
	}
	wg.Wait()
	var total int64
	for i := range counts {
		total += counts[i].Load()
	}
	out := make([]float64, len(counts))
	for i := range counts {
		out[i] = float64(counts[i].Load()) / float64(total)
	}
	return out
}

func TestP2CStarvesASlowTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 2 s")
	}
	// One target 20x slower than the other two (SPEC 13 benchmark): p2c sends it under 15% of
	// the requests, round robin its third whatever it costs.
	service := []time.Duration{2 * time.Millisecond, 2 * time.Millisecond, 40 * time.Millisecond}
	p2c := serveShare(t, P2C, service, 16, time.Second)
	rr := serveShare(t, RoundRobin, service, 16, time.Second)
	t.Logf("slow target's share: p2c %.1f%%, round_robin %.1f%%", 100*p2c[2], 100*rr[2])
	if p2c[2] >= 0.15 {
		t.Errorf("p2c sent %.1f%% of the requests to the 20x slower target, want under 15%%", 100*p2c[2])
	}
	if rr[2] < 0.30 || rr[2] > 0.37 {
		t.Errorf("round_robin sent %.1f%% to the slow target, want its third", 100*rr[2])
	}
}
