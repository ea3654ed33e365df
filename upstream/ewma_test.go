package upstream

import (
	"math"
	"testing"
	"time"
)

// ewmaSet builds a p2c Set over targets t0..tN-1:80 with the given weights on a fake clock.
func ewmaSet(t *testing.T, clock *fakeClock, decay time.Duration, weights ...int) *Set {
	t.Helper()
	cfg := Config{Route: "r", Balance: P2C, Clock: clock.Now, LatencyDecay: decay}
	for i, w := range weights {
		cfg.Targets = append(cfg.Targets, TargetConfig{Addr: "t" + string(rune('0'+i)) + ":80", Weight: w})
	}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// costOf is the cost a pick sees now.
func costOf(tg *Target) float64 { return tg.cost(tg.set.now()) }

// TestPeakEWMATowerVectors replays the compound-decay test of Tower's peak_ewma (decay 1 s):
// two requests of 200 ms each, 100 ms apart.
func TestPeakEWMATowerVectors(t *testing.T) {
	clock := newFakeClock()
	s := ewmaSet(t, clock, time.Second, 1)
	tg := s.Targets()[0]
	if c := costOf(tg); c != 0 {
		t.Fatalf("a target with no sample and nothing in flight costs %v, want 0", c)
	}
	clock.Advance(100 * time.Millisecond)
	r0 := s.Pick(nil)
	if c := costOf(tg); c != noSampleCost+1 {
		t.Fatalf("no sample, one in flight: cost %v, want 1e9+1", c)
	}
	clock.Advance(100 * time.Millisecond)
	r1 := s.Pick(nil)
	if c := costOf(tg); c != noSampleCost+2 {
		t.Fatalf("no sample, two in flight: cost %v, want 1e9+2", c)
	}
	clock.Advance(100 * time.Millisecond)
	r0.Observe(200*time.Millisecond, Success)
	r0.Done(Success, 200)
	if c := costOf(tg); math.Abs(c-0.4) > 1e-9 {
		t.Fatalf("after the first 200 ms answer, one pending: cost %v s, want 0.4", c)
	}
	clock.Advance(100 * time.Millisecond)
	r1.Observe(200*time.Millisecond, Success)
	r1.Done(Success, 200)
	if c := costOf(tg); math.Abs(c-0.2) > 1e-9 {
		t.Fatalf("after the second 200 ms answer: cost %v s, want 0.2", c)
	}
	clock.Advance(time.Second)
	if c := costOf(tg); c >= 0.1 {
		t.Fatalf("1 s idle: cost %v s, want below 0.1", c)
	}
	clock.Advance(10 * time.Second)
	if c := costOf(tg); c >= 0.0001 {
		t.Fatalf("10 s more idle: cost %v s, want below 0.1 ms", c)
	}
}

func TestPeakEWMAPeakAndDecay(t *testing.T) {
	clock := newFakeClock()
	s := ewmaSet(t, clock, 10*time.Second, 1)
	tg := s.Targets()[0]
	tg.Observe(10*time.Millisecond, Success)
	// A slower sample is taken at once (the peak).
	clock.Advance(time.Millisecond)
	tg.Observe(300*time.Millisecond, Success)
	if d, _ := tg.Latency(); d != 300*time.Millisecond {
		t.Fatalf("a slower sample must set the estimate at once: %v", d)
	}
	// A faster one moves it by 1-exp(-dt/decay): 10 s later, 1-1/e of the way.
	clock.Advance(10 * time.Second)
	tg.Observe(100*time.Millisecond, Success)
	want := 0.3*math.Exp(-1) + 0.1*(1-math.Exp(-1))
	if d, _ := tg.Latency(); math.Abs(d.Seconds()-want) > 1e-6 {
		t.Fatalf("estimate %v, want %.6fs", d, want)
	}
	// Failures count as at least one second; Neutral records nothing.
	tg.Observe(time.Millisecond, Failure)
	if d, _ := tg.Latency(); d != FailureSample {
		t.Fatalf("a fast failure must be sampled as 1 s: %v", d)
	}
	tg.Observe(0, Neutral)
	if d, _ := tg.Latency(); d != FailureSample {
		t.Fatalf("a neutral outcome changed the estimate: %v", d)
	}
}

func TestP2CAvoidsTheSlowTarget(t *testing.T) {
	clock := newFakeClock()
	s := ewmaSet(t, clock, 10*time.Second, 1, 1, 1)
	fast := s.Targets()[:2]
	slow := s.Targets()[2]
	for _, tg := range fast {
		tg.Observe(5*time.Millisecond, Success)
	}
	slow.Observe(100*time.Millisecond, Success)
	got := map[*Target]int{}
	for range 3000 {
		tg := s.Pick(nil)
		got[tg]++
		lat := 5 * time.Millisecond
		if tg == slow {
			lat = 100 * time.Millisecond
		}
		clock.Advance(time.Millisecond)
		tg.Observe(lat, Success)
		tg.Done(Success, 200)
	}
	// The slow target is drawn in 2/3 of the pairs but loses all of them but for its decay:
	// sequential traffic leaves it a few probes at most.
	if got[slow] > 30 {
		t.Fatalf("p2c sent %d of 3000 requests to a 20x slower target", got[slow])
	}
	for _, tg := range fast {
		if got[tg] < 1000 {
			t.Fatalf("the fast targets should share the traffic: %v", got)
		}
	}
}

func TestP2COneProbeForANewTarget(t *testing.T) {
	clock := newFakeClock()
	s := ewmaSet(t, clock, 10*time.Second, 1, 1)
	old, fresh := s.Targets()[0], s.Targets()[1]
	old.Observe(50*time.Millisecond, Success)
	var held []*Target
	for range 50 {
		held = append(held, s.Pick(nil)) // none answers: the fresh target must get only one
	}
	if n := fresh.InFlight(); n != 1 {
		t.Fatalf("the target with no sample has %d requests in flight before its first answer, want 1", n)
	}
	for _, tg := range held {
		tg.Done(Neutral, 499)
	}
}

func TestP2CCostDividesByWeight(t *testing.T) {
	clock := newFakeClock()
	s := ewmaSet(t, clock, 10*time.Second, 1, 4)
	a, b := s.Targets()[0], s.Targets()[1]
	a.Observe(100*time.Millisecond, Success)
	b.Observe(300*time.Millisecond, Success)
	// a: 0.1/1, b: 0.3/4: b is cheaper and wins every pick.
	if ca, cb := costOf(a), costOf(b); math.Abs(ca-0.1) > 1e-9 || math.Abs(cb-0.075) > 1e-9 {
		t.Fatalf("costs %v and %v, want 0.1 and 0.075", ca, cb)
	}
	for range 100 {
		if tg := pickDone(s, nil); tg != b {
			t.Fatal("p2c picked the costlier target")
		}
	}
}

func TestP2CExactTieIsRandom(t *testing.T) {
	clock := newFakeClock()
	s := ewmaSet(t, clock, 10*time.Second, 1, 1)
	for _, tg := range s.Targets() {
		tg.Observe(10*time.Millisecond, Success)
	}
	got := map[string]int{}
	for range 2000 {
		got[pickDone(s, nil).Addr()]++ // same estimate, same clock: every pick is a tie
	}
	if got["t0:80"] < 800 || got["t1:80"] < 800 {
		t.Fatalf("exact ties must go either way at random: %v", got)
	}
}

func TestReloadKeepsLatencyEstimate(t *testing.T) {
	clock := newFakeClock()
	cfg := Config{Route: "r", Clock: clock.Now, Targets: []TargetConfig{{Addr: "a:80"}, {Addr: "b:80"}}}
	old, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	old.Targets()[0].Observe(250*time.Millisecond, Success)
	cfg.LatencyDecay = time.Minute
	next, err := NewSet(cfg, old)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if d, ok := next.Targets()[0].Latency(); !ok || d != 250*time.Millisecond {
		t.Fatalf("the estimate of a target that stayed is %v (%v), want 250ms", d, ok)
	}
	if _, ok := next.Targets()[1].Latency(); ok {
		t.Fatal("a target without samples has one after the reload")
	}
	if next.decay != float64(time.Minute) {
		t.Fatal("the new latency_decay was not applied")
	}
}
