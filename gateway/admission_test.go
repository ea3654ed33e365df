package gateway

import (
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"toron/internal/testnet"
)

// slowHandler holds each request until release is closed (or the request's delay passes).
func slowHandler(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		d, _ := time.ParseDuration(r.URL.Query().Get("delay"))
		if d == 0 {
			d = time.Minute
		}
		select {
		case <-release:
		case <-time.After(d):
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "ok")
	}
}

func TestBulkheadBurstNeverExceeded(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, slowHandler(release))
	gw := startGateway(t, "", upstreamRoute("/legacy", up.addr, "max_concurrency: 8"))

	const burst = 200
	type res struct {
		status int
		body   string
		hdr    http.Header
		err    error
	}
	results := make(chan res, burst)
	var wg sync.WaitGroup
	for i := 0; i < burst; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, b, h, err := getStatus(gw.addr, "/legacy/report?delay=3s")
			results <- res{s, b, h, err}
		}()
	}
	// Let the burst arrive, then check what reached the upstream while it is held.
	up.awaitInflight(8)
	time.Sleep(300 * time.Millisecond)
	if n := gw.g.stats.get("/legacy").bulkhead.InFlight(); n != 8 {
		t.Errorf("route in flight %d, want 8", n)
	}
	close(release)
	wg.Wait()
	close(results)
	var ok, rejected int
	for r := range results {
		switch {
		case r.err != nil:
			t.Errorf("request error: %v", r.err)
		case r.status == 200:
			ok++
		case r.status == 503:
			rejected++
			if r.body != `{"error":"503 Service Unavailable: Route concurrency limit reached"}` || r.hdr.Get("Retry-After") != "5" {
				t.Errorf("503 body %s, Retry-After %q", r.body, r.hdr.Get("Retry-After"))
			}
		default:
			t.Errorf("unexpected status %d %s", r.status, r.body)
		}
	}
	if m := up.maxSeen.Load(); m > 8 {
		t.Errorf("upstream saw %d concurrent requests, bulkhead is 8", m)
	}
	if ok < 8 || ok+rejected != burst {
		t.Errorf("%d ok, %d rejected", ok, rejected)
	}
	waitIdle(t, gw.g)
}

// waitIdle waits until every in-flight gauge of the gateway is back to 0.
func waitIdle(t *testing.T, g *Gateway) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy, budget := g.workers.Busy(), g.budget.InFlight()
		var routes []string
		g.stats.mu.Lock()
		for name, s := range g.stats.byName {
			if n := s.bulkhead.InFlight(); n != 0 {
				routes = append(routes, fmt.Sprintf("%s=%d", name, n))
			}
		}
		g.stats.mu.Unlock()
		if busy == 0 && budget == 0 && len(routes) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not idle: workers %d, elevated %d, routes %v", busy, budget, routes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestElevatedBudgetShared(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, slowHandler(release))
	// worker_pool_size 16 and elevated_share 0.25: a budget of 4 for two elevated routes of 4.
	gw := startGateway(t, "worker_pool_size: 16\nelevated_share: 0.25\n",
		upstreamRoute("/a", up.addr, "max_concurrency: 4\nresponse_header_timeout: 60s")+
			upstreamRoute("/b", up.addr, "max_concurrency: 4\nresponse_header_timeout: 60s")+
			upstreamRoute("/api", up.addr, ""))
	var wg sync.WaitGroup
	statuses := make(chan int, 12)
	for i := 0; i < 12; i++ {
		path := "/a/x"
		if i%2 == 1 {
			path = "/b/x"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, _, _ := getStatus(gw.addr, path)
			statuses <- s
		}()
	}
	up.awaitInflight(4)
	time.Sleep(300 * time.Millisecond)
	if n := up.inflight.Load(); n != 4 {
		t.Errorf("elevated routes hold %d upstream requests together, budget is 4", n)
	}
	if n := gw.g.budget.InFlight(); n != 4 {
		t.Errorf("elevated in flight %d", n)
	}
	// A request to an elevated route whose own bulkhead has room gets the budget's 503: the
	// route text, Retry-After, and the elevated_budget reason (not concurrency).
	route := "/a"
	if gw.g.stats.get("/a").bulkhead.InFlight() >= 4 {
		route = "/b"
	}
	metric := `toron_rejected_total{route="` + route + `",reason="elevated_budget"}`
	before := scrape(t, gw.addr)[metric]
	s, body, hdr, err := getStatus(gw.addr, route+"/over-budget")
	if err != nil || s != 503 || body != `{"error":"503 Service Unavailable: Route concurrency limit reached"}` || hdr.Get("Retry-After") != "5" {
		t.Errorf("over the elevated budget: %d %s Retry-After %q %v", s, body, hdr.Get("Retry-After"), err)
	}
	if after := scrape(t, gw.addr)[metric]; after != before+1 {
		t.Errorf("%s went from %v to %v, want one more", metric, before, after)
	}
	// A fast route is untouched by the elevated budget.
	if s, _, _, err := getStatus(gw.addr, "/api/fast?delay=1ms"); err != nil || s != 200 {
		t.Errorf("fast route while elevated budget is full: %d %v", s, err)
	}
	close(release)
	wg.Wait()
	close(statuses)
	var ok int
	for s := range statuses {
		if s == 200 {
			ok++
		} else if s != 503 {
			t.Errorf("status %d", s)
		}
	}
	if ok < 4 {
		t.Errorf("only %d elevated requests served", ok)
	}
	if m := up.maxSeen.Load(); m > 5 { // 4 elevated + the one fast request
		t.Errorf("upstream saw %d concurrent requests", m)
	}
	waitIdle(t, gw.g)
}

