package upstream

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

// newTestSet builds a Set over targets named t0..tN-1:80 with the given weights.
func newTestSet(t *testing.T, b Balance, weights ...int) *Set {
	t.Helper()
	cfg := Config{Route: "r", Balance: b, Retries: 1}
	for i, w := range weights {
		cfg.Targets = append(cfg.Targets, TargetConfig{Addr: fmt.Sprintf("t%d:80", i), Weight: w})
	}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// pickDone picks once and ends the attempt at once, as sequential traffic does.
func pickDone(s *Set, ip []byte, exclude ...*Target) *Target {
	t := s.Pick(ip, exclude...)
	if t != nil {
		t.Done(Success, 200)
	}
	return t
}

func TestP2CSpreadsSequentialTraffic(t *testing.T) {
	for _, b := range []Balance{P2C, LeastRequest} {
		t.Run(b.String(), func(t *testing.T) { testSpreadsSequentialTraffic(t, b) })
	}
}

func testSpreadsSequentialTraffic(t *testing.T, b Balance) {
	s := newTestSet(t, b, 1, 1, 1)
	const n = 3000
	got := map[string]int{}
	for range n {
		got[pickDone(s, nil).Addr()]++
	}
	for _, tg := range s.Targets() {
		share := float64(got[tg.Addr()]) / n
		if share < 0.15 || share > 0.55 {
			t.Errorf("%s: %s served %.0f%% of sequential requests, want 15-55%% (all: %v)", b, tg.Addr(), 100*share, got)
		}
	}
}

func TestP2CPrefersFewerInFlight(t *testing.T) {
	for _, b := range []Balance{P2C, LeastRequest} {
		t.Run(b.String(), func(t *testing.T) { testPrefersFewerInFlight(t, b) })
	}
}

// testPrefersFewerInFlight: without samples (p2c) as by its rule (least_request), a busy
// target loses to an idle one.
func testPrefersFewerInFlight(t *testing.T, b Balance) {
	s := newTestSet(t, b, 1, 1)
	// Hold 5 requests on t0: every pick of two (there are only two) must choose t1.
	busy := s.Targets()[0]
	for range 5 {
		busy.st.inflight.Add(1)
	}
	defer busy.st.inflight.Add(-5)
	for range 200 {
		if got := pickDone(s, nil); got != s.Targets()[1] {
			t.Fatalf("p2c picked %s with 5 in flight over an idle target", got.Addr())
		}
	}
}

func TestP2CHonoursWeights(t *testing.T) {
	for _, b := range []Balance{P2C, LeastRequest} {
		t.Run(b.String(), func(t *testing.T) { testHonoursWeights(t, b) })
	}
}

func testHonoursWeights(t *testing.T, b Balance) {
	// With three targets the weights decide which pairs are drawn: t0 (8 of 10) is in almost
	// every pair, and sequential traffic breaks the tie at random.
	s := newTestSet(t, b, 8, 1, 1)
	got := map[string]int{}
	for range 3000 {
		got[pickDone(s, nil).Addr()]++
	}
	if got["t0:80"] <= got["t1:80"] || got["t0:80"] <= got["t2:80"] {
		t.Errorf("p2c with weights 8,1,1 did not favour t0: %v", got)
	}
}

func TestRoundRobinWeightsExactPerCycle(t *testing.T) {
	s := newTestSet(t, RoundRobin, 5, 1, 1)
	var seq []string
	for range 3 * 7 {
		seq = append(seq, strings.TrimSuffix(pickDone(s, nil).Addr(), ":80"))
	}
	for c := range 3 {
		cycle := seq[c*7 : (c+1)*7]
		count := map[string]int{}
		for _, a := range cycle {
			count[a]++
		}
		if count["t0"] != 5 || count["t1"] != 1 || count["t2"] != 1 {
			t.Fatalf("cycle %d %v: want t0 5 times, t1 and t2 once", c, cycle)
		}
	}
	// Smooth: nginx's sequence for 5,1,1 is a a b a c a a: the heavy target never runs 5 in a row.
	if want := "t0 t0 t1 t0 t2 t0 t0"; strings.Join(seq[:7], " ") != want {
		t.Errorf("round robin sequence %v, want nginx's smooth %s", seq[:7], want)
	}
}

func TestRoundRobinEqualWeightsAlternate(t *testing.T) {
	s := newTestSet(t, RoundRobin, 1, 1, 1)
	for i := range 9 {
		if got, want := pickDone(s, nil).Addr(), fmt.Sprintf("t%d:80", i%3); got != want {
			t.Fatalf("pick %d: %s, want %s", i, got, want)
		}
	}
}

// clientIPs returns n distinct client addresses, IPv4 and IPv6.
func clientIPs(n int) [][]byte {
	var out [][]byte
	for i := range n {
		if i%4 == 3 {
			out = append(out, net.ParseIP(fmt.Sprintf("2001:db8::%x", i)))
		} else {
			out = append(out, net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)).To4())
		}
	}
	return out
}

