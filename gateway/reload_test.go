package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestReloadKeepsInflightAndBulkheads: a reload swaps the table atomically, in-flight requests
// finish on the route they started on, and a route that keeps its name keeps its bulkhead count.
func TestReloadKeepsInflightAndBulkheads(t *testing.T) {
	old, open := holdingUpstream(t, func(path string) bool { return strings.Contains(path, "hold") }, "old")
	next := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "new") })
	gw := startGateway(t, "", upstreamRoute("/a", old.addr, "name: reports\nmax_concurrency: 2"))

	results := make(chan string, 2)
	for i := 0; i < 2; i++ {
		go func() {
			_, b, _, err := getStatus(gw.addr, "/a/hold")
			if err != nil {
				b = err.Error()
			}
			results <- b
		}()
	}
	old.awaitInflight(2)

	cfg := loadConfig(t, "", upstreamRoute("/a", next.addr, "name: reports\nmax_concurrency: 2")+upstreamRoute("/b", next.addr, ""))
	if err := gw.g.Reload(cfg); err != nil {
		t.Fatalf("reload: %v", err)
	}
	// The bulkhead still holds the two in-flight requests of the old table.
	if s, b, _, _ := getStatus(gw.addr, "/a/x"); s != 503 {
		t.Errorf("after reload, full bulkhead answered %d %s; want 503", s, b)
	}
	if s, b, _, _ := getStatus(gw.addr, "/b/x"); s != 200 || b != "new" {
		t.Errorf("new route: %d %s", s, b)
	}
	open()
	for i := 0; i < 2; i++ {
		if b := <-results; b != "old" {
			t.Errorf("in-flight request answered %q, want it finished on its old route", b)
		}
	}
	if s, b, _, _ := getStatus(gw.addr, "/a/x"); s != 200 || b != "new" {
		t.Errorf("after the in-flight requests: %d %s", s, b)
	}
	m := scrape(t, gw.addr)
	if m["toron_config_reloads_total"] != 1 {
		t.Errorf("reloads %v", m["toron_config_reloads_total"])
	}
}

func TestReloadRefusesFixedKeys(t *testing.T) {
	gw, up := startProxied(t, "", "/a", nil)
	cfg := loadConfig(t, "worker_pool_size: 64\n", upstreamRoute("/b", up.addr, ""))
	err := gw.g.Reload(cfg)
	if err == nil || !strings.Contains(err.Error(), "worker_pool_size") {
		t.Fatalf("reload with a new worker_pool_size: %v", err)
	}
	if s, _, _, _ := getStatus(gw.addr, "/a/x"); s != 200 {
		t.Errorf("old configuration stopped serving: %d", s)
	}
	if s, _, _, _ := getStatus(gw.addr, "/b/x"); s != 404 {
		t.Errorf("refused configuration is serving: %d", s)
	}
	m := scrape(t, gw.addr)
	if m["toron_config_reload_errors_total"] != 1 || m["toron_config_reloads_total"] != 0 {
		t.Errorf("reload counters %v %v", m["toron_config_reloads_total"], m["toron_config_reload_errors_total"])
	}
}

// TestReloadChangesHeaderDeadline: the header and idle deadlines come from the configuration in
// force, so a reload changes them without a restart.
func TestReloadChangesHeaderDeadline(t *testing.T) {
	gw, up := startProxied(t, "read_timeout: 30s\n", "/", nil)
	cfg := loadConfig(t, "read_timeout: 1s\n", upstreamRoute("/", up.addr, ""))
	if err := gw.g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, gw.addr)
	start := time.Now()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n") // never finished
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, _ = io.ReadAll(c)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("unfinished headers cut after %v; the reloaded read_timeout is 1s", d)
	}
}