func TestWorkerPoolSaturatedWhileHealthAnswers(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, slowHandler(release))
	gw := startGateway(t, "worker_pool_size: 8\nworker_queue_timeout: 50ms\n", upstreamRoute("/api", up.addr, ""))
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _, _ = getStatus(gw.addr, "/api/slow")
		}()
	}
	up.awaitInflight(8)
	start := time.Now()
	s, body, hdr, err := getStatus(gw.addr, "/api/ninth")
	if err != nil || s != 503 || body != `{"error":"503 Service Unavailable: Worker pool saturated"}` || hdr.Get("Retry-After") != "5" {
		t.Errorf("ninth request: %d %s %v", s, body, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("pool 503 took %v", d)
	}
	for i := 0; i < 5; i++ {
		if s, body, _, err := getStatus(gw.addr, "/health"); err != nil || s != 200 || body != `{"status":"ok"}` {
			t.Errorf("health while pool saturated: %d %s %v", s, body, err)
		}
	}
	// A headers-only client declaring a body gets the pool's 503 without sending it, and the
	// connection closes.
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "POST /api/up HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
	resp := readRawResponse(t, c, "POST")
	c.Close()
	if resp.StatusCode != 503 || !resp.closed {
		t.Errorf("headers-only POST: %d closed=%v", resp.StatusCode, resp.closed)
	}
	close(release)
	wg.Wait()
	if n := up.maxSeen.Load(); n > 8 {
		t.Errorf("upstream saw %d", n)
	}
	waitIdle(t, gw.g)
}

func TestIdleConnectionsHoldNoWorker(t *testing.T) {
	gw, _ := startProxied(t, "worker_pool_size: 8\n", "/api", nil)
	// 500 keep-alive connections that made a request and went idle, and some that are still
	// sending their headers.
	for i := 0; i < 500; i++ {
		c := dialRaw(t, gw.addr)
		if i%5 == 0 {
			io.WriteString(c, "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Slow: ") // never finished
			continue
		}
		io.WriteString(c, "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")
		resp := readRawResponse(t, c, "GET")
		if resp.StatusCode != 200 {
			t.Fatalf("conn %d: %d", i, resp.StatusCode)
		}
	}
	if b := gw.g.workers.Busy(); b != 0 {
		t.Errorf("%d workers busy with idle connections", b)
	}
	s, _, _, err := getStatus(gw.addr, "/api/fresh")
	if err != nil || s != 200 {
		t.Fatalf("fresh client: %d %v", s, err)
	}
}

