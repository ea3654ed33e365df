package main

// The reference peers of the isolation scenario, nginx and HAProxy: their configurations from
// loadtest/peers/, filled for one run, and the started processes.

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

// nginxConf is loadtest/peers/nginx.conf, the nginx of scripts/compare.sh and
// scripts/slowloris.sh: the isolation scenario measures the same configuration.
//
//go:embed peers/nginx.conf
var nginxConf string

// reportsLimit is the limit_conn line of /legacy/reports in nginxConf; -bulkhead replaces its
// number.
var reportsLimit = regexp.MustCompile(`(?m)^(\s*limit_conn reports )\d+;`)

// nginxConfig fills nginxConf for one run: its prefix folder, its port, the upstream's
// host:port and the concurrency limit of /legacy/reports.
func nginxConfig(prefix string, port int, upstream string, bulkhead int) (string, error) {
	if n := len(reportsLimit.FindAllStringIndex(nginxConf, -1)); n != 1 {
		return "", fmt.Errorf("BUG: loadtest: peers/nginx.conf has %d `limit_conn reports N;` lines, want 1", n)
	}
	conf := reportsLimit.ReplaceAllString(nginxConf, "${1}"+strconv.Itoa(bulkhead)+";")
	return fillPlaceholders("peers/nginx.conf", conf, "@PREFIX@", prefix, "@PORT@", strconv.Itoa(port), "@UPSTREAM@", upstream)
}

// Nginx is a started nginx (master and one worker), the reference of the isolation scenario.
type Nginx struct {
	*process
	// Version is what `nginx -v` printed, such as "nginx/1.22.1".
	Version string
}

// findPeer resolves the binary of the reference proxy name (haproxy, nginx): a path, a name
// on PATH, or /usr/sbin/name (the Debian package's, which is not on a non-root PATH).
func findPeer(binary, name string) (string, error) {
	if p, err := exec.LookPath(binary); err == nil {
		return p, nil
	}
	if binary == name {
		if _, err := os.Stat("/usr/sbin/" + name); err == nil {
			return "/usr/sbin/" + name, nil
		}
	}
	return "", fmt.Errorf("loadtest: no %s at %q (install it with `bash scripts/install-bench-deps.sh`, or pass -%s)", name, binary, name)
}

// findPeerVersion is findPeer and the version the binary reports: parse reads it from what
// `bin -v` printed, and fallback stands when the command fails or parse finds none ("").
func findPeerVersion(binary, name, fallback string, parse func(out string) string) (bin, version string, err error) {
	bin, err = findPeer(binary, name)
	if err != nil {
		return "", "", err
	}
	version = fallback
	if out, err := exec.Command(bin, "-v").CombinedOutput(); err == nil {
		if v := parse(string(out)); v != "" {
			version = v
		}
	}
	return bin, version, nil
}

// fillPlaceholders replaces the placeholder, value pairs in conf, the configuration file
// (named for the error), and fails when a placeholder (an @) is left.
func fillPlaceholders(file, conf string, pairs ...string) (string, error) {
	conf = strings.NewReplacer(pairs...).Replace(conf)
	if strings.Contains(conf, "@") {
		return "", fmt.Errorf("BUG: loadtest: %s has a placeholder the loadtest does not fill", file)
	}
	return conf, nil
}

// StartNginx runs nginx in the foreground from a new temporary prefix (its pid file, error log
// and temp folders; the system configuration is never read) in front of upstream, and waits
// until /health answers 200. The filled configuration and nginx's output go to dir; once nginx
// has stopped (Stop, or the load test interrupted), its error log is copied there too and the
// prefix removed.
func StartNginx(binary, dir, upstream string, bulkhead int) (*Nginx, error) {
	bin, version, err := findPeerVersion(binary, "nginx", "nginx", func(out string) string {
		return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "nginx version:"))
	})
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	prefix, err := os.MkdirTemp("", "toron-loadtest-nginx.")
	if err != nil {
		return nil, fmt.Errorf("loadtest: cannot create nginx's prefix: %w", err)
	}
	// The worker runs as nobody when the load test runs as root (the `user` line).
	if err := os.Chmod(prefix, 0o755); err != nil {
		os.RemoveAll(prefix)
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	conf, err := nginxConfig(prefix, port, upstream, bulkhead)
	if err == nil {
		err = os.WriteFile(filepath.Join(prefix, "nginx.conf"), []byte(conf), 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644)
	}
	if err != nil {
		os.RemoveAll(prefix)
		return nil, fmt.Errorf("loadtest: cannot write nginx's configuration: %w", err)
	}
	cmd := exec.Command(bin, "-p", prefix, "-c", filepath.Join(prefix, "nginx.conf"), "-e", filepath.Join(prefix, "error.log"))
	// SIGTERM is nginx's fast stop (SIGQUIT would wait for the held slow calls when the load
	// test is interrupted); at the end of a run nothing is in flight.
	p, err := startProcess("nginx", cmd, port, filepath.Join(dir, "nginx.log"), syscall.SIGTERM)
	if err != nil {
		copyFile(filepath.Join(prefix, "error.log"), filepath.Join(dir, "error.log"))
		os.RemoveAll(prefix)
		return nil, err
	}
	p.afterExit = func() {
		copyFile(filepath.Join(prefix, "error.log"), filepath.Join(dir, "error.log"))
		os.RemoveAll(prefix)
	}
	return &Nginx{process: p, Version: version}, nil
}

// PeakRSSBytes is the VmHWM of the master and its worker, summed; 0 when unknown.
func (n *Nginx) PeakRSSBytes() int64 {
	return treeStatusBytes(n.PID(), "VmHWM:")
}

// copyFile copies a small file, best effort (a log kept for reading after the run).
func copyFile(from, to string) {
	if b, err := os.ReadFile(from); err == nil {
		_ = os.WriteFile(to, b, 0o644)
	}
}

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
	bin, version, err := findPeerVersion(binary, "haproxy", "HAProxy", func(out string) string {
		line, _, _ := strings.Cut(out, "\n")
		if f := strings.Fields(line); len(f) >= 3 {
			return f[0] + " " + strings.SplitN(f[2], "-", 2)[0]
		}
		return ""
	})
	if err != nil {
		return nil, err
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
