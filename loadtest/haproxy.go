package main

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// haproxyConf is loadtest/peers/haproxy.cfg, the HAProxy of scripts/compare.sh: the isolation
// scenario measures the same configuration.
//
//go:embed peers/haproxy.cfg
var haproxyConf string

// haproxyReportsDeny and haproxyReportsMaxconn are the two numbers of the /legacy/reports
// bulkhead in haproxyConf; -bulkhead replaces them.
var (
	haproxyReportsDeny    = regexp.MustCompile(`(\{ be_conn\(reports\) ge )\d+( \})`)
	haproxyReportsMaxconn = regexp.MustCompile(`(?m)^(backend reports\n(?:\s.*\n)*?\s*server up @UPSTREAM@ maxconn )\d+`)
)

// haproxyConfig fills haproxyConf for one run: its port, the upstream's host:port and the
// concurrency limit of /legacy/reports.
func haproxyConfig(port int, upstream string, bulkhead int) (string, error) {
	if n := len(haproxyReportsDeny.FindAllStringIndex(haproxyConf, -1)); n != 1 {
		return "", fmt.Errorf("BUG: loadtest: peers/haproxy.cfg has %d `be_conn(reports) ge N` conditions, want 1", n)
	}
	if n := len(haproxyReportsMaxconn.FindAllStringIndex(haproxyConf, -1)); n != 1 {
		return "", fmt.Errorf("BUG: loadtest: peers/haproxy.cfg has %d reports servers with a maxconn, want 1", n)
	}
	b := strconv.Itoa(bulkhead)
	conf := haproxyReportsDeny.ReplaceAllString(haproxyConf, "${1}"+b+"${2}")
	conf = haproxyReportsMaxconn.ReplaceAllString(conf, "${1}"+b)
	return fillPlaceholders("peers/haproxy.cfg", conf, "@PORT@", strconv.Itoa(port), "@UPSTREAM@", upstream)
}

// HAProxy is a started HAProxy (one process, one thread), a reference of the isolation scenario.
type HAProxy struct {
	*process
	// Version is the first line `haproxy -v` printed, shortened, such as "HAProxy 2.6.12".
	Version string
}

// StartHAProxy runs HAProxy in the foreground (-db) with the filled configuration written to dir,
// in front of upstream, and waits until /health answers 200. Its output goes to dir too.
func StartHAProxy(binary, dir, upstream string, bulkhead int) (*HAProxy, error) {
	bin, err := findPeer(binary, "haproxy")
	if err != nil {
		return nil, err
	}
	version := "HAProxy"
	if out, err := exec.Command(bin, "-v").CombinedOutput(); err == nil {
		line, _, _ := strings.Cut(string(out), "\n")
		if f := strings.Fields(line); len(f) >= 3 {
			version = f[0] + " " + strings.SplitN(f[2], "-", 2)[0]
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	conf, err := haproxyConfig(port, upstream, bulkhead)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("loadtest: cannot write HAProxy's configuration: %w", err)
	}
	// SIGUSR1 is HAProxy's soft stop (exit status 0; SIGTERM, its hard stop, dies of the signal).
	p, err := startProcess("haproxy", exec.Command(bin, "-db", "-f", path), port, filepath.Join(dir, "haproxy.log"), syscall.SIGUSR1)
	if err != nil {
		return nil, err
	}
	return &HAProxy{process: p, Version: version}, nil
}
