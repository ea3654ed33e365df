package upstream

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/testnet"

	"github.com/VictoriaMetrics/metrics"
)

// closer records that an attached value was closed.
type closer struct{ closed atomic.Bool }

func (c *closer) Close() error { c.closed.Store(true); return nil }

func TestReloadKeepsStateOfTargetsThatStay(t *testing.T) {
	stay, leave := newCheckTarget(t), newCheckTarget(t)
	extra := newCheckTarget(t)
	clock := newFakeClock()
	ms := metrics.NewSet()
	check := &CheckConfig{Path: "/healthz", Interval: 30 * time.Millisecond, Timeout: time.Second, HealthyThreshold: 2, UnhealthyThreshold: 2}
	passive := PassiveConfig{ConsecutiveFailures: 2, EjectTime: time.Minute, MaxEjectTime: 10 * time.Minute, MaxEjectedPercent: 50}
	cfg := Config{Route: "api", Passive: passive, Check: check, Clock: clock.Now, Metrics: ms,
		Targets: []TargetConfig{{Addr: stay.addr}, {Addr: leave.addr}, {Addr: "127.0.0.1:1", Weight: 1}}}
	// 127.0.0.1:1 refuses: its checks take it down.
	old, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	refused := old.Targets()[2]
	testnet.Eventually(t, "the refusing target goes down", refused.Down)
	// Passive: stay ejected after two failures, once (the next ejection would last 2m).
	st := old.Targets()[0]
	attempt(st, Failure, 502)
	attempt(st, Failure, 502)
	if !st.Ejected() {
		t.Fatal("not ejected")
	}
	held := st // a request in flight on stay across the reload, picked before its ejection
	held.st.inflight.Add(1)
	var pool closer
	old.Targets()[1].Attach(&pool)
	oldChecker := st.st.checker

	// Reload: leave goes, extra comes, weights change, the others stay.
	cfg.Targets = []TargetConfig{{Addr: extra.addr}, {Addr: "127.0.0.1:1", Weight: 3}, {Addr: stay.addr, Weight: 5}}
	next, err := NewSet(cfg, old)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	nStay, nRefused := next.Targets()[2], next.Targets()[1]
	if !nStay.Ejected() || nStay.st != st.st || nStay.st.checker != oldChecker || nStay.Weight() != 5 {
		t.Fatal("the target that stayed lost its ejection, state or checker")
	}
	if !nRefused.Down() {
		t.Fatal("the down target came back up on reload")
	}
	if !pool.closed.Load() {
		t.Fatal("the attached pool of the target that left was not closed")
	}
	if got := nStay.InFlight(); got != 1 {
		t.Fatalf("in-flight across reload %d, want 1", got)
	}
	held.Done(Neutral, 499) // ends on the Set it started on; a success would reset the doubling
	for _, tg := range next.Targets() {
		if tg.InFlight() != 0 {
			t.Fatalf("%s has %d in flight after the held request ended", tg.Addr(), tg.InFlight())
		}
	}
	// The doubling carried over: after the minute, one failure ejects for two minutes.
	clock.Advance(time.Minute)
	attempt(nStay, Failure, 502)
	clock.Advance(time.Minute + time.Second)
	if !nStay.Ejected() {
		t.Fatal("the ejection doubling was reset by the reload")
	}

	// The target that left: no checker, no metrics; the one that came is checked.
	before := leave.checks.Load()
	time.Sleep(200 * time.Millisecond)
	if leave.checks.Load() > before+1 {
		t.Fatal("the checker of the target that left still runs")
	}
	testnet.Eventually(t, "the new target is checked", func() bool { return extra.checks.Load() > 0 })
	text := scrape(ms)
	if strings.Contains(text, leave.addr) {
		t.Fatalf("metrics of the target that left remain:\n%s", text)
	}
	for _, a := range []string{extra.addr, stay.addr} {
		if !strings.Contains(text, `toron_upstream_healthy{route="api",target="`+a+`"}`) {
			t.Fatalf("no healthy gauge for %s:\n%s", a, text)
		}
	}
	old.Close() // handed over: a no-op
	if nStay.st.checker == nil {
		t.Fatal("closing the old Set stopped a checker the new one owns")
	}
}

