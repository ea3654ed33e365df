package main

import (
	"os/exec"
	"testing"
)

func TestHAProxyConfigFillsEveryPlaceholder(t *testing.T) {
	conf, err := haproxyConfig(18777, "127.0.0.1:18776", 5)
	if err != nil {
		t.Fatal(err)
	}
	checkFilled(t, "haproxy.cfg", conf, []string{
		"bind 127.0.0.1:18777",
		"server up 127.0.0.1:18776 maxconn 512",
		"server up 127.0.0.1:18776 maxconn 5 ",
		"{ be_conn(reports) ge 5 }",
		"hdr Retry-After 5",
		"deny_status 503",
		"use_backend reports if { path_beg /legacy/reports }",
		"nbthread 1",
	}, "ge 8 }", "maxconn 8 ")
}

// TestHAProxyConfigPassesCheck checks the filled configuration with `haproxy -c`, when HAProxy
// is installed (scripts/install-bench-deps.sh); nothing is started.
func TestHAProxyConfigPassesCheck(t *testing.T) {
	bin, err := findPeer("haproxy", "haproxy")
	if err != nil {
		t.Skip("haproxy is not installed")
	}
	conf, err := haproxyConfig(18777, "127.0.0.1:18776", 8)
	if err != nil {
		t.Fatal(err)
	}
	path := writeConf(t, t.TempDir(), "haproxy.cfg", conf)
	if out, err := exec.Command(bin, "-c", "-q", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c refused the filled configuration: %v\n%s", err, out)
	}
}