func TestClientIPHashStickyAndSpread(t *testing.T) {
	s := newTestSet(t, ClientIPHash, 1, 1, 1)
	ips := clientIPs(3000)
	first := make([]*Target, len(ips))
	count := map[string]int{}
	for i, ip := range ips {
		first[i] = pickDone(s, ip)
		count[first[i].Addr()]++
	}
	for i, ip := range ips {
		for range 3 {
			if got := pickDone(s, ip); got != first[i] {
				t.Fatalf("client %v moved from %s to %s", net.IP(ip), first[i].Addr(), got.Addr())
			}
		}
	}
	for _, tg := range s.Targets() {
		if share := float64(count[tg.Addr()]) / float64(len(ips)); share < 0.25 || share > 0.42 {
			t.Errorf("client_ip_hash: %s has %.0f%% of the clients, want about a third: %v", tg.Addr(), 100*share, count)
		}
	}
	// A v4-mapped 16-byte address is the same client as its 4 bytes.
	v4 := net.IPv4(10, 1, 2, 3)
	if a, b := pickDone(s, v4), pickDone(s, v4.To4()); a != b {
		t.Errorf("::ffff:10.1.2.3 went to %s, 10.1.2.3 to %s", a.Addr(), b.Addr())
	}
}

func TestClientIPHashWeighted(t *testing.T) {
	s := newTestSet(t, ClientIPHash, 3, 1)
	count := map[string]int{}
	ips := clientIPs(4000)
	for _, ip := range ips {
		count[pickDone(s, ip).Addr()]++
	}
	if share := float64(count["t0:80"]) / float64(len(ips)); share < 0.70 || share > 0.80 {
		t.Errorf("weights 3:1: t0 has %.0f%% of the clients, want about 75%%", 100*share)
	}
}

