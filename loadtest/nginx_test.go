package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNginxConfigFillsEveryPlaceholder(t *testing.T) {
	conf, err := nginxConfig("/tmp/prefix-x", 18777, "127.0.0.1:18776", 5)
	if err != nil {
		t.Fatal(err)
	}
	checkFilled(t, "nginx.conf", conf, []string{
		"listen 127.0.0.1:18777;",
		"server 127.0.0.1:18776;",
		"pid /tmp/prefix-x/nginx.pid;",
		"limit_conn reports 5;",
		"limit_conn_zone $server_name zone=reports:1m;",
		"limit_conn_status 503;",
		"add_header Retry-After $retry_after_503 always;",
		`return 200 '{"status":"ok"}';`,
		"worker_processes 1;",
		"access_log off;",
		"client_max_body_size 4m;",
		"proxy_read_timeout 60s;",
		"send_timeout 30s;",
	}, "limit_conn reports 8;")
}

// checkFilled checks a peer's configuration filled for -bulkhead 5: it holds every line of want,
// none of stale (the template's limit of 8 left in place), and no @placeholder@.
func checkFilled(t *testing.T, name, conf string, want []string, stale ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(conf, w) {
			t.Errorf("the filled %s lacks %q", name, w)
		}
	}
	for _, s := range stale {
		if strings.Contains(conf, s) {
			t.Errorf("-bulkhead 5 left %q in the filled %s", s, name)
		}
	}
	if strings.Contains(conf, "@") {
		t.Errorf("a placeholder is left in the filled %s", name)
	}
}

// writeConf writes a filled configuration into dir and returns its path.
func writeConf(t *testing.T, dir, name, conf string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNginxConfigPassesNginxT checks the filled configuration with `nginx -t`, when nginx is
// installed (scripts/install-bench-deps.sh); nothing is started.
func TestNginxConfigPassesNginxT(t *testing.T) {
	bin, err := findPeer("nginx", "nginx")
	if err != nil {
		t.Skip("nginx is not installed")
	}
	prefix := t.TempDir()
	conf, err := nginxConfig(prefix, 18777, "127.0.0.1:18776", 8)
	if err != nil {
		t.Fatal(err)
	}
	path := writeConf(t, prefix, "nginx.conf", conf)
	out, err := exec.Command(bin, "-t", "-q", "-p", prefix, "-c", path, "-e", filepath.Join(prefix, "error.log")).CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t refused the filled configuration: %v\n%s", err, out)
	}
}

func TestChildPIDsFindsAChild(t *testing.T) {
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	if kids := childPIDs(os.Getpid()); !slices.Contains(kids, cmd.Process.Pid) {
		t.Fatalf("childPIDs(%d) = %v, lacks %d", os.Getpid(), kids, cmd.Process.Pid)
	}
}

func TestSlotsFreeAndRejectOnce(t *testing.T) {
	up := startUpstream(t)
	start := time.Now()
	if !slotsFree(up.URL(), 3) {
		t.Fatal("slotsFree: 3 calls to an upstream without a limit did not all get 200")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("slotsFree took %s, want about 100 ms", d)
	}
	if code, ra := rejectOnce(up.URL() + "/legacy/reports?delay=1ms"); code != http.StatusOK || ra != "" {
		t.Errorf("rejectOnce = %d, %q; want 200 without Retry-After", code, ra)
	}
	if code, _ := rejectOnce("http://127.0.0.1:1/"); code != 0 {
		t.Errorf("rejectOnce to a closed port = %d, want 0", code)
	}
}

func TestOtherCPU(t *testing.T) {
	from := cpuSample{busy: 1000, steal: 10, total: 4000, ours: 300}
	// 400 ticks of the machine passed: 200 busy, of which ours 150; 20 stolen.
	to := cpuSample{busy: 1200, steal: 30, total: 4400, ours: 450}
	other, steal := otherCPU(from, to)
	if other != 12.5 || steal != 5 {
		t.Errorf("otherCPU = %.2f%%, steal %.2f%%; want 12.5%%, 5%%", other, steal)
	}
	// Our processes' counters may run ahead of the machine's by a tick: never below 0.
	if other, _ := otherCPU(from, cpuSample{busy: 1010, total: 4100, ours: 320}); other != 0 {
		t.Errorf("otherCPU = %.2f%%, want 0", other)
	}
	if other, steal := otherCPU(from, from); other != 0 || steal != 0 {
		t.Errorf("otherCPU over no time = %.2f, %.2f; want 0, 0", other, steal)
	}
	s := sampleCPU()
	if s.total <= 0 || s.busy <= 0 {
		t.Errorf("sampleCPU() = %+v: no machine counters read from /proc/stat", s)
	}
}
