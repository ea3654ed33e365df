package gateway

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// checkSeries reports every series of want that m lacks or holds with another value.
func checkSeries(t *testing.T, m, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		got, ok := m[k]
		if !ok {
			t.Errorf("missing series %s", k)
			continue
		}
		if got != v {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
}

// scrape returns /metrics as a map from series (name{labels}) to value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := make(map[string]float64)
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad metrics line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func TestMetricsAfterScriptedMix(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/api/teapot" {
			w.WriteHeader(418)
		}
		_, _ = w.Write(b)
	})
	refused := refusedAddr(t)
	gw := startGateway(t, "", upstreamRoute("/api", up.addr, "max_body_bytes: 1000")+upstreamRoute("/down", refused, ""))

	for i := 0; i < 3; i++ {
		rawRequest(t, gw.addr, "GET /api/a HTTP/1.1\r\nHost: a\r\n\r\n")
	}
	rawRequest(t, gw.addr, "POST /api/a HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789")
	rawRequest(t, gw.addr, "GET /api/teapot HTTP/1.1\r\nHost: a\r\n\r\n")
	rawRequest(t, gw.addr, "POST /api/a HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n")
	rawRequest(t, gw.addr, "GET /nowhere HTTP/1.1\r\nHost: a\r\n\r\n")
	rawRequest(t, gw.addr, "GET /nowhere HTTP/1.1\r\nHost: a\r\n\r\n")
	rawRequest(t, gw.addr, "GET /down HTTP/1.1\r\nHost: a\r\n\r\n")
	rawRequest(t, gw.addr, "POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx")
	rawRequest(t, gw.addr, "GET /health HTTP/1.1\r\nHost: a\r\n\r\n")

	m := scrape(t, gw.addr)
	want := map[string]float64{
		`toron_requests_total{route="/api",code="200"}`:               4,
		`toron_requests_total{route="/api",code="418"}`:               1,
		`toron_requests_total{route="/api",code="413"}`:               1,
		`toron_requests_total{route="none",code="404"}`:               2,
		`toron_requests_total{route="none",code="400"}`:               1,
		`toron_requests_total{route="/down",code="502"}`:              1,
		`toron_rejected_total{route="/api",reason="body_too_large"}`:  1,
		`toron_rejected_total{route="none",reason="no_route"}`:        2,
		`toron_rejected_total{route="none",reason="bad_request"}`:     1,
		`toron_rejected_total{route="/down",reason="upstream_error"}`: 1,
		`toron_rejected_total{route="/api",reason="concurrency"}`:     0,
		`toron_request_body_bytes_total{route="/api"}`:                10,
		`toron_response_body_bytes_total{route="/api"}`:               10 + int64f(len(`{"error":"413 Payload Too Large: request Content-Length exceeds effective route limit"}`)),
		`toron_route_inflight{route="/api"}`:                          0,
		`toron_route_max_concurrency{route="/api"}`:                   0,
		`toron_workers_busy`:                                          0,
		`toron_workers_max`:                                           128,
		`toron_elevated_inflight`:                                     0,
		`toron_upstream_header_wait_seconds_count{route="/api"}`:      5,
		`toron_request_duration_seconds_count{route="/api"}`:          6,
		`toron_config_reloads_total`:                                  0,
		`toron_config_reload_errors_total`:                            0,
	}
	checkSeries(t, m, want)
	if m["toron_connections_open"] < 1 {
		t.Errorf("toron_connections_open = %v while scraping", m["toron_connections_open"])
	}
	bucket := regexp.MustCompile(`^toron_upstream_header_wait_seconds_bucket\{route="/api",le="[^"]+"\}$`)
	found := false
	for k := range m {
		if bucket.MatchString(k) {
			found = true
		}
	}
	if !found {
		t.Errorf("no le buckets for the upstream header wait histogram")
	}
}

func int64f(n int) float64 { return float64(n) }

// TestNoHeaderWaitForAnAbandonedBody: a streamed upload the client abandons never waited for
// the upstream's headers; it must not enter toron_upstream_header_wait_seconds as one.
func TestNoHeaderWaitForAnAbandonedBody(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, "", upstreamRoute("/up", up.addr, "max_body_bytes: 64MiB"))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 10000000\r\n\r\n")
	io.WriteString(c, strings.Repeat("x", 300<<10))
	time.Sleep(300 * time.Millisecond) // the body is streaming upstream
	c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for scrape(t, gw.addr)[`toron_requests_total{route="/up",code="499"}`] != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned upload was not counted as 499")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := scrape(t, gw.addr)[`toron_upstream_header_wait_seconds_count{route="/up"}`]; n != 0 {
		t.Errorf("header wait recorded %v times for an upload whose body never ended", n)
	}
}

// TestRejectReasonsCounted: the rejection reasons no other test looked at are counted under
// their SPEC 8 label, on the route they belong to: workers_saturated, header_too_large and
// upstream_timeout (elevated_budget: TestElevatedBudgetShared).
func TestRejectReasonsCounted(t *testing.T) {
	up, _ := holdingUpstream(t, func(path string) bool {
		return strings.HasPrefix(path, "/hold") || strings.HasPrefix(path, "/slow")
	}, "")
	gw := startGateway(t, "worker_pool_size: 1\nworker_queue_timeout: 0s\nmax_header_bytes: 4096\n",
		upstreamRoute("/hold", up.addr, "")+upstreamRoute("/slow", up.addr, "response_header_timeout: 200ms")+upstreamRoute("/fast", up.addr, ""))

	// upstream_timeout: the one worker is free; the upstream never answers within 200 ms.
	s, body, _, err := getStatus(gw.addr, "/slow/x")
	if err != nil || s != 504 || body != `{"error":"504 Gateway Timeout: Upstream response header timeout expired"}` {
		t.Errorf("upstream timeout: %d %s %v", s, body, err)
	}
	// header_too_large: before any route is known.
	if resp := rawRequest(t, gw.addr, "GET /fast HTTP/1.1\r\nHost: a\r\nX-Big: "+strings.Repeat("b", 5000)+"\r\n\r\n"); resp.StatusCode != 431 {
		t.Errorf("header too large: %d %s", resp.StatusCode, resp.body)
	}
	// workers_saturated: one request holds the only worker.
	go func() { _, _, _, _ = getStatus(gw.addr, "/hold/x") }()
	deadline := time.Now().Add(5 * time.Second)
	for gw.g.workers.Busy() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s, body, hdr, err := getStatus(gw.addr, "/fast/x"); err != nil || s != 503 || body != `{"error":"503 Service Unavailable: Worker pool saturated"}` || hdr.Get("Retry-After") != "5" {
		t.Errorf("workers saturated: %d %s %v", s, body, err)
	}

	checkSeries(t, scrape(t, gw.addr), map[string]float64{
		`toron_rejected_total{route="/slow",reason="upstream_timeout"}`:  1,
		`toron_rejected_total{route="none",reason="header_too_large"}`:   1,
		`toron_rejected_total{route="/fast",reason="workers_saturated"}`: 1,
		`toron_requests_total{route="/slow",code="504"}`:                 1,
		`toron_requests_total{route="none",code="431"}`:                  1,
		`toron_requests_total{route="/fast",code="503"}`:                 1,
	})
}
