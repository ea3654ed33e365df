package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/dnstest"
	"toron/internal/testnet"
)

// DNS discovery (SPEC 13) and peak-EWMA p2c through the whole gateway, on real sockets: a
// real DNS server on loopback, real upstream servers on 127.0.0.N, one port.

// discoveryRoute is a route over one discovered name on the farm's port.
func discoveryRoute(f *testnet.Farm, prefix, name, extra string) string {
	return fmt.Sprintf("- type: upstream\n  prefix: %s\n  name: %s\n  targets:\n    - {url: \"http://%s:%d\", discover: dns}\n  discovery_refresh: 1s\n%s",
		prefix, strings.TrimPrefix(prefix, "/"), name, f.Port, indent(extra, "  "))
}

// resolverServer is the server block naming the test DNS server.
func resolverServer(d *dnstest.Server) string { return "resolver: \"" + d.Addr + "\"\n" }

// getBody sends GET url and returns the status and body.
func getBody(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestDiscoveryAddressesChangeUnderLoad(t *testing.T) {
	farm := testnet.NewFarm(t, 3, 0)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	gw := startGateway(t, resolverServer(d), discoveryRoute(farm, "/api", "api.test", ""))
	url := "http://" + gw.addr + "/api/x"

	var done, failed atomic.Int64
	var firstErr atomic.Value
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	stop := testnet.Loop(t, 8, func(int) {
		code, body, err := getBody(c, url)
		if err != nil || code != 200 {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %q %v", code, body, err))
		}
		done.Add(1)
	})
	testnet.Within(t, "200 requests", 20*time.Second, func() bool { return done.Load() >= 200 })
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		if farm.Pods[ip].Hits.Load() == 0 {
			t.Fatalf("%s got no request", ip)
		}
	}

	// Added: served within discovery_refresh (1s; bound 5s on a shared machine).
	d.Set("api.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	took := testnet.Within(t, "the new address serves", 5*time.Second, func() bool { return farm.Pods["127.0.0.4"].Hits.Load() > 0 })
	t.Logf("the added address served %v after the DNS change (discovery_refresh 1s)", took)

	// Removed: once the set no longer has it and its requests in flight ended, no request
	// reaches it.
	gone := farm.Pods["127.0.0.2"]
	d.Set("api.test", "127.0.0.3", "127.0.0.4")
	testnet.Within(t, "the removed address leaves the set", 5*time.Second, func() bool {
		return metricLine(gw.g, `toron_upstream_targets{route="api"}`) == "2"
	})
	// A request that read the old set just before the change may still pick the address
	// (it was picked before the removal): a grace far above one request's time lets those end.
	time.Sleep(300 * time.Millisecond)
	after := gone.Hits.Load()
	atRemoval := done.Load()
	testnet.Within(t, "1,000 requests and 200 after the removal", 30*time.Second, func() bool { return done.Load() >= max(1000, atRemoval+200) })
	stop()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed across the DNS changes; first: %v", n, done.Load(), firstErr.Load())
	}
	if late := gone.Hits.Load() - after; late != 0 {
		t.Fatalf("%d requests reached the removed address after it left", late)
	}
	// Per-address metrics carry ip:port.
	if metricLine(gw.g, `toron_upstream_healthy{route="api",target="`+farm.Addr("127.0.0.4")+`"}`) != "1" {
		t.Fatal("no per-address healthy gauge for the added address")
	}
}

func TestDiscoveryNoTargetAnswers503(t *testing.T) {
	farm := testnet.NewFarm(t, 1, 0)
	d := dnstest.New(t)
	gw := startGateway(t, resolverServer(d), discoveryRoute(farm, "/api", "late.test", ""))
	r := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")
	if r.StatusCode != 503 || string(r.body) != `{"error":"503 Service Unavailable: No upstream target"}` {
		t.Fatalf("a route without targets: %d %q", r.StatusCode, r.body)
	}
	if got := metricLine(gw.g, `toron_rejected_total{route="api",reason="no_target"}`); got != "1" {
		t.Fatalf(`toron_rejected_total{reason="no_target"} = %q, want 1`, got)
	}
	if got := metricLine(gw.g, `toron_upstream_targets{route="api"}`); got != "0" {
		t.Fatalf("toron_upstream_targets = %q, want 0", got)
	}
	// The name resolves later: the route serves without a reload.
	d.Set("late.test", "127.0.0.2")
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	if !testnet.WaitUntil(10*time.Second, func() bool {
		code, body, _ := getBody(c, "http://"+gw.addr+"/api/x")
		return code == 200 && body == "127.0.0.2"
	}) {
		t.Fatal("the route did not serve once its name resolved")
	}
}

