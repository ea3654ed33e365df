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

// peerTests is each reference peer as the tests fill its configuration and check it: want is
// what the configuration filled for -bulkhead 5 holds, stale the template's limit of 8 it must
// not hold any more, and check the peer's own check of a filled file.
var peerTests = []struct {
	peer, file  string
	fill        func(dir string, bulkhead int) (string, error)
	want, stale []string
	check       func(bin, dir, path string) *exec.Cmd
}{
	{
		peer: "nginx", file: "nginx.conf",
		fill: func(dir string, bulkhead int) (string, error) {
			return nginxConfig(dir, 18777, "127.0.0.1:18776", bulkhead)
		},
		want: []string{
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
		},
		stale: []string{"limit_conn reports 8;"},
		check: func(bin, dir, path string) *exec.Cmd {
			return exec.Command(bin, "-t", "-q", "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
		},
	},
	{
		peer: "haproxy", file: "haproxy.cfg",
		fill: func(_ string, bulkhead int) (string, error) {
			return haproxyConfig(18777, "127.0.0.1:18776", bulkhead)
		},
		want: []string{
			"bind 127.0.0.1:18777",
			"server up 127.0.0.1:18776 maxconn 512",
			"server up 127.0.0.1:18776 maxconn 5 ",
			"{ be_conn(reports) ge 5 }",
			"hdr Retry-After 5",
			"deny_status 503",
			"use_backend reports if { path_beg /legacy/reports }",
			"nbthread 1",
		},
		stale: []string{"ge 8 }", "maxconn 8 "},
		check: func(bin, _, path string) *exec.Cmd {
			return exec.Command(bin, "-c", "-q", "-f", path)
		},
	},
}

func TestPeerConfigFillsEveryPlaceholder(t *testing.T) {
	for _, tc := range peerTests {
		t.Run(tc.peer, func(t *testing.T) {
			conf, err := tc.fill("/tmp/prefix-x", 5)
			if err != nil {
				t.Fatal(err)
			}
			checkFilled(t, tc.file, conf, tc.want, tc.stale...)
		})
	}
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

// TestPeerConfigPassesCheck checks each peer's filled configuration with the peer's own check
// (`nginx -t`, `haproxy -c`), when the peer is installed (scripts/install-bench-deps.sh);
// nothing is started.
func TestPeerConfigPassesCheck(t *testing.T) {
	for _, tc := range peerTests {
		t.Run(tc.peer, func(t *testing.T) {
			bin, err := findPeer(tc.peer, tc.peer)
			if err != nil {
				t.Skip(tc.peer + " is not installed")
			}
			dir := t.TempDir()
			conf, err := tc.fill(dir, 8)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, tc.file)
			if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := tc.check(bin, dir, path).CombinedOutput(); err != nil {
				t.Fatalf("%s refused the filled configuration: %v\n%s", tc.peer, err, out)
			}
		})
	}
}

// TestK6ScriptsParse checks the syntax of every k6 script with node: k6 cannot be installed
// here, and its scripts are ES modules (import http from 'k6/http'), which node checks as
// such only with the .mjs extension. The imports are not resolved, only parsed.
func TestK6ScriptsParse(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: cannot check the k6 scripts")
	}
	scripts, err := filepath.Glob(filepath.Join("k6", "*.js"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range scripts {
		names = append(names, strings.TrimSuffix(filepath.Base(s), ".js"))
	}
	for _, want := range []string{"small-get", "upload", "isolation", "slow-client"} {
		if !slices.Contains(names, want) {
			t.Errorf("no k6 script for the %s scenario", want)
		}
	}
	dir := t.TempDir()
	for _, s := range scripts {
		src, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), "from 'k6/http'") {
			t.Errorf("%s does not import k6/http", s)
		}
		mjs := filepath.Join(dir, filepath.Base(s)+".mjs")
		if err := os.WriteFile(mjs, src, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(node, "--check", mjs).CombinedOutput(); err != nil {
			t.Errorf("%s: node --check: %v\n%s", s, err, out)
		}
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
