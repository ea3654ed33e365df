package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
