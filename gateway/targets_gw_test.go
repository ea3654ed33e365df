package gateway

import (
	"bufio"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Several targets behind one route (SPEC 13), through the whole request path.

// targetsRoute is a routes.yaml entry for prefix with several targets and extra keys.
func targetsRoute(prefix string, addrs []string, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "- type: upstream\n  prefix: %s\n  targets:\n", prefix)
	for _, a := range addrs {
		fmt.Fprintf(&b, "    - url: http://%s\n", a)
	}
	b.WriteString(indent(extra, "  "))
	return b.String()
}

// namedUpstream answers with its name.
func namedUpstream(t *testing.T, name string) *upstream {
	return startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, name)
	})
}

// bodiesSeen sends n GETs of path to addr and counts the answers by body (the target's name).
func bodiesSeen(addr, path string, n int) map[string]int {
	seen := map[string]int{}
	for range n {
		_, body, _, _ := getStatus(addr, path)
		seen[body]++
	}
	return seen
}

// TestRefusedTargetIsRetriedElsewhere: one target of three refuses connections; 60 requests
// all answer 200 (each refused dial is retried on another target), and it costs at most a few
// dials: round robin keeps feeding it its share until passive health ejects it; p2c samples
// its first failure as 1 s (SPEC 13) and stops choosing it after that one dial.
func TestRefusedTargetIsRetriedElsewhere(t *testing.T) {
	for _, balance := range []string{"round_robin", "p2c"} {
		t.Run(balance, func(t *testing.T) {
			a, b := namedUpstream(t, "a"), namedUpstream(t, "b")
			dead := refusedAddr(t)
			gw := startGateway(t, "", targetsRoute("/", []string{a.addr, dead, b.addr}, "balance: "+balance+"\n"))
			for i := 0; i < 60; i++ {
				s, body, _, err := getStatus(gw.addr, "/x")
				if err != nil || s != 200 || (body != "a" && body != "b") {
					t.Fatalf("request %d: %d %q %v", i, s, body, err)
				}
			}
			retries := metricLine(gw.g, `toron_upstream_retries_total{route="/"}`)
			if retries == "" || retries == "0" {
				t.Errorf("toron_upstream_retries_total = %q, want the refused dials counted", retries)
			}
			dials := metricLine(gw.g, fmt.Sprintf(`toron_upstream_requests_total{route="/",target=%q,code="502"}`, dead))
			switch balance {
			case "round_robin":
				if got := metricLine(gw.g, fmt.Sprintf(`toron_upstream_healthy{route="/",target=%q}`, dead)); got != "0" {
					t.Errorf("the refused target's healthy gauge = %q, want 0 (ejected)", got)
				}
			case "p2c":
				if n, _ := strconv.Atoi(dials); n < 1 || n > 3 {
					t.Errorf("p2c dialed the refused target %s times in 60 sequential requests, want 1 to 3", dials)
				}
			}
			waitIdle(t, gw.g)
		})
	}
}

// TestFailingTargetEjectedAndBack: a target that answers 503 is ejected after
// consecutive_failures and gets requests again after eject_time.
func TestFailingTargetEjectedAndBack(t *testing.T) {
	good := namedUpstream(t, "good")
	var failing atomic.Bool
	failing.Store(true)
	bad := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, "bad")
	})
	extra := "balance: round_robin\npassive_health:\n  consecutive_failures: 3\n  eject_time: 1s\n"
	gw := startGateway(t, "", targetsRoute("/", []string{good.addr, bad.addr}, extra))
	var fails int
	for i := 0; i < 20; i++ {
		if s, _, _, _ := getStatus(gw.addr, "/x"); s == 503 {
			fails++
		}
	}
	if fails != 3 {
		t.Errorf("%d answers were the failing target's 503, want exactly 3 before its ejection", fails)
	}
	if got := metricLine(gw.g, fmt.Sprintf(`toron_upstream_ejections_total{route="/",target=%q}`, bad.addr)); got != "1" {
		t.Errorf("ejections = %q, want 1", got)
	}
	failing.Store(false)
	time.Sleep(1200 * time.Millisecond)
	seen := bodiesSeen(gw.addr, "/x", 10)
	if seen["bad"] == 0 {
		t.Errorf("the target was not back after eject_time: %v", seen)
	}
}

// TestActiveChecksTakeTargetDownAndUp: with health_check set, a target whose check fails is
// taken out of the rotation and comes back when it passes again.
func TestActiveChecksTakeTargetDownAndUp(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	a := namedUpstream(t, "a")
	b := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hc" {
			if !healthy.Load() {
				w.WriteHeader(500)
			}
			return
		}
		io.WriteString(w, "b")
	})
	extra := "balance: round_robin\nhealth_check:\n  path: /hc\n  interval: 100ms\n  timeout: 1s\n  healthy_threshold: 1\n  unhealthy_threshold: 1\n"
	gw := startGateway(t, "", targetsRoute("/", []string{a.addr, b.addr}, extra))
	healthyGauge := fmt.Sprintf(`toron_upstream_healthy{route="/",target=%q}`, b.addr)
	waitMetric := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for metricLine(gw.g, healthyGauge) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s stayed %q, want %q", healthyGauge, metricLine(gw.g, healthyGauge), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	healthy.Store(false)
	waitMetric("0")
	for i := 0; i < 10; i++ {
		if _, body, _, _ := getStatus(gw.addr, "/x"); body != "a" {
			t.Fatalf("request %d reached %q, a target that is down", i, body)
		}
	}
	healthy.Store(true)
	waitMetric("1")
	seen := bodiesSeen(gw.addr, "/x", 10)
	if seen["b"] == 0 {
		t.Errorf("the target did not come back: %v", seen)
	}
	if r := b.lastRequest(); r == nil {
		t.Fatal("no request reached b")
	}
}