func TestDiscoveryFailedLookupAndEmptyAnswers(t *testing.T) {
	farm := testnet.NewFarm(t, 2, 0)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	gw := startGateway(t, resolverServer(d), discoveryRoute(farm, "/api", "api.test", ""))
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	errs := func() float64 { return scrape(t, gw.addr)[`toron_upstream_discovery_errors_total{route="api"}`] }
	d.ServFail.Store(true)
	if !testnet.WaitUntil(10*time.Second, func() bool { return errs() >= 2 }) {
		t.Fatal("SERVFAIL answers were not counted")
	}
	if got := metricLine(gw.g, `toron_upstream_targets{route="api"}`); got != "2" {
		t.Fatalf("failed lookups changed the set: %s targets", got)
	}
	if code, _, err := getBody(c, "http://"+gw.addr+"/api/x"); code != 200 {
		t.Fatalf("the kept set does not serve: %d %v", code, err)
	}
	d.ServFail.Store(false)
	// NXDOMAIN: the first answer is ignored, the second applies. Queries are watched so the
	// test knows a refresh happened (two per lookup: A and AAAA).
	d.Remove("api.test")
	q := d.Queries.Load()
	if !testnet.WaitUntil(10*time.Second, func() bool { return d.Queries.Load() >= q+2 }) {
		t.Fatal("no refresh")
	}
	time.Sleep(100 * time.Millisecond)
	if got := metricLine(gw.g, `toron_upstream_targets{route="api"}`); got != "2" {
		// Possibly two lookups happened already: then it must be 0, never anything else.
		if got != "0" {
			t.Fatalf("after one empty answer: %s targets", got)
		}
	}
	if !testnet.WaitUntil(10*time.Second, func() bool { return metricLine(gw.g, `toron_upstream_targets{route="api"}`) == "0" }) {
		t.Fatal("two empty answers in a row did not empty the set")
	}
	r := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")
	if r.StatusCode != 503 || !strings.Contains(string(r.body), "No upstream target") {
		t.Fatalf("no target: %d %q", r.StatusCode, r.body)
	}
}

func TestDiscoveryPerAddressHealth(t *testing.T) {
	farm := testnet.NewFarm(t, 3, 0)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	// round_robin keeps sending the bad pod its share until passive health ejects it.
	gw := startGateway(t, resolverServer(d), discoveryRoute(farm, "/api", "api.test", "balance: round_robin\npassive_health: {consecutive_failures: 2}\nretries: 0\n"))
	farm.Pods["127.0.0.3"].Status.Store(503)
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	for range 30 {
		_, _, _ = getBody(c, "http://"+gw.addr+"/api/x")
	}
	for ip := range farm.Pods {
		want := "1"
		if ip == "127.0.0.3" {
			want = "0"
		}
		if got := metricLine(gw.g, `toron_upstream_healthy{route="api",target="`+farm.Addr(ip)+`"}`); got != want {
			t.Fatalf("%s healthy = %q, want %s: only the pod answering 503 is ejected", ip, got, want)
		}
	}
}

func TestDiscoveryReloadKeepsPools(t *testing.T) {
	farm := testnet.NewFarm(t, 2, 0)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	routes := discoveryRoute(farm, "/api", "api.test", "")
	gw := startGateway(t, resolverServer(d), routes)
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	for range 40 {
		if code, _, err := getBody(c, "http://"+gw.addr+"/api/x"); code != 200 {
			t.Fatal(code, err)
		}
	}
	conns := farm.Pods["127.0.0.2"].Conns.Load() + farm.Pods["127.0.0.3"].Conns.Load()
	// A reload that keeps the route (another route added): the discovered targets keep their
	// pools, so no new upstream connection is needed.
	if err := gw.g.Reload(loadConfig(t, resolverServer(d), routes+upstreamRoute("/other", farm.Addr("127.0.0.2"), ""))); err != nil {
		t.Fatal(err)
	}
	for range 40 {
		if code, _, err := getBody(c, "http://"+gw.addr+"/api/x"); code != 200 {
			t.Fatal(code, err)
		}
	}
	if after := farm.Pods["127.0.0.2"].Conns.Load() + farm.Pods["127.0.0.3"].Conns.Load(); after != conns {
		t.Fatalf("upstream connections went from %d to %d across the reload: the pools were not kept", conns, after)
	}
	if got := metricLine(gw.g, `toron_upstream_targets{route="api"}`); got != "2" {
		t.Fatalf("toron_upstream_targets after the reload = %q", got)
	}
}

func TestP2CAvoidsASlowTargetThroughTheGateway(t *testing.T) {
	fast := namedUpstream(t, "fast")
	slow := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(40 * time.Millisecond)
		io.WriteString(w, "slow")
	})
	gw := startGateway(t, "", targetsRoute("/api", []string{fast.addr, slow.addr}, "balance: p2c\n"))
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	got := map[string]int{}
	for range 200 {
		_, body, err := getBody(c, "http://"+gw.addr+"/api/x")
		if err != nil {
			t.Fatal(err)
		}
		got[body]++
	}
	// Sequential traffic: least_request would split it evenly (all ties); the latency samples
	// must steer nearly all of it to the fast target (the slow one gets its first probe and
	// the ones its estimate decays into: a handful).
	if got["slow"] > 20 {
		t.Fatalf("p2c sent %d of 200 sequential requests to a target 40x slower: %v", got["slow"], got)
	}
}
