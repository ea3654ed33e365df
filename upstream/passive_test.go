package upstream

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// fakeClock is a settable time source for passive health.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// passiveSet builds a Set of n targets with SPEC 13's default passive health on a fake clock.
func passiveSet(t *testing.T, n int, clock *fakeClock, events *[]Event) *Set {
	t.Helper()
	cfg := Config{
		Route:   "r",
		Passive: PassiveConfig{ConsecutiveFailures: 5, EjectTime: 30 * time.Second, MaxEjectTime: 300 * time.Second, MaxEjectedPercent: 50},
		Clock:   clock.Now,
		Metrics: metrics.NewSet(),
	}
	if events != nil {
		var mu sync.Mutex
		cfg.OnEvent = func(e Event) { mu.Lock(); *events = append(*events, e); mu.Unlock() }
	}
	for i := range n {
		cfg.Targets = append(cfg.Targets, TargetConfig{Addr: fmt.Sprintf("t%d:80", i)})
	}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// attempt runs one attempt on exactly target tg (as if the balancer had chosen it).
func attempt(tg *Target, o Outcome, code int) {
	tg.st.inflight.Add(1)
	tg.Done(o, code)
}

func TestEjectionAfterConsecutiveFailuresAndReturn(t *testing.T) {
	clock := newFakeClock()
	var events []Event
	s := passiveSet(t, 3, clock, &events)
	bad := s.Targets()[0]
	for i := range 4 {
		attempt(bad, Failure, 503)
		if bad.Ejected() {
			t.Fatalf("ejected after %d failures, want 5", i+1)
		}
	}
	attempt(bad, Failure, 503)
	if !bad.Ejected() || bad.Eligible() {
		t.Fatal("not ejected after 5 failures in a row")
	}
	for range 300 {
		if pickDone(s, nil) == bad {
			t.Fatal("an ejected target was picked")
		}
	}
	clock.Advance(29 * time.Second)
	if !bad.Ejected() {
		t.Fatal("ejection ended before eject_time")
	}
	clock.Advance(time.Second)
	if bad.Ejected() || !bad.Eligible() {
		t.Fatal("still ejected after eject_time")
	}
	if len(events) != 1 || events[0].Kind != EventEjected || events[0].Target != "t0:80" || events[0].For != 30*time.Second {
		t.Fatalf("events %+v, want one ejection of t0:80 for 30s", events)
	}
	if got := bad.st.ejections.Get(); got != 1 {
		t.Fatalf("toron_upstream_ejections_total = %d, want 1", got)
	}
}

func TestSuccessResetsTheCount(t *testing.T) {
	clock := newFakeClock()
	s := passiveSet(t, 3, clock, nil)
	tg := s.Targets()[1]
	for range 10 {
		for range 4 {
			attempt(tg, Failure, 502)
		}
		attempt(tg, Success, 404) // any status but 502-504 is a success
	}
	if tg.Ejected() {
		t.Fatal("ejected though no 5 failures were in a row")
	}
	// A client that left is nobody's failure and resets nothing.
	for range 4 {
		attempt(tg, Failure, 504)
	}
	attempt(tg, Neutral, 499)
	attempt(tg, Failure, 502)
	if !tg.Ejected() {
		t.Fatal("4 failures, a client abort and a failure must eject")
	}
}

func TestEjectionDoublesUpToTheCapAndSuccessResets(t *testing.T) {
	clock := newFakeClock()
	s := passiveSet(t, 2, clock, nil)
	tg := s.Targets()[0]
	for range 5 {
		attempt(tg, Failure, 503)
	}
	want := []time.Duration{30, 60, 120, 240, 300, 300}
	for i, w := range want {
		w *= time.Second
		clock.Advance(w - time.Nanosecond)
		if !tg.Ejected() {
			t.Fatalf("ejection %d ended before %s", i+1, w)
		}
		clock.Advance(time.Nanosecond)
		if tg.Ejected() {
			t.Fatalf("ejection %d lasted longer than %s", i+1, w)
		}
		// The first failure after an ejection ejects again, for twice as long.
		attempt(tg, Failure, 503)
		if !tg.Ejected() {
			t.Fatalf("the first failure after ejection %d did not eject again", i+1)
		}
	}
	// A success resets the doubling: the next ejection takes 5 failures and lasts 30s.
	clock.Advance(300 * time.Second)
	attempt(tg, Success, 200)
	for range 4 {
		attempt(tg, Failure, 503)
	}
	if tg.Ejected() {
		t.Fatal("after a success, 4 failures ejected")
	}
	attempt(tg, Failure, 503)
	clock.Advance(30 * time.Second)
	if tg.Ejected() {
		t.Fatal("after a success, the ejection time did not go back to 30s")
	}
}

func TestMaxEjectedPercentAndNeverAll(t *testing.T) {
	for _, c := range []struct {
		targets, percent, max int
	}{
		{1, 50, 0}, {2, 50, 1}, {3, 50, 1}, {4, 50, 2}, {5, 50, 2}, {3, 100, 2}, {4, 0, 0}, {10, 33, 3},
	} {
		t.Run(fmt.Sprintf("%d targets %d%%", c.targets, c.percent), func(t *testing.T) {
			clock := newFakeClock()
			cfg := Config{Route: "x", Passive: PassiveConfig{ConsecutiveFailures: 1, EjectTime: time.Minute, MaxEjectedPercent: c.percent}, Clock: clock.Now}
			for i := range c.targets {
				cfg.Targets = append(cfg.Targets, TargetConfig{Addr: fmt.Sprintf("h%d:1", i)})
			}
			s, err := NewSet(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for range 3 {
				for _, tg := range s.Targets() {
					attempt(tg, Failure, 502)
				}
			}
			ejected := 0
			for _, tg := range s.Targets() {
				if tg.Ejected() {
					ejected++
				}
			}
			if ejected != c.max {
				t.Fatalf("%d of %d targets ejected at %d%%, want %d", ejected, c.targets, c.percent, c.max)
			}
			// Once one returns, another failing target may take its place.
			if c.max > 0 {
				clock.Advance(time.Minute)
				last := s.Targets()[c.targets-1]
				attempt(last, Failure, 502)
				if !last.Ejected() {
					t.Fatal("a failing target was not ejected once the ejected ones came back")
				}
			}
		})
	}
}

func TestConcurrentFailuresRespectMaxEjected(t *testing.T) {
	clock := newFakeClock()
	s := passiveSet(t, 4, clock, nil)
	var wg sync.WaitGroup
	for _, tg := range s.Targets() {
		for range 4 {
			wg.Go(func() {
				for range 50 {
					attempt(tg, Failure, 503)
				}
			})
		}
	}
	wg.Wait()
	ejected := 0
	for _, tg := range s.Targets() {
		if tg.Ejected() {
			ejected++
		}
	}
	if ejected != 2 {
		t.Fatalf("%d of 4 targets ejected at 50%%, want exactly 2", ejected)
	}
}

func TestPassiveOff(t *testing.T) {
	clock := newFakeClock()
	s, err := NewSet(Config{Route: "r", Targets: []TargetConfig{{Addr: "a:1"}, {Addr: "b:1"}}, Clock: clock.Now}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 100 {
		attempt(s.Targets()[0], Failure, 502)
	}
	if s.Targets()[0].Ejected() {
		t.Fatal("consecutive_failures 0 must turn passive health off")
	}
}

func TestPanicModeWhenEjectedAndDown(t *testing.T) {
	clock := newFakeClock()
	var events []Event
	s := passiveSet(t, 2, clock, &events)
	a, b := s.Targets()[0], s.Targets()[1]
	for range 5 {
		attempt(a, Failure, 502)
	}
	b.st.down.Store(true) // as the active checks would
	if !a.Ejected() {
		t.Fatal("a not ejected")
	}
	seen := map[*Target]int{}
	for range 200 {
		seen[pickDone(s, nil)]++
	}
	if seen[a] == 0 || seen[b] == 0 {
		t.Fatalf("panic mode must spread over every target: %v", seen)
	}
	panics := 0
	for _, e := range events {
		if e.Kind == EventPanic {
			panics++
		}
	}
	if panics != 1 {
		t.Fatalf("%d panic events for one episode, want 1", panics)
	}
}

// TestEjectionDoublingNeverOverflows: however many ejections in a row and however large the
// cap (conf bounds it at 24h; the Set must not rely on that), an ejection lasts between
// EjectTime and MaxEjectTime.
func TestEjectionDoublingNeverOverflows(t *testing.T) {
	for _, maxEject := range []time.Duration{5 * time.Minute, 24 * time.Hour, math.MaxInt64, math.MaxInt64 / 3} {
		p := PassiveConfig{EjectTime: 30 * time.Second, MaxEjectTime: maxEject}
		for inRow := 0; inRow < 100; inRow++ {
			if d := p.ejectionFor(inRow); d < p.EjectTime || d > maxEject {
				t.Fatalf("max_eject_time %d, %d in a row: ejected for %d", maxEject, inRow, d)
			}
		}
	}
}
