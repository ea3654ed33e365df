package gateway

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"toron/internal/redistest"
	"toron/internal/testnet"
)

// The gateway's side of scope: global (SPEC 17) against a real redis-server on a loopback port
// (limits/global_test.go tests the limiter itself: cluster, TLS, failures, floods).

// waitRedisUp waits until the gateway's client of server.redis is connected.
func waitRedisUp(t *testing.T, g *Gateway) {
	t.Helper()
	r := g.snap.Load().redis
	if r == nil {
		t.Fatal("the gateway has no redis client")
	}
	// The first decision connects; Up turns 1 after the first success.
	if !testnet.WaitUntil(10*time.Second, func() bool { return r.Connected() }) {
		t.Fatal("redis client not connected within 10s")
	}
}

func TestGlobalRateLimitAcrossGateways(t *testing.T) {
	addr := redistest.Start(t).Addr
	up := startUpstream(t, nil)
	server := "redis: {addrs: [\"" + addr + "\"], timeout: 1s}\n"
	route := upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 0.5, burst: 3, scope: global, on_error: deny}")
	a := startGateway(t, server, route)
	b := startGateway(t, server, route)
	waitRedisUp(t, a.g)
	waitRedisUp(t, b.g)
	ca, cb := dialRaw(t, a.addr), dialRaw(t, b.addr)
	for i, c := range []net.Conn{ca, cb, ca} {
		if rr := getOn(t, c, "/api/x", ""); rr.StatusCode != 200 {
			t.Fatalf("request %d of a burst of 3 shared by two gateways: %d %s", i+1, rr.StatusCode, rr.body)
		}
	}
	rr := getOn(t, cb, "/api/x", "")
	if rr.StatusCode != 429 || string(rr.body) != rateLimitedBody {
		t.Fatalf("4th request, on the other gateway: %d %s, want the shared 429", rr.StatusCode, rr.body)
	}
	if ra := rr.Header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After %q, want 2 (a token every 2s)", ra)
	}
	if n := up.requests.Load(); n != 3 {
		t.Errorf("upstream saw %d requests, want 3", n)
	}
	m := scrape(t, b.addr)
	if m[`toron_redis_up`] != 1 || m[`toron_ratelimit_backend_errors_total{route="/api"}`] != 0 {
		t.Errorf("redis_up %v, backend errors %v: want 1 and 0", m[`toron_redis_up`], m[`toron_ratelimit_backend_errors_total{route="/api"}`])
	}
	if v := m[`toron_rejected_total{route="/api",reason="rate_limited"}`]; v != 1 {
		t.Errorf("rate_limited rejections = %v, want 1", v)
	}
}

// TestGlobalRateLimitRedisDown: a Redis that refuses connections; each on_error mode answers
// at once, counted.
func TestGlobalRateLimitRedisDown(t *testing.T) {
	dead := testnet.RefusedAddr(t)
	up := startUpstream(t, nil)
	server := "redis: {addrs: [\"" + dead + "\"], timeout: 20ms}\n"
	gw := startGateway(t, server,
		upstreamRoute("/deny", up.addr, "rate_limit: {requests_per_second: 100, scope: global, on_error: deny}")+
			upstreamRoute("/allow", up.addr, "rate_limit: {requests_per_second: 0.001, burst: 1, scope: global, on_error: allow}")+
			upstreamRoute("/local", up.addr, "rate_limit: {requests_per_second: 0.001, burst: 2, scope: global}"))
	c := dialRaw(t, gw.addr)
	t0 := time.Now()
	rr := getOn(t, c, "/deny/x", "")
	if rr.StatusCode != 429 || rr.Header.Get("Retry-After") != "1" || string(rr.body) != rateLimitedBody {
		t.Fatalf("deny with redis down: %d Retry-After %q %s, want 429 and 1", rr.StatusCode, rr.Header.Get("Retry-After"), rr.body)
	}
	for i := 0; i < 3; i++ {
		if rr := getOn(t, c, "/allow/x", ""); rr.StatusCode != 200 {
			t.Fatalf("allow with redis down, request %d: %d", i+1, rr.StatusCode)
		}
	}
	codes := []int{}
	for i := 0; i < 3; i++ {
		codes = append(codes, getOn(t, c, "/local/x", "").StatusCode)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("local fallback (burst 2) with redis down: %v, want 200 200 429", codes)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("7 requests took %s with redis down (timeout 20ms)", d)
	}
	m := scrape(t, gw.addr)
	if m[`toron_redis_up`] != 0 || m[`toron_ratelimit_backend_errors_total{route="/deny"}`] != 1 ||
		m[`toron_ratelimit_backend_errors_total{route="/allow"}`] != 3 || m[`toron_ratelimit_backend_errors_total{route="/local"}`] != 3 {
		t.Errorf("redis_up %v, backend errors deny %v allow %v local %v: want 0, 1, 3, 3", m[`toron_redis_up`],
			m[`toron_ratelimit_backend_errors_total{route="/deny"}`], m[`toron_ratelimit_backend_errors_total{route="/allow"}`],
			m[`toron_ratelimit_backend_errors_total{route="/local"}`])
	}
}

