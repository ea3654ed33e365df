package demo

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestDemoRedis: with redis-server installed, the demo's own server answers on loopback, the
// routes gain /api/global with scope: global, the banner shows it with a curl line, and Close
// stops the process by PID and leaves no file behind.
func TestDemoRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed (make test installs it: scripts/need-redis.sh)")
		}
		t.Skip("redis-server is not installed")
	}
	u := startUpstreams(t)
	r, err := StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	u.Redis = r
	pid, dir := r.cmd.Process.Pid, r.dir
	if !r.answers() {
		t.Fatal("the demo's redis-server does not answer PING")
	}
	if y := string(u.RoutesYAML()); !strings.Contains(y, "prefix: /api/global\n    target: http://"+u.API+"\n    rate_limit: {requests_per_second: 1, burst: 3, scope: global}") {
		t.Errorf("routes lack the global route:\n%s", y)
	}
	if y := r.ServerYAML(); y != `  redis: {addrs: ["`+r.Addr+`"], timeout: 50ms}`+"\n" {
		t.Errorf("server YAML %q", y)
	}
	b := u.Banner("http://127.0.0.1:8080")
	_, port, _ := strings.Cut(r.Addr, ":")
	for _, s := range []string{"-w '%{http_code} ' http://127.0.0.1:8080/api/global/x", "redis-cli -p " + port + " --scan", "redis-server on " + r.Addr} {
		if !strings.Contains(b, s) {
			t.Errorf("banner lacks %q:\n%s", s, b)
		}
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("redis-server (pid %d) still runs after Close", pid)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the redis-server directory %s is left behind (%v)", dir, err)
	}
}

// TestDemoNoRedis: without redis-server, no global route, and the banner says how to get one.
func TestDemoNoRedis(t *testing.T) {
	u := startUpstreams(t)
	if strings.Contains(string(u.RoutesYAML()), "scope: global") {
		t.Error("a global route without the demo's redis-server")
	}
	if b := u.Banner("http://127.0.0.1:8080"); !strings.Contains(b, "sudo apt-get install redis-server") || strings.Contains(b, "/api/global/x") {
		t.Errorf("banner without redis:\n%s", b)
	}
}
