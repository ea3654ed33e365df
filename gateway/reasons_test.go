package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRejectReasonsCounted: the rejection reasons no other test looked at are counted under
// their SPEC 8 label, on the route they belong to: workers_saturated, header_too_large and
// upstream_timeout (elevated_budget: TestElevatedBudgetShared).
func TestRejectReasonsCounted(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/hold") || strings.HasPrefix(r.URL.Path, "/slow") {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	})
	defer close(release)
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
