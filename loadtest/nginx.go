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
	bin, err := findPeer(binary, "nginx")
	if err != nil {
		return nil, err
	}
	version := "nginx"
	if out, err := exec.Command(bin, "-v").CombinedOutput(); err == nil {
		version = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "nginx version:"))
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
	sum := procStatusBytes(n.PID(), "VmHWM:")
	for _, pid := range childPIDs(n.PID()) {
		sum += procStatusBytes(pid, "VmHWM:")
	}
	return sum
}

// copyFile copies a small file, best effort (a log kept for reading after the run).
func copyFile(from, to string) {
	if b, err := os.ReadFile(from); err == nil {
		_ = os.WriteFile(to, b, 0o644)
	}
}