func TestReloadTurnsChecksOffAndOn(t *testing.T) {
	ct := newCheckTarget(t)
	ct.status.Store(500)
	cfg := Config{Route: "r", Targets: []TargetConfig{{Addr: ct.addr}, {Addr: "127.0.0.1:1"}},
		Check: &CheckConfig{Path: "/", Interval: 30 * time.Millisecond, Timeout: time.Second, UnhealthyThreshold: 1, HealthyThreshold: 1}}
	s1, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	testnet.Eventually(t, "down", s1.Targets()[0].Down)
	cfg.Check = nil
	s2, err := NewSet(cfg, s1)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Targets()[0].Down() || s2.Targets()[0].st.checker != nil {
		t.Fatal("without health_check a target is never down and has no checker")
	}
	cfg.Check = &CheckConfig{Path: "/", Interval: 30 * time.Millisecond, Timeout: time.Second, UnhealthyThreshold: 1, HealthyThreshold: 1}
	s3, err := NewSet(cfg, s2)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	testnet.Eventually(t, "down again once checks are back", s3.Targets()[0].Down)
}

func TestReloadOfAnotherRouteNameKeepsNothing(t *testing.T) {
	clock := newFakeClock()
	cfg := Config{Route: "a", Targets: []TargetConfig{{Addr: "x:1"}, {Addr: "y:1"}}, Clock: clock.Now,
		Passive: PassiveConfig{ConsecutiveFailures: 1, EjectTime: time.Minute, MaxEjectedPercent: 50}}
	a, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	attempt(a.Targets()[0], Failure, 502)
	cfg.Route = "b"
	b, err := NewSet(cfg, a)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Targets()[0].Ejected() || b.Targets()[0].st == a.Targets()[0].st {
		t.Fatal("a route of another name took over the state")
	}
}

func TestNewSetRefusesBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no targets": {Route: "r"},
		"duplicate":  {Route: "r", Targets: []TargetConfig{{Addr: "a:1"}, {Addr: "a:1"}}},
		"no port":    {Route: "r", Targets: []TargetConfig{{Addr: "a"}}},
		"weight":     {Route: "r", Targets: []TargetConfig{{Addr: "a:1", Weight: 101}}},
		"retries":    {Route: "r", Targets: []TargetConfig{{Addr: "a:1"}}, Retries: 4},
		"balance":    {Route: "r", Targets: []TargetConfig{{Addr: "a:1"}}, Balance: 9},
		"check path": {Route: "r", Targets: []TargetConfig{{Addr: "a:1"}}, Check: &CheckConfig{Interval: time.Second, Timeout: time.Second}},
	} {
		if s, err := NewSet(cfg, nil); err == nil {
			s.Close()
			t.Errorf("%s: NewSet accepted %+v", name, cfg)
		}
	}
	s, err := NewSet(Config{Route: "r", Targets: []TargetConfig{{Addr: "a:1"}, {Addr: "b:1"}}, Retries: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Retries() != 1 {
		t.Errorf("retries 3 over 2 targets: %d, want 1 (the other targets)", s.Retries())
	}
	if b, err := ParseBalance("round_robin"); err != nil || b != RoundRobin || b.String() != "round_robin" {
		t.Errorf("ParseBalance(round_robin) = %v, %v", b, err)
	}
	if _, err := ParseBalance("least_conn"); err == nil {
		t.Error("ParseBalance accepted least_conn")
	}
	for code, want := range map[int]Outcome{200: Success, 404: Success, 500: Success, 502: Failure, 503: Failure, 504: Failure} {
		if got := OutcomeOf(code); got != want {
			t.Errorf("OutcomeOf(%d) = %v, want %v", code, got, want)
		}
	}
}

func TestRetiredTargetRegistersNoMetrics(t *testing.T) {
	ms := metrics.NewSet()
	cfg := Config{Route: "r", Metrics: ms, Targets: []TargetConfig{{Addr: "a:1"}, {Addr: "b:1"}}}
	s1, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := s1.Pick(nil)
	cfg.Targets = []TargetConfig{{Addr: "c:1"}}
	s2, err := NewSet(cfg, s1)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	held.Done(Success, 418) // a code never seen before, on a target that left
	if text := scrape(ms); strings.Contains(text, held.Addr()) {
		t.Fatalf("a target that left registered a metric again:\n%s", text)
	}
}