func TestClientIPHashRemovalMovesOnlyItsClients(t *testing.T) {
	ips := clientIPs(3000)
	full := newTestSet(t, ClientIPHash, 1, 2, 1, 1)
	before := make([]string, len(ips))
	for i, ip := range ips {
		before[i] = pickDone(full, ip).Addr()
	}

	// t1 removed from the configuration (a reload without it).
	cfg := Config{Route: "other", Balance: ClientIPHash}
	for _, w := range []int{0, 2, 3} {
		cfg.Targets = append(cfg.Targets, TargetConfig{Addr: fmt.Sprintf("t%d:80", w), Weight: []int{1, 2, 1, 1}[w]})
	}
	less, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer less.Close()
	moved := 0
	for i, ip := range ips {
		after := pickDone(less, ip).Addr()
		switch {
		case before[i] != "t1:80" && after != before[i]:
			t.Fatalf("client %v moved from %s to %s though its target stayed", net.IP(ip), before[i], after)
		case before[i] == "t1:80":
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no client was on t1: the test proves nothing")
	}

	// The same when t1 is ineligible rather than removed, and its clients come back after.
	down := full.Targets()[1]
	down.st.down.Store(true)
	for i, ip := range ips {
		after := pickDone(full, ip).Addr()
		if (before[i] == "t1:80") == (after == before[i]) {
			t.Fatalf("t1 down: client %v was on %s, now on %s", net.IP(ip), before[i], after)
		}
	}
	down.st.down.Store(false)
	for i, ip := range ips {
		if after := pickDone(full, ip).Addr(); after != before[i] {
			t.Fatalf("t1 back: client %v was on %s, now on %s", net.IP(ip), before[i], after)
		}
	}
}

func TestPickExcludesTriedTargets(t *testing.T) {
	for _, b := range []Balance{P2C, LeastRequest, RoundRobin, ClientIPHash} {
		t.Run(b.String(), func(t *testing.T) {
			s := newTestSet(t, b, 1, 1, 1)
			ip := []byte{10, 0, 0, 1}
			for range 50 {
				a := pickDone(s, ip)
				c := pickDone(s, ip, a)
				d := pickDone(s, ip, a, c)
				if c == nil || d == nil || c == a || d == a || d == c {
					t.Fatalf("retries must go to other targets: %v %v %v", a, c, d)
				}
				if e := s.Pick(ip, a, c, d); e != nil {
					t.Fatalf("every target tried, Pick returned %s", e.Addr())
				}
			}
		})
	}
}

func TestPickSkipsIneligibleAndPanics(t *testing.T) {
	var events []Event
	cfg := Config{Route: "r", Targets: []TargetConfig{{Addr: "a:1"}, {Addr: "b:1"}}, OnEvent: func(e Event) { events = append(events, e) }}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := s.Targets()[0], s.Targets()[1]
	a.st.down.Store(true)
	for range 50 {
		if got := pickDone(s, nil); got != b {
			t.Fatalf("a is down, picked %s", got.Addr())
		}
	}
	// Retrying after b: a is down, so there is no other eligible target.
	if got := s.Pick(nil, b); got != nil {
		t.Fatalf("retry picked %s, which is down", got.Addr())
	}
	b.st.down.Store(true)
	seen := map[*Target]int{}
	for range 100 {
		seen[pickDone(s, nil)]++
	}
	if seen[a] == 0 || seen[b] == 0 || !s.Panicking() {
		t.Fatalf("panic mode must use every target: %v panicking=%v", seen, s.Panicking())
	}
	a.st.down.Store(false)
	pickDone(s, nil)
	if s.Panicking() {
		t.Fatal("a target is eligible again, still panicking")
	}
	var kinds []EventKind
	for _, e := range events {
		kinds = append(kinds, e.Kind)
	}
	if fmt.Sprint(kinds) != fmt.Sprint([]EventKind{EventPanic, EventPanicOver}) {
		t.Fatalf("events %v, want one panic and its end", kinds)
	}
}

func TestMetricsAndInflight(t *testing.T) {
	ms := metrics.NewSet()
	s, err := NewSet(Config{Route: "api", Targets: []TargetConfig{{Addr: "10.0.0.1:80"}, {Addr: "10.0.0.2:80"}}, Metrics: ms}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := s.Pick(nil)
	b := s.Pick(nil, a)
	text := scrape(ms)
	for _, want := range []string{
		`toron_upstream_inflight{route="api",target="` + a.Addr() + `"} 1`,
		`toron_upstream_inflight{route="api",target="` + b.Addr() + `"} 1`,
		`toron_upstream_healthy{route="api",target="10.0.0.1:80"} 1`,
		`toron_upstream_ejections_total{route="api",target="10.0.0.1:80"} 0`,
		`toron_upstream_requests_total{route="api",target="10.0.0.1:80",code="200"} 0`,
		`toron_upstream_retries_total{route="api"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s:\n%s", want, text)
		}
	}
	a.Done(Success, 201)
	b.Done(Neutral, 499)
	s.CountRetry()
	text = scrape(ms)
	for _, want := range []string{
		`toron_upstream_inflight{route="api",target="` + a.Addr() + `"} 0`,
		`toron_upstream_inflight{route="api",target="` + b.Addr() + `"} 0`,
		`toron_upstream_requests_total{route="api",target="` + a.Addr() + `",code="201"} 1`,
		`toron_upstream_requests_total{route="api",target="` + b.Addr() + `",code="499"} 1`,
		`toron_upstream_retries_total{route="api"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s:\n%s", want, text)
		}
	}
	s.Close()
	if text := scrape(ms); strings.Contains(text, "toron_upstream") {
		t.Errorf("Close left metrics behind:\n%s", text)
	}
}

// scrape returns the Prometheus text of ms.
func scrape(ms *metrics.Set) string {
	var sb strings.Builder
	ms.WritePrometheus(&sb)
	return sb.String()
}

func TestPickDoesNotAllocate(t *testing.T) {
	ip := []byte{192, 0, 2, 7}
	for _, b := range []Balance{P2C, LeastRequest, RoundRobin, ClientIPHash} {
		s := newTestSet(t, b, 1, 2, 3)
		tried := [MaxRetries + 1]*Target{}
		n := testing.AllocsPerRun(1000, func() {
			tried[0] = s.Pick(ip)
			tried[1] = s.Pick(ip, tried[:1]...)
			tried[0].Done(Failure, 502)
			tried[1].Done(Success, 200)
		})
		if n != 0 {
			t.Errorf("%s: %v allocations per Pick and Done, want 0", b, n)
		}
	}
}