// TestSlotsReleasedUnderChaos: many requests with random client aborts and upstream failures
// leave every in-flight gauge at 0.
func TestSlotsReleasedUnderChaos(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("mode") {
		case "hang":
			time.Sleep(20 * time.Millisecond)
		case "abort":
			hj, _ := w.(http.Hijacker)
			c, _, err := hj.Hijack()
			if err == nil {
				c.Close()
			}
			return
		case "partial":
			w.Header().Set("Content-Length", "1000")
			io.WriteString(w, "short")
			hj, _ := w.(http.Hijacker)
			if c, buf, err := hj.Hijack(); err == nil {
				buf.Flush()
				c.Close()
			}
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, strings.Repeat("x", 100))
	})
	gw := startGateway(t, "worker_pool_size: 16\nworker_queue_timeout: 20ms\n",
		upstreamRoute("/api", up.addr, "max_concurrency: 6")+
			upstreamRoute("/legacy", up.addr, "max_concurrency: 4\nread_timeout: 10s"))
	modes := []string{"ok", "ok", "ok", "hang", "abort", "partial"}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			rng := rand.New(rand.NewSource(int64(i)))
			prefix := "/api"
			if rng.Intn(3) == 0 {
				prefix = "/legacy"
			}
			mode := modes[rng.Intn(len(modes))]
			c, err := net.Dial("tcp", gw.addr)
			if err != nil {
				return
			}
			defer c.Close()
			var req string
			if rng.Intn(2) == 0 {
				req = fmt.Sprintf("GET %s/x?mode=%s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", prefix, mode)
			} else {
				req = fmt.Sprintf("POST %s/x?mode=%s HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 20000\r\n\r\n%s", prefix, mode, strings.Repeat("b", 20000))
			}
			switch rng.Intn(4) {
			case 0: // abort mid-request
				io.WriteString(c, req[:rng.Intn(len(req))])
				return
			case 1: // abort right after sending
				io.WriteString(c, req)
				return
			}
			io.WriteString(c, req)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.Copy(io.Discard, c)
		}(i)
	}
	wg.Wait()
	waitIdle(t, gw.g)
}

// TestElevatedRouteKeepsMaxUpstreamConns: watched requests use one-connection clients, and
// max_upstream_conns still bounds them.
func TestElevatedRouteKeepsMaxUpstreamConns(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		io.WriteString(w, "ok")
	})
	gw := startGateway(t, "", upstreamRoute("/legacy", up.addr, "max_concurrency: 8\nmax_upstream_conns: 2\nresponse_header_timeout: 30s\nconnect_timeout: 10s"))
	var wg sync.WaitGroup
	statuses := make(chan int, 6)
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, _, _ := getStatus(gw.addr, "/legacy/r")
			statuses <- s
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != 200 {
			t.Errorf("status %d", s)
		}
	}
	if m := up.maxSeen.Load(); m > 2 {
		t.Errorf("upstream saw %d concurrent requests, max_upstream_conns is 2", m)
	}
	waitIdle(t, gw.g)
}

// TestElevatedRouteReusesUpstreamConns: watched requests keep their upstream connection alive
// between requests, and a request whose client left does not hand its aborted connection to
// the next one.
func TestElevatedRouteReusesUpstreamConns(t *testing.T) {
	up, _ := holdingUpstream(t, func(path string) bool { return path == "/legacy/slow" }, "ok")
	gw := startGateway(t, "", upstreamRoute("/legacy", up.addr, "max_concurrency: 4\nresponse_header_timeout: 30s"))
	for i := 0; i < 5; i++ {
		if s, _, _, err := getStatus(gw.addr, "/legacy/r"); s != 200 || err != nil {
			t.Fatalf("request %d: status %d, %v", i, s, err)
		}
	}
	if n := up.conns.Load(); n != 1 {
		t.Errorf("5 sequential requests on an elevated route used %d upstream connections, want 1 (keep-alive)", n)
	}

	// A client that leaves while the upstream works: its request is aborted...
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "GET /legacy/slow HTTP/1.1\r\nHost: a\r\n\r\n")
	up.awaitInflight(1)
	c.Close()
	bh := gw.g.stats.get("/legacy").bulkhead
	deadline := time.Now().Add(5 * time.Second)
	for bh.InFlight() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if bh.InFlight() != 0 {
		t.Fatalf("the abandoned request still holds the bulkhead")
	}
	// ...and the next request gets a working connection.
	if s, body, _, err := getStatus(gw.addr, "/legacy/r"); s != 200 || err != nil {
		t.Fatalf("after an abandoned request: status %d %q, %v", s, body, err)
	}
	waitIdle(t, gw.g)
}