// TestStreamedPostNeverSentTwice: a target that resets the connection after 1 MiB of a streamed
// body is a 502; the request never reaches the other target (a byte of it was sent).
func TestStreamedPostNeverSentTwice(t *testing.T) {
	good := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	})
	resetter := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.CopyN(io.Discard, req.Body, 1<<20)
		resetConn(c)
	})
	// p2c would send some requests to the good target first; round robin starts with the
	// first target, the resetting one.
	gw := startGateway(t, "", targetsRoute("/", []string{resetter, good.addr}, "balance: round_robin\nmax_body_bytes: 8388608\n"))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 4194304\r\n\r\n")
	go func() {
		buf := make([]byte, 64<<10)
		for i := 0; i < 64; i++ {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	resp := readRawResponse(t, c, "POST")
	if resp.StatusCode != 502 {
		t.Fatalf("status %d %s, want 502", resp.StatusCode, resp.body)
	}
	time.Sleep(200 * time.Millisecond)
	if n := good.requests.Load(); n != 0 {
		t.Errorf("the other target received the request %d times: a body was sent twice", n)
	}
	waitIdle(t, gw.g)
}

// TestReloadKeepsHealthState: a target ejected before a reload that keeps the route's name and
// the target stays ejected after it.
func TestReloadKeepsHealthState(t *testing.T) {
	good := namedUpstream(t, "good")
	bad := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
	routes := targetsRoute("/", []string{good.addr, bad.addr}, "balance: round_robin\npassive_health:\n  consecutive_failures: 2\n  eject_time: 60s\n")
	gw := startGateway(t, "", routes)
	for i := 0; i < 6; i++ {
		getStatus(gw.addr, "/x")
	}
	gauge := fmt.Sprintf(`toron_upstream_healthy{route="/",target=%q}`, bad.addr)
	if got := metricLine(gw.g, gauge); got != "0" {
		t.Fatalf("%s = %q before the reload, want 0", gauge, got)
	}
	if err := gw.g.Reload(loadConfig(t, "", routes)); err != nil {
		t.Fatal(err)
	}
	if got := metricLine(gw.g, gauge); got != "0" {
		t.Errorf("%s = %q after the reload, want 0 (state kept)", gauge, got)
	}
	for i := 0; i < 6; i++ {
		if s, _, _, _ := getStatus(gw.addr, "/x"); s != 200 {
			t.Fatalf("request %d after the reload reached the ejected target: %d", i, s)
		}
	}
}

// TestGaugesBackToZeroUnderChaos: 10,000 requests over three targets that fail at random
// (503s, resets, refused while restarting is not needed: one target is refused throughout) and
// clients that abort at random; afterwards every in-flight gauge, bulkhead and worker is 0.
func TestGaugesBackToZeroUnderChaos(t *testing.T) {
	flaky := func(name string) *upstream {
		return startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			switch rand.Intn(10) {
			case 0:
				w.WriteHeader(503)
			case 1:
				if hj, ok := w.(http.Hijacker); ok {
					c, _, _ := hj.Hijack()
					c.Close()
					return
				}
			case 2:
				time.Sleep(2 * time.Millisecond)
			}
			io.WriteString(w, name)
		})
	}
	a, b := flaky("a"), flaky("b")
	dead := refusedAddr(t)
	gw := startGateway(t, "", targetsRoute("/", []string{a.addr, b.addr, dead}, "max_concurrency: 64\nretries: 2\npassive_health:\n  consecutive_failures: 3\n  eject_time: 1s\n"))
	const total, workers = 10000, 16
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for next.Add(1) <= total {
				if rand.Intn(20) == 0 {
					// A client that leaves as soon as its request is out.
					if conn, err := net.Dial("tcp", gw.addr); err == nil {
						io.WriteString(conn, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
						conn.Close()
					}
					continue
				}
				resp, err := c.Get("http://" + gw.addr + "/x")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	wg.Wait()
	waitIdle(t, gw.g)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, addr := range []string{a.addr, b.addr, dead} {
			name := fmt.Sprintf(`toron_upstream_inflight{route="/",target=%q}`, addr)
			if v := metricLine(gw.g, name); v != "0" {
				left = append(left, name+"="+v)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("in-flight gauges not back to 0: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAccessLogNamesTheTarget and per-target pools: the access line carries the target that
// served the request, and max_upstream_conns bounds each target's connections.
func TestMaxUpstreamConnsPerTarget(t *testing.T) {
	release := make(chan struct{})
	slow := func() *upstream {
		return startUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	}
	a, b := slow(), slow()
	gw := startGateway(t, "", targetsRoute("/", []string{a.addr, b.addr}, "balance: round_robin\nmax_upstream_conns: 1\nconnect_timeout: 5s\n"))
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); getStatus(gw.addr, "/x") }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.inflight.Load()+b.inflight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if a.maxSeen.Load() != 1 || b.maxSeen.Load() != 1 {
		t.Errorf("concurrent requests per target: a %d, b %d; want 1 each (max_upstream_conns per target)", a.maxSeen.Load(), b.maxSeen.Load())
	}
	close(release)
	wg.Wait()
}
