package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/dnstest"
	"toron/internal/testnet"
)

// DNS discovery (SPEC 13) and peak-EWMA p2c through the whole gateway, on real sockets: a
// real DNS server on loopback, real upstream servers on 127.0.0.N, one port.

// podFarm is a set of upstream servers on 127.0.0.2 .. 127.0.0.(n+1), one port: the pods
// behind a headless Service.
type podFarm struct {
	port int
	pods map[string]*pod // by IP
}

// pod is one upstream of a farm: it answers its IP, counts its requests and connections.
type pod struct {
	ip     string
	hits   atomic.Int64
	conns  atomic.Int64
	status atomic.Int32
	delay  atomic.Int64 // nanoseconds per answer
	srv    *http.Server
}

// newPodFarm starts n pods, retrying on another port when one address has it taken.
func newPodFarm(t *testing.T, n int) *podFarm {
	t.Helper()
	lns := testnet.LoopbackListeners(t, n)
	port := lns[0].Addr().(*net.TCPAddr).Port
	f := &podFarm{port: port, pods: map[string]*pod{}}
	for i, ln := range lns {
		p := &pod{ip: fmt.Sprintf("127.0.0.%d", i+2)}
		p.status.Store(200)
		p.srv = &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				p.hits.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				if d := p.delay.Load(); d > 0 {
					time.Sleep(time.Duration(d))
				}
				w.WriteHeader(int(p.status.Load()))
				_, _ = io.WriteString(w, p.ip)
			}),
			ConnState: func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					p.conns.Add(1)
				}
			},
		}
		go func() { _ = p.srv.Serve(ln) }()
		f.pods[p.ip] = p
	}
	t.Cleanup(func() {
		for _, p := range f.pods {
			_ = p.srv.Close()
		}
	})
	return f
}

// target is "ip:port" of pod ip.
func (f *podFarm) target(ip string) string { return ip + ":" + strconv.Itoa(f.port) }

// discoveryRoute is a route over one discovered name on the farm's port.
func discoveryRoute(f *podFarm, prefix, name, extra string) string {
	return fmt.Sprintf("- type: upstream\n  prefix: %s\n  name: %s\n  targets:\n    - {url: \"http://%s:%d\", discover: dns}\n  discovery_refresh: 1s\n%s",
		prefix, strings.TrimPrefix(prefix, "/"), name, f.port, indent(extra, "  "))
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
	farm := newPodFarm(t, 3)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	gw := startGateway(t, resolverServer(d), discoveryRoute(farm, "/api", "api.test", ""))
	url := "http://" + gw.addr + "/api/x"

	var done, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			c := &http.Client{Timeout: 10 * time.Second}
			defer c.CloseIdleConnections()
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, body, err := getBody(c, url)
				if err != nil || code != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %q %v", code, body, err))
				}
				done.Add(1)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	wait := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > limit {
				t.Fatalf("timed out after %v waiting until %s", limit, what)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	wait("200 requests", 20*time.Second, func() bool { return done.Load() >= 200 })
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		if farm.pods[ip].hits.Load() == 0 {
			t.Fatalf("%s got no request", ip)
		}
	}

	// Added: served within discovery_refresh (1s; bound 5s on a shared machine).
	d.Set("api.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	took := wait("the new address serves", 5*time.Second, func() bool { return farm.pods["127.0.0.4"].hits.Load() > 0 })
	t.Logf("the added address served %v after the DNS change (discovery_refresh 1s)", took)

	// Removed: once the set no longer has it and its requests in flight ended, no request
	// reaches it.
	gone := farm.pods["127.0.0.2"]
	d.Set("api.test", "127.0.0.3", "127.0.0.4")
	wait("the removed address leaves the set", 5*time.Second, func() bool {
		return metricLine(gw.g, `toron_upstream_targets{route="api"}`) == "2"
	})
	// A request that read the old set just before the change may still pick the address
	// (it was picked before the removal): a grace far above one request's time lets those end.
	time.Sleep(300 * time.Millisecond)
	after := gone.hits.Load()
	atRemoval := done.Load()
	wait("1,000 requests and 200 after the removal", 30*time.Second, func() bool { return done.Load() >= max(1000, atRemoval+200) })
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed across the DNS changes; first: %v", n, done.Load(), firstErr.Load())
	}
	if late := gone.hits.Load() - after; late != 0 {
		t.Fatalf("%d requests reached the removed address after it left", late)
	}
	// Per-address metrics carry ip:port.
	if metricLine(gw.g, `toron_upstream_healthy{route="api",target="`+farm.target("127.0.0.4")+`"}`) != "1" {
		t.Fatal("no per-address healthy gauge for the added address")
	}
}

func TestDiscoveryNoTargetAnswers503(t *testing.T) {
	farm := newPodFarm(t, 1)
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
	farm := newPodFarm(t, 2)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3")
	gw := startGateway(t, resolverServer(d), discoveryRoute(farm, "/api", "api.test", ""))
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	errs := func() int {
		n, _ := strconv.Atoi(metricLine(gw.g, `toron_upstream_discovery_errors_total{route="api"}`))
		return n
	}
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
	farm := newPodFarm(t, 3)
	d := dnstest.New(t)
	d.Set("api.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	// round_robin keeps sending the bad pod its share until passive health ejects it.
	gw := startGateway(t, resolverServer(d), discoveryRoute(farm, "/api", "api.test", "balance: round_robin\npassive_health: {consecutive_failures: 2}\nretries: 0\n"))
	farm.pods["127.0.0.3"].status.Store(503)
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	for range 30 {
		_, _, _ = getBody(c, "http://"+gw.addr+"/api/x")
	}
	for ip := range farm.pods {
		want := "1"
		if ip == "127.0.0.3" {
			want = "0"
		}
		if got := metricLine(gw.g, `toron_upstream_healthy{route="api",target="`+farm.target(ip)+`"}`); got != want {
			t.Fatalf("%s healthy = %q, want %s: only the pod answering 503 is ejected", ip, got, want)
		}
	}
}

func TestDiscoveryReloadKeepsPools(t *testing.T) {
	farm := newPodFarm(t, 2)
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
	conns := farm.pods["127.0.0.2"].conns.Load() + farm.pods["127.0.0.3"].conns.Load()
	// A reload that keeps the route (another route added): the discovered targets keep their
	// pools, so no new upstream connection is needed.
	if err := gw.g.Reload(loadConfig(t, resolverServer(d), routes+upstreamRoute("/other", farm.target("127.0.0.2"), ""))); err != nil {
		t.Fatal(err)
	}
	for range 40 {
		if code, _, err := getBody(c, "http://"+gw.addr+"/api/x"); code != 200 {
			t.Fatal(code, err)
		}
	}
	if after := farm.pods["127.0.0.2"].conns.Load() + farm.pods["127.0.0.3"].conns.Load(); after != conns {
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
