package upstream

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
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

func TestInflightBackToZeroUnderRandomOutcomes(t *testing.T) {
	// 10,000 attempts from 16 goroutines with random failures, client aborts and retries on
	// other targets, passive health ejecting and returning on a real clock: every in-flight
	// count and gauge ends at 0.
	ms := metrics.NewSet()
	cfg := Config{Route: "r", Metrics: ms, Retries: 2,
		Passive: PassiveConfig{ConsecutiveFailures: 3, EjectTime: time.Millisecond, MaxEjectTime: 5 * time.Millisecond, MaxEjectedPercent: 50}}
	for i := range 4 {
		cfg.Targets = append(cfg.Targets, TargetConfig{Addr: fmt.Sprintf("t%d:80", i), Weight: i + 1})
	}
	for _, b := range []Balance{P2C, RoundRobin, ClientIPHash} {
		cfg.Balance = b
		s, err := NewSet(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				ip := []byte{10, 0, 0, byte(w)}
				for next.Add(1) <= 10_000 {
					pickAttempts(s, ip, func(tg *Target, n int) bool {
						switch r := next.Load() % 7; {
						case r == 0:
							tg.Done(Neutral, 499)
						case r <= 2 && n <= s.Retries():
							tg.Done(Failure, 502)
							s.CountRetry()
							return true
						case r == 3:
							tg.Done(Failure, 503)
						default:
							tg.Done(Success, 200)
						}
						return false
					})
				}
			})
		}
		wg.Wait()
		for _, tg := range s.Targets() {
			if tg.InFlight() != 0 {
				t.Errorf("%s: %s has %d in flight", b, tg.Addr(), tg.InFlight())
			}
		}
		text := scrape(ms)
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "toron_upstream_inflight") && !strings.HasSuffix(line, " 0") {
				t.Errorf("%s: %s", b, line)
			}
		}
		s.Close()
	}
}
