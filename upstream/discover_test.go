package upstream

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"toron/internal/dnstest"
	"toron/internal/testnet"
)

// httpPool is a target's connection pool in these tests: an HTTP client dialing the
// target's address, whose Close closes its idle connections.
type httpPool struct {
	tr     *http.Transport
	client *http.Client
	closed atomic.Bool
}

func (p *httpPool) Close() error {
	p.closed.Store(true)
	p.tr.CloseIdleConnections()
	return nil
}

// attachHTTPPool is Config.OnTarget for these tests.
func attachHTTPPool(t *Target) {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Attach(&httpPool{tr: tr, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}})
}

// send runs one request through the Set as the exchange does: Pick, the request, Observe,
// Done. It returns the IP that answered.
func send(s *Set) (string, error) {
	tg := s.Pick(nil)
	if tg == nil {
		return "", ErrNoTarget
	}
	p := tg.Attached().(*httpPool)
	start := time.Now()
	resp, err := p.client.Get("http://" + tg.Addr() + "/")
	if err != nil {
		tg.Observe(time.Since(start), Failure)
		tg.Done(Failure, 502)
		return "", err
	}
	tg.Observe(time.Since(start), OutcomeOf(resp.StatusCode))
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	tg.Done(OutcomeOf(resp.StatusCode), resp.StatusCode)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return string(body), fmt.Errorf("status %d from %s", resp.StatusCode, tg.Addr())
	}
	return string(body), nil
}

