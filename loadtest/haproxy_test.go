package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestHAProxyConfigFillsEveryPlaceholder(t *testing.T) {
	conf, err := haproxyConfig(18777, "127.0.0.1:18776", 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"bind 127.0.0.1:18777",
		"server up 127.0.0.1:18776 maxconn 512",
		"server up 127.0.0.1:18776 maxconn 5 ",
		"{ be_conn(reports) ge 5 }",
		"hdr Retry-After 5",
		"deny_status 503",
		"use_backend reports if { path_beg /legacy/reports }",
		"nbthread 1",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("the filled haproxy.cfg lacks %q", want)
		}
	}
	if strings.Contains(conf, "ge 8 }") || strings.Contains(conf, "maxconn 8 ") {
		t.Error("-bulkhead 5 left a limit at 8")
	}
	if strings.Contains(conf, "@") {
		t.Error("a placeholder is left in the filled haproxy.cfg")
	}
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
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-q", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c refused the filled configuration: %v\n%s", err, out)
	}
}
