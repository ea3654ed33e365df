package main

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/redistest"
)

// TestGlobalRateLimitThreeProcesses: three Toron processes share one redis-server (SPEC 17,
// scope: global). Over T seconds one key is admitted at most R·T + B times in total, and at
// least 99% of it, whichever process each request reached.
func TestGlobalRateLimitThreeProcesses(t *testing.T) {
	redisAddr := redistest.Start(t).Addr
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {})

	const rate, burst = 50.0, 10.0
	routes := fmt.Sprintf("routes:\n%s    rate_limit: {requests_per_second: %v, burst: %v, key: \"header:X-Key\", scope: global}\n",
		upstreamRoute("/api", upAddr), rate, burst)
	var bases []string
	for range 3 {
		_, _, base := startGateway(t, fmt.Sprintf("  drain_delay: 0s\n  redis: {addrs: [%q], timeout: 500ms}\n", redisAddr), "  access: false\n", routes)
		bases = append(bases, base)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 5 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	get := func(base, key string) (int, error) {
		req, _ := http.NewRequest("GET", base+"/api/x", nil)
		req.Header.Set("X-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// Each process decides through Redis (toron_redis_up 1) before the measured window; the
	// warm-up keys are not the measured one.
	for i, base := range bases {
		deadline := time.Now().Add(15 * time.Second)
		for !redisUp(t, base) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d never reached redis", i)
			}
			_, _ = get(base, "warm-up")
			time.Sleep(20 * time.Millisecond)
		}
	}

	const errMetric = `toron_ratelimit_backend_errors_total{route="/api"}`
	var errsBefore []string
	for _, base := range bases {
		errsBefore = append(errsBefore, metricValue(t, base, errMetric))
	}
	var refused atomic.Int64
	var calls []func() (bool, error)
	for _, base := range bases {
		calls = append(calls, func() (bool, error) {
			code, err := get(base, "the-key")
			switch {
			case err != nil:
				return false, err
			case code == 429:
				refused.Add(1)
			case code != 200:
				return false, fmt.Errorf("status %d", code)
			}
			return code == 200, nil
		})
	}
	stopped, total, admitted, err := redistest.Drive(calls, 2*time.Second, 2*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three processes: %d refused", refused.Load())
	redistest.CheckAdmitted(t, admitted, rate, burst, stopped, total)
	for i, base := range bases {
		if v := metricValue(t, base, errMetric); v != errsBefore[i] {
			t.Errorf("process %d: backend errors %s after the window, %s before: a decision did not come from redis", i, v, errsBefore[i])
		}
	}
}

// redisUp reads toron_redis_up from a process's /metrics.
func redisUp(t *testing.T, base string) bool { return metricValue(t, base, "toron_redis_up") == "1" }
