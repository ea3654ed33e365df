package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// TestGlobalRateLimitThreeProcesses: three Toron processes share one redis-server (SPEC 17,
// scope: global). Over T seconds one key is admitted at most R·T + B times in total, and at
// least 99% of it, whichever process each request reached.
func TestGlobalRateLimitThreeProcesses(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed (make test installs it: scripts/need-redis.sh)")
		}
		t.Skip("redis-server is not installed: run `make test` or apt-get install redis-server")
	}
	rport := testnet.FreePort(t)
	redis := exec.Command(bin, "--port", strconv.Itoa(rport), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--dir", t.TempDir())
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = redis.Process.Signal(syscall.SIGKILL)
		_ = redis.Wait()
	})
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {})

	const rate, burst = 50.0, 10.0
	dir := t.TempDir()
	routes := writeFile(t, dir, "routes.yaml", fmt.Sprintf("routes:\n  - type: upstream\n    prefix: /api\n    target: http://%s\n"+
		"    rate_limit: {requests_per_second: %v, burst: %v, key: \"header:X-Key\", scope: global}\n", upAddr, rate, burst))
	var bases []string
	for i := 0; i < 3; i++ {
		port := testnet.FreePort(t)
		cfg := writeFile(t, dir, fmt.Sprintf("config%d.yaml", i), fmt.Sprintf(
			"server:\n  host: 127.0.0.1\n  port: %d\n  drain_delay: 0s\n  redis: {addrs: [\"127.0.0.1:%d\"], timeout: 500ms}\nlog:\n  access: false\n", port, rport))
		_, _, base := startBinary(t, cfg, routes, port)
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
	var admitted, refused atomic.Int64
	errs := make(chan error, 6)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, base := range bases {
		for j := 0; j < 2; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					code, err := get(base, "the-key")
					switch {
					case err != nil:
						errs <- err
						return
					case code == 200:
						admitted.Add(1)
					case code == 429:
						refused.Add(1)
					default:
						errs <- fmt.Errorf("status %d", code)
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
	}
	time.Sleep(2 * time.Second)
	stopped := time.Since(start).Seconds()
	close(stop)
	wg.Wait()
	T := time.Since(start).Seconds()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := float64(admitted.Load())
	upper := rate*T + burst
	// The lower bound counts the window before the stop, less 100 ms for the first round trip
	// and a busy machine's scheduling (5 tokens at R = 50).
	lower := 0.99 * (rate*(stopped-0.1) + burst)
	t.Logf("three processes: %v admitted, %d refused over %.3fs; R·T+B = %.1f", got, refused.Load(), T, upper)
	if got > upper || got < lower {
		t.Fatalf("admitted %v over %.3fs, want within [%.1f, %.1f]", got, T, lower, upper)
	}
	for i, base := range bases {
		if v := metricValue(t, base, errMetric); v != errsBefore[i] {
			t.Errorf("process %d: backend errors %s after the window, %s before: a decision did not come from redis", i, v, errsBefore[i])
		}
	}
}

// redisUp reads toron_redis_up from a process's /metrics.
func redisUp(t *testing.T, base string) bool { return metricValue(t, base, "toron_redis_up") == "1" }