// TestGlobalRateLimitReload: a reload that keeps server.redis keeps the client; one that
// changes it builds a new client and closes the old one; one that removes it closes it.
func TestGlobalRateLimitReload(t *testing.T) {
	addr := redistest.Start(t).Addr
	up := startUpstream(t, nil)
	route := upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 5, scope: global}")
	server := "redis: {addrs: [\"" + addr + "\"]}\n"
	gw := startGateway(t, server, route)
	first := gw.g.snap.Load().redis
	if err := gw.g.Reload(loadConfig(t, server+"read_timeout: 7s\n", route)); err != nil {
		t.Fatal(err)
	}
	if gw.g.snap.Load().redis != first {
		t.Fatal("a reload that kept server.redis built a new client")
	}
	if err := gw.g.Reload(loadConfig(t, "redis: {addrs: [\""+addr+"\"], timeout: 50ms}\n", route)); err != nil {
		t.Fatal(err)
	}
	second := gw.g.snap.Load().redis
	if second == first || second.Timeout() != 50*time.Millisecond || !first.Closed() {
		t.Fatalf("changed server.redis: new client %v (timeout %s), old closed %v", second != first, second.Timeout(), first.Closed())
	}
	waitRedisUp(t, gw.g)
	if rr := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n"); rr.StatusCode != 200 {
		t.Fatalf("after the reload: %d", rr.StatusCode)
	}
	if err := gw.g.Reload(loadConfig(t, "", upstreamRoute("/api", up.addr, "rate_limit: {requests_per_second: 5}"))); err != nil {
		t.Fatal(err)
	}
	if gw.g.snap.Load().redis != nil || !second.Closed() {
		t.Fatal("removing server.redis left its client open")
	}
}

// TestGlobalRateLimitFrozenRedis: Redis stops answering (SIGSTOP) while clients keep calling a
// global route and another route. No request of the global route waits much longer than
// server.redis.timeout (on_error deny: 429, Retry-After 1), the other route does not notice, the
// failures are counted (toron_ratelimit_backend_errors_total, toron_redis_up 0), and the route
// is decided by Redis again soon after it runs again.
func TestGlobalRateLimitFrozenRedis(t *testing.T) {
	const timeout = 50 * time.Millisecond
	const slack = 300 * time.Millisecond // generous: a wait for a dial or a frozen reply is 1 s and more
	s := redistest.Start(t)
	addr := s.Addr
	up := startUpstream(t, nil)
	gw := startGateway(t, "redis: {addrs: [\""+addr+"\"], timeout: 50ms}\n",
		upstreamRoute("/g", up.addr, "rate_limit: {requests_per_second: 1000000, scope: global, on_error: deny}")+
			upstreamRoute("/plain", up.addr, ""))
	waitRedisUp(t, gw.g)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	get := func(path string) (int, string, time.Duration, error) {
		t0 := time.Now()
		resp, err := client.Get("http://" + gw.addr + path)
		if err != nil {
			return 0, "", 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(t0), nil
	}
	if !testnet.WaitUntil(5*time.Second, func() bool { code, _, _, _ := get("/g/x"); return code == 200 }) {
		t.Fatal("the global route is not decided by redis before the freeze")
	}
	s.Freeze()
	m0 := scrape(t, gw.addr)
	var mu sync.Mutex
	var slowest = map[string]time.Duration{}
	var wrong []string
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		path, want, ra := "/g/x", 429, "1"
		if i%3 == 0 {
			path, want, ra = "/plain/x", 200, ""
		}
		wg.Go(func() {
			for j := 0; j < 25; j++ {
				code, retry, d, err := get(path)
				mu.Lock()
				slowest[path] = max(slowest[path], d)
				if err != nil || code != want || retry != ra {
					wrong = append(wrong, path+": "+strconv.Itoa(code)+" Retry-After "+retry+" "+strconv.Quote(errString(err)))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("redis frozen: slowest /g %s (timeout %s), slowest /plain %s", slowest["/g/x"], timeout, slowest["/plain/x"])
	if len(wrong) > 0 {
		t.Fatalf("%d answers not as expected with redis frozen, first: %s", len(wrong), wrong[0])
	}
	// Relative to the other route's slowest request, which sees the same busy machine but no
	// Redis; that one is bounded well below what a held worker or a frozen reply would cost.
	if d, plain := slowest["/g/x"], slowest["/plain/x"]; d > timeout+slack+plain {
		t.Errorf("a request of the global route waited %s with redis frozen, timeout %s (the other route's slowest: %s)", d, timeout, plain)
	}
	if d := slowest["/plain/x"]; d > time.Second {
		t.Errorf("a request of the other route waited %s with redis frozen", d)
	}
	m := scrape(t, gw.addr)
	errKey := `toron_ratelimit_backend_errors_total{route="/g"}`
	if n := m[errKey] - m0[errKey]; m[`toron_redis_up`] != 0 || n != 8*25 {
		t.Errorf("redis_up %v, backend errors %v: want 0 and %d", m[`toron_redis_up`], n, 8*25)
	}
	s.Thaw()
	back := time.Now()
	if !testnet.WaitUntil(5*time.Second, func() bool { code, _, _, _ := get("/g/x"); return code == 200 }) {
		t.Fatal("the global route is not decided by redis within 5s of it running again")
	}
	t.Logf("decided by redis again %s after it ran again", time.Since(back))
	if m := scrape(t, gw.addr); m[`toron_redis_up`] != 1 {
		t.Errorf("redis_up %v after recovery, want 1", m[`toron_redis_up`])
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
