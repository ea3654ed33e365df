package demo

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The demo's global rate limit (SPEC 17, scope: global): when redis-server is on PATH, the demo
// starts its own on a free loopback port, without persistence (--save "" --appendonly no) and in
// a temporary directory removed at exit, points server.redis at it and adds /api/global, a route
// whose buckets live in that Redis. Without redis-server the rest of the demo runs as before and
// the banner says how to get one.

// redisStartTimeout bounds the wait for the demo's redis-server to answer PING.
const redisStartTimeout = 5 * time.Second

// redisDemoTimeout is the demo's server.redis.timeout: above the default 10ms, so that a laptop
// busy with other work still sees decisions from Redis.
const redisDemoTimeout = 50 * time.Millisecond

// ErrNoRedisServer is the error of StartRedis when redis-server is not on PATH.
var ErrNoRedisServer = errors.New("demo: redis-server is not installed")

// Redis is the demo's own redis-server process.
type Redis struct {
	// Addr is its "127.0.0.1:port".
	Addr string
	cmd  *exec.Cmd
	dir  string
}

// StartRedis starts redis-server on a free 127.0.0.1 port and waits until it answers; it returns
// ErrNoRedisServer when redis-server is not on PATH.
func StartRedis() (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedisServer
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: cannot find a free port for redis-server: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "toron-demo-redis-")
	if err != nil {
		return nil, fmt.Errorf("demo: redis-server directory: %w", err)
	}
	r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
	r.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--dir", dir, "--logfile", "", "--loglevel", "warning")
	r.cmd.Dir = dir
	// The demo's Redis dies with the demo, even one killed with SIGKILL that cannot close it
	// (Linux's parent-death signal; Go's threads live as long as the process here, as no
	// goroutine of Toron locks one).
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("demo: start redis-server: %w", err)
	}
	deadline := time.Now().Add(redisStartTimeout)
	for !r.answers() {
		if time.Now().After(deadline) {
			_ = r.Close()
			return nil, fmt.Errorf("demo: redis-server on %s does not answer within %s", r.Addr, redisStartTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r, nil
}

// answers reports whether the server answers PING.
func (r *Redis) answers() bool {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// Close stops the server by its PID, waits for it and removes its directory. Safe on nil.
func (r *Redis) Close() error {
	if r == nil || r.cmd == nil {
		return nil
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	_ = r.cmd.Wait()
	r.cmd = nil
	return os.RemoveAll(r.dir)
}

// ServerYAML is the server block's redis entry for this server, indented under "server:".
func (r *Redis) ServerYAML() string {
	return fmt.Sprintf("  redis: {addrs: [%q], timeout: %s}\n", r.Addr, redisDemoTimeout)
}

// globalRoutesTemplate adds the route limited in Redis; %[1]s is the api upstream.
const globalRoutesTemplate = `
  # A rate limit shared by every Toron pointed at the same Redis (SPEC 17, scope: global): 1
  # request per second per client IP, bursts of 3, decided in the demo's own redis-server.
  - type: upstream
    prefix: /api/global
    target: http://%[1]s
    rate_limit: {requests_per_second: 1, burst: 3, scope: global}
`

// globalBannerTemplate is the banner's part when the demo runs its redis-server; %[1]s is the
// gateway URL, %[2]s the server's address, %[3]s its port.
const globalBannerTemplate = `
Global rate limit (SPEC 17, scope: global), in the demo's own redis-server on %[2]s (no persistence,
stopped at exit):
  /api/global  -> api  1 request/s per client IP, bursts of 3, the bucket kept in Redis: every Toron
                       pointed at this Redis shares it; if Redis gives no answer within 50ms,
                       the route's local bucket decides (on_error: local)
  # 5 quick calls give 200 200 200 429 429
  for i in 1 2 3 4 5; do curl -s -o /dev/null -w '%%{http_code} ' %[1]s/api/global/x; done; echo
  # the bucket in Redis: a hash of the client, never its address, expiring when full again
  redis-cli -p %[3]s --scan --pattern 'toron:rl:*'
  curl -s %[1]s/metrics | grep -E 'toron_redis_up|toron_ratelimit_backend_errors_total'
`

// noRedisBanner is the banner's part when redis-server is missing.
const noRedisBanner = `
Global rate limit (SPEC 17, scope: global): not shown, redis-server is not installed. Install it
(sudo apt-get install redis-server, or bash scripts/need-redis.sh) and run the demo again: it
starts its own redis-server on a free loopback port and adds /api/global, limited in Redis.
`

// globalRoutesYAML is the route of the global limit, or nothing without the demo's Redis.
func (u *Upstreams) globalRoutesYAML() []byte {
	if u.Redis == nil {
		return nil
	}
	return fmt.Appendf(nil, globalRoutesTemplate, u.API)
}

// redisBanner is the banner's part about the global limit, given the gateway's base URL.
func (u *Upstreams) redisBanner(base string) string {
	if u.Redis == nil {
		return noRedisBanner
	}
	_, port, _ := net.SplitHostPort(u.Redis.Addr)
	return fmt.Sprintf(globalBannerTemplate, base, u.Redis.Addr, port)
}