// discoveredSet builds a Set with one discovered entry through the test DNS server.
func discoveredSet(t *testing.T, d *dnstest.Server, entry string, refresh time.Duration, mutate func(*Config)) *Set {
	t.Helper()
	cfg := Config{
		Route:            "api",
		Targets:          []TargetConfig{{Addr: entry, Discover: true}},
		DiscoveryRefresh: refresh,
		Lookup:           NewDNSLookup(d.Addr),
		OnTarget:         attachHTTPPool,
		Metrics:          metrics.NewSet(),
		Retries:          1,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// addrsOf lists the Set's current target addresses.
func addrsOf(s *Set) []string {
	var out []string
	for _, tg := range s.Targets() {
		out = append(out, tg.Addr())
	}
	return out
}

// firstDiscoverer returns the Set's first discoverer, for tests that step it by hand.
func (s *Set) firstDiscoverer() *discoverer {
	for _, e := range s.entries {
		if e.disc != nil {
			return e.disc
		}
	}
	return nil
}

func TestDiscoveryAddsAndRemovesUnderLoad(t *testing.T) {
	farm := testnet.NewFarm(t, 3, time.Millisecond)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	const refresh = 200 * time.Millisecond
	s := discoveredSet(t, d, farm.Addr("api.test"), refresh, nil)
	if got := addrsOf(s); len(got) != 2 {
		t.Fatalf("resolved at start: %v, want the two addresses", got)
	}

	var done, errs atomic.Int64
	var firstErr atomic.Value
	stop := testnet.Loop(t, 8, func(int) {
		if _, err := send(s); err != nil {
			errs.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}
		done.Add(1)
	})
	testnet.Within(t, "200 requests", 20*time.Second, func() bool { return done.Load() >= 200 })

	// An address added: served within discovery_refresh (generous: 10x for a shared machine).
	added := farm.Pods["127.0.0.4"]
	d.Set("api.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	took := testnet.Within(t, "the new address serves", 10*refresh, func() bool { return added.Hits.Load() > 0 })
	t.Logf("a new address served %v after the DNS change (discovery_refresh %v)", took, refresh)

	// An address removed: no longer picked; what was in flight on it finishes.
	removed := farm.Pods["127.0.0.2"]
	var gone *Target
	for _, tg := range s.Targets() {
		if strings.HasPrefix(tg.Addr(), "127.0.0.2:") {
			gone = tg
		}
	}
	gonePool := gone.Attached().(*httpPool)
	d.Set("api.test", "127.0.0.3", "127.0.0.4")
	testnet.Within(t, "the removed address leaves the set", 10*refresh, func() bool { return len(s.Targets()) == 2 })
	testnet.Within(t, "its in-flight requests finish", 5*time.Second, func() bool { return gone.InFlight() == 0 })
	// A request that read the old set just before the change may still pick it (a pick before
	// the removal): a grace far above one request's time lets those end too.
	time.Sleep(300 * time.Millisecond)
	testnet.Within(t, "its in-flight requests finish", 5*time.Second, func() bool { return gone.InFlight() == 0 })
	after := removed.Hits.Load()
	if !gonePool.closed.Load() {
		t.Error("the removed address's pool was not closed")
	}
	atRemoval := done.Load()
	testnet.Within(t, "1,000 requests and 200 after the removal", 30*time.Second, func() bool {
		return done.Load() >= max(1000, atRemoval+200)
	})
	stop()
	if n := errs.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed across the DNS changes, first: %v", n, done.Load(), firstErr.Load())
	}
	if late := removed.Hits.Load() - after; late != 0 {
		t.Fatalf("%d requests reached the removed address after it left the set", late)
	}
	if got := metricValue(s, `toron_upstream_targets{route="api"}`); got != "2" {
		t.Fatalf("toron_upstream_targets = %q, want 2", got)
	}
	t.Logf("%d requests, none failed", done.Load())
}

// metricValue returns the value of one sample of the Set's metrics, "" when absent.
func metricValue(s *Set, series string) string {
	var sb strings.Builder
	s.metrics.WritePrometheus(&sb)
	for _, line := range strings.Split(sb.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// twoPodSet is a set discovered from api.test, which names the two pods of a farm, refreshed
// only when a test asks its discoverer.
func twoPodSet(t *testing.T) (*dnstest.Server, *Set, *discoverer) {
	t.Helper()
	farm := testnet.NewFarm(t, 2, time.Millisecond)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	s := discoveredSet(t, d, farm.Addr("api.test"), time.Hour, nil)
	return d, s, s.firstDiscoverer()
}

func TestDiscoveryFailedLookupKeepsTheSet(t *testing.T) {
	d, s, disc := twoPodSet(t)
	want := strings.Join(addrsOf(s), ",")

	d.ServFail.Store(true)
	if !disc.refreshOnce() {
		t.Fatal("refresh reported a stop")
	}
	if got := strings.Join(addrsOf(s), ","); got != want {
		t.Fatalf("SERVFAIL changed the set: %s, want %s", got, want)
	}
	if got := metricValue(s, `toron_upstream_discovery_errors_total{route="api"}`); got != "1" {
		t.Fatalf("discovery errors after a SERVFAIL: %q, want 1", got)
	}
	d.Stop() // the server is down: the kernel refuses the queries
	disc.refreshOnce()
	if got := strings.Join(addrsOf(s), ","); got != want {
		t.Fatalf("a lookup with the server down changed the set: %s, want %s", got, want)
	}
	if got := metricValue(s, `toron_upstream_discovery_errors_total{route="api"}`); got != "2" {
		t.Fatalf("discovery errors with the server down: %q, want 2", got)
	}
	if _, err := send(s); err != nil {
		t.Fatalf("the kept set does not serve: %v", err)
	}
}

func TestDiscoveryEmptyAnswerAppliesTheSecondTime(t *testing.T) {
	d, s, disc := twoPodSet(t)

	for _, empty := range []struct {
		name string
		make func()
	}{
		{"NXDOMAIN", func() { d.Remove("api.test") }},
		{"NOERROR without records", func() { d.Set("api.test") }},
	} {
		d.Set("api.test", "127.0.0.2", "127.0.0.3")
		disc.refreshOnce()
		empty.make()
		disc.refreshOnce()
		if n := len(s.Targets()); n != 2 {
			t.Fatalf("%s once: %d targets, want the 2 kept", empty.name, n)
		}
		// A failed lookup between the two does not count (nor reset the first).
		d.ServFail.Store(true)
		disc.refreshOnce()
		d.ServFail.Store(false)
		if n := len(s.Targets()); n != 2 {
			t.Fatalf("%s then SERVFAIL: %d targets, want 2", empty.name, n)
		}
		disc.refreshOnce()
		if n := len(s.Targets()); n != 0 {
			t.Fatalf("%s twice in a row: %d targets, want 0", empty.name, n)
		}
		if tg := s.Pick(nil); tg != nil {
			t.Fatalf("a route without targets picked %s", tg.Addr())
		}
		if _, err := send(s); err != ErrNoTarget {
			t.Fatalf("a request on a route without targets: %v, want ErrNoTarget", err)
		}
	}
	// One empty answer between two full ones is ignored.
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	disc.refreshOnce()
	d.Set("api.test")
	disc.refreshOnce()
	d.Set("api.test", "127.0.0.3")
	disc.refreshOnce()
	d.Set("api.test")
	disc.refreshOnce()
	if got := addrsOf(s); len(got) != 1 || !strings.HasPrefix(got[0], "127.0.0.3:") {
		t.Fatalf("empty, full, empty: %v, want the full answer's one address", got)
	}
}

func TestDiscoveryNameNotResolvingAtStart(t *testing.T) {
	farm := testnet.NewFarm(t, 1, time.Millisecond)
	d := dnstest.New(t)
	s := discoveredSet(t, d, farm.Addr("late.test"), 100*time.Millisecond, nil)
	if n := len(s.Targets()); n != 0 {
		t.Fatalf("%d targets for a name that does not resolve", n)
	}
	if got := metricValue(s, `toron_upstream_targets{route="api"}`); got != "0" {
		t.Fatalf("toron_upstream_targets = %q, want 0", got)
	}
	d.Set("late.test", "127.0.0.2")
	testnet.Eventually(t, "the name resolves and serves", func() bool {
		ip, err := send(s)
		return err == nil && ip == "127.0.0.2"
	})
}

func TestDiscoveryPerAddressHealth(t *testing.T) {
	farm := testnet.NewFarm(t, 3, time.Millisecond)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	s := discoveredSet(t, d, farm.Addr("api.test"), time.Hour, func(c *Config) {
		c.Passive = PassiveConfig{ConsecutiveFailures: 2, EjectTime: time.Minute, MaxEjectedPercent: 50}
		// Round robin keeps sending the bad address its share until it is ejected; p2c would
		// avoid it after its first failure (sampled as 1 s) and take long to fail it twice.
		c.Balance = RoundRobin
	})
	farm.Pods["127.0.0.3"].Status.Store(503)
	for range 200 {
		_, _ = send(s)
	}
	for _, tg := range s.Targets() {
		bad := strings.HasPrefix(tg.Addr(), "127.0.0.3:")
		if tg.Ejected() != bad {
			t.Fatalf("%s ejected=%v; only the address answering 503 must be", tg.Addr(), tg.Ejected())
		}
	}
	if got := metricValue(s, `toron_upstream_healthy{route="api",target="127.0.0.3:`+strconv.Itoa(farm.Port)+`"}`); got != "0" {
		t.Fatalf("healthy gauge of the ejected address %q, want 0", got)
	}
}

func TestDiscoveryReloadKeepsState(t *testing.T) {
	farm := testnet.NewFarm(t, 3, time.Millisecond)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	entry := farm.Addr("api.test")
	ms := metrics.NewSet()
	cfg := Config{Route: "api", Targets: []TargetConfig{{Addr: entry, Discover: true}}, DiscoveryRefresh: time.Hour,
		Lookup: NewDNSLookup(d.Addr), OnTarget: attachHTTPPool, Metrics: ms,
		Passive: PassiveConfig{ConsecutiveFailures: 1, EjectTime: time.Hour, MaxEjectedPercent: 50}}
	old, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := send(old); err != nil {
			t.Fatal(err)
		}
	}
	byAddr := map[string]*Target{}
	for _, tg := range old.Targets() {
		byAddr[tg.Addr()] = tg
	}
	ejected := old.Targets()[0]
	ejected.Observe(0, Failure)
	attempt(ejected, Failure, 502)
	if !ejected.Ejected() {
		t.Fatal("not ejected")
	}

	// The name changes meanwhile; the reload's immediate lookup finds it.
	d.Set("api.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	cfg.Targets[0].Weight = 3
	next, err := NewSet(cfg, old)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	old.Close() // a no-op: next took it over
	for _, tg := range next.Targets() {
		o := byAddr[tg.Addr()]
		if o == nil {
			continue
		}
		if tg.st != o.st || tg.Attached() != o.Attached() || tg.Weight() != 3 {
			t.Fatalf("%s lost its state or pool across the reload", tg.Addr())
		}
		if _, ok := tg.Latency(); !ok {
			t.Fatalf("%s lost its latency estimate", tg.Addr())
		}
	}
	if !next.Targets()[0].Ejected() {
		t.Fatal("the ejection did not survive the reload")
	}
	testnet.Eventually(t, "the reload's lookup adds the new address", func() bool { return len(next.Targets()) == 3 })
	if got := metricValue(next, `toron_upstream_targets{route="api"}`); got != "3" {
		t.Fatalf("toron_upstream_targets = %q after the reload, want 3", got)
	}
	if _, err := send(next); err != nil {
		t.Fatal(err)
	}
}

func TestDiscoveryLookupErrorsClassified(t *testing.T) {
	d := dnstest.New(t)
	lookup := NewDNSLookup(d.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.Set("v6.test", "::1", "127.0.0.9")
	got, err := LookupEntry(ctx, lookup, "v6.test:8080")
	if err != nil || strings.Join(got, ",") != "127.0.0.9:8080,[::1]:8080" {
		t.Fatalf("A and AAAA: %v %v", got, err)
	}
	if _, err := lookup(ctx, "missing.test"); !IsEmptyAnswer(err) {
		t.Fatalf("NXDOMAIN is an empty answer, got %v", err)
	}
	d.Set("empty.test")
	if _, err := lookup(ctx, "empty.test"); !IsEmptyAnswer(err) {
		t.Fatalf("NOERROR without records is an empty answer, got %v", err)
	}
	d.ServFail.Store(true)
	if _, err := lookup(ctx, "v6.test"); err == nil || IsEmptyAnswer(err) {
		t.Fatalf("SERVFAIL is a failed lookup, got %v", err)
	}
}