// TestElevatedRouteDropsStaleUpstreamConns: an upstream that closes idle keep-alive connections
// sooner than upstream_idle_timeout does not turn the next POST on an elevated route into a
// 502: a lent connection that sat idle is checked, and redialled when the upstream closed it.
func TestElevatedRouteDropsStaleUpstreamConns(t *testing.T) {
	addr := testnet.ServeHTTP(t, &http.Server{IdleTimeout: 150 * time.Millisecond, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("slow") != "" {
			time.Sleep(200 * time.Millisecond)
		}
		io.WriteString(w, "ok")
	})})
	gw := startGateway(t, "", upstreamRoute("/legacy", addr, "max_concurrency: 4\nresponse_header_timeout: 30s"))
	// A burst lends four clients at once; afterwards each POST may get any of them.
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Go(func() { getStatus(gw.addr, "/legacy/x?slow=1") })
	}
	wg.Wait()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for i := 0; i < 6; i++ {
		time.Sleep(300 * time.Millisecond) // longer than the upstream's idle timeout
		resp, err := c.Post("http://"+gw.addr+"/legacy/x", "text/plain", strings.NewReader("hello"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("POST %d after the upstream closed its idle connection: %d %s", i+1, resp.StatusCode, body)
		}
	}
	waitIdle(t, gw.g)
}

// TestReloadRetiresWatchedConns: the upstream connection of a watched request that finishes
// after a reload changed its route's upstream settings is closed when it comes back, not kept
// by the old pool.
func TestReloadRetiresWatchedConns(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, slowHandler(release))
	route := upstreamRoute("/legacy", up.addr, "response_header_timeout: 30s")
	gw := startGateway(t, "", route)
	done := make(chan int)
	go func() { s, _, _, _ := getStatus(gw.addr, "/legacy/x"); done <- s }()
	bh := gw.g.stats.get("/legacy").bulkhead
	deadline := time.Now().Add(5 * time.Second)
	for bh.InFlight() < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	changed := upstreamRoute("/legacy", up.addr, "response_header_timeout: 31s")
	if err := gw.g.Reload(loadConfig(t, "", changed)); err != nil {
		t.Fatal(err)
	}
	release <- struct{}{}
	if s := <-done; s != 200 {
		t.Fatalf("status %d", s)
	}
	for up.closed.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if up.closed.Load() < 1 {
		t.Errorf("the old route's upstream connection stayed open after its request finished")
	}
	waitIdle(t, gw.g)
}

// TestReloadKeepsWarmConnections: a reload that keeps a route's target with the same settings
// keeps its pool, so its idle keep-alive connection carries the next request; a reload that
// changes them starts a new pool.
func TestReloadKeepsWarmConnections(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
	route := upstreamRoute("/", up.addr, "")
	gw := startGateway(t, "", route)
	get := func() {
		t.Helper()
		if s, _, _, _ := getStatus(gw.addr, "/x"); s != 200 {
			t.Fatalf("status %d", s)
		}
	}
	get()
	if err := gw.g.Reload(loadConfig(t, "", route)); err != nil {
		t.Fatal(err)
	}
	get()
	if n := up.conns.Load(); n != 1 {
		t.Errorf("%d upstream connections after an unchanged reload, want 1 (kept warm)", n)
	}
	if err := gw.g.Reload(loadConfig(t, "", upstreamRoute("/", up.addr, "connect_timeout: 2s"))); err != nil {
		t.Fatal(err)
	}
	get()
	if n := up.conns.Load(); n != 2 {
		t.Errorf("%d upstream connections after a reload that changed connect_timeout, want 2", n)
	}
}
