// Package redistest runs real redis-server processes (Debian's package, installed by
// scripts/need-redis.sh from `make test`) for the tests of the global rate limits: on free
// loopback ports, each in a temporary directory with persistence off, plain or TLS-only, alone
// or as a cluster, stopped by PID when the test ends. No mock stands in for Redis. Tests import
// it; no production code does.
package redistest

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// Server is one redis-server process started by a test.
type Server struct {
	// Addr is the server's 127.0.0.1:Port; Dir its working directory.
	Addr string
	Port int
	Dir  string
	// Out collects the process's output (of its latest start).
	Out *testnet.Buffer
	// TLS is the client configuration trusting the server's certificate (StartTLS); nil for a
	// plain server.
	TLS *tls.Config

	t    testing.TB
	bin  string
	args []string
	cmd  *exec.Cmd
}

// Need returns the path of redis-server. It skips the test when redis-server is not installed
// (outside make test), or fails it under CI=true, where a missing server is a broken set-up
// rather than a reason to skip.
func Need(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not installed (make test installs it: scripts/need-redis.sh)")
		}
		t.Skip("redis-server is not installed: run `make test` (scripts/need-redis.sh installs it) or apt-get install redis-server")
	}
	return bin
}

// newServer prepares a server on a free loopback port; listen are the arguments that open its
// port (plain or TLS).
func newServer(t testing.TB, listen func(port int) []string, extra []string) *Server {
	t.Helper()
	port := testnet.FreePort(t)
	s := &Server{t: t, bin: Need(t), Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), Dir: t.TempDir()}
	s.args = append(append(listen(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--dir", s.Dir, "--logfile", ""), extra...)
	return s
}

// Start starts a redis-server on a free loopback port with extra arguments and waits until it
// answers PING. The server is stopped when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return startFree(t, func(port int) []string { return []string{"--port", strconv.Itoa(port)} }, nil, extra)
}

// StartTLS starts a redis-server whose only port speaks TLS (--port 0 --tls-port N), with a
// certificate for 127.0.0.1 from a CA made for the test and client certificates not required;
// s.TLS trusts it. It skips when this redis-server was built without TLS.
func StartTLS(t testing.TB, extra ...string) *Server {
	t.Helper()
	ca := testnet.NewCA(t)
	_, certFile, keyFile := ca.IssueFiles(t, "redis", "127.0.0.1")
	return startFree(t, func(port int) []string {
		return []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile,
			"--tls-key-file", keyFile, "--tls-ca-cert-file", ca.CAFile, "--tls-auth-clients", "no"}
	}, &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, extra)
}

// startFree starts a server on a free port. The port is free when it is drawn, but another
// process (a test's outgoing connection takes its port from the same ephemeral range) may bind
// it before redis-server does: then it is drawn again, a few times.
func startFree(t testing.TB, listen func(port int) []string, tlsConf *tls.Config, extra []string) *Server {
	t.Helper()
	for attempt := 1; ; attempt++ {
		s := newServer(t, listen, extra)
		s.TLS = tlsConf
		if s.start(attempt < 5) {
			t.Cleanup(s.Stop)
			return s
		}
	}
}

// start starts the process and waits until it answers PING. It returns false when the server
// could not bind its port and retry is set (the process is stopped then); any other failure
// fails the test.
func (s *Server) start(retry bool) bool {
	s.t.Helper()
	s.Out = &testnet.Buffer{}
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Dir = s.Dir
	s.cmd.Stdout, s.cmd.Stderr = s.Out, s.Out
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.ping()
		if err == nil {
			return true
		}
		out := s.Out.String()
		if strings.Contains(out, "not built with TLS") {
			s.Stop()
			s.t.Skip("this redis-server was built without TLS support")
		}
		if retry && strings.Contains(out, "Address already in use") {
			s.Stop()
			return false
		}
		if time.Now().After(deadline) {
			s.Stop()
			s.t.Fatalf("redis-server on %s does not answer PING within 10s: %v\n%s", s.Addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping sends PING over a fresh connection.
func (s *Server) ping() error {
	_, err := s.Do("PING")
	if err != nil && strings.HasPrefix(err.Error(), "redis: NOAUTH") {
		return nil // a server that requires a password answers
	}
	return err
}

// dial opens a fresh connection (TLS for a StartTLS server) with a 2 s deadline.
func (s *Server) dial() (net.Conn, error) {
	d := &net.Dialer{Timeout: time.Second}
	var c net.Conn
	var err error
	if s.TLS != nil {
		c, err = tls.DialWithDialer(d, "tcp", s.Addr, s.TLS)
	} else {
		c, err = d.Dial("tcp", s.Addr)
	}
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	return c, nil
}

// do sends one command over a fresh connection and returns what one read of the reply got:
// its first line, or the whole reply when whole is set (a bulk reply such as CLUSTER INFO).
func (s *Server) do(whole bool, args ...string) (string, error) {
	c, err := s.dial()
	if err != nil {
		return "", err
	}
	defer c.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	buf := make([]byte, 8192)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	if whole {
		return string(buf[:n]), nil
	}
	line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
	if strings.HasPrefix(line, "-") {
		return "", fmt.Errorf("redis: %s", line[1:])
	}
	return line, nil
}

// Do sends one command over a fresh connection and returns the first line of the reply; an
// error reply is an error.
func (s *Server) Do(args ...string) (string, error) { return s.do(false, args...) }

// DoBulk sends one command over a fresh connection and returns its bulk-string reply (CLUSTER
// MYID); an error reply is an error.
func (s *Server) DoBulk(args ...string) (string, error) {
	out, err := s.do(true, args...)
	if err != nil {
		return "", err
	}
	head, body, ok := strings.Cut(out, "\r\n")
	if !ok || !strings.HasPrefix(head, "$") {
		return "", fmt.Errorf("redis: not a bulk reply: %q", out)
	}
	return strings.TrimSuffix(body, "\r\n"), nil
}

// Process returns the running process (to read its /proc entries).
func (s *Server) Process() *os.Process { return s.cmd.Process }

// Freeze stops the process with SIGSTOP: a Redis that hangs mid-run, whose connections stay
// open and whose port still accepts, but which answers nothing until Thaw. A server still
// frozen when the test ends is thawed before the cleanups registered earlier run, so that the
// clients they close do not wait on it.
func (s *Server) Freeze() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP)
	s.t.Cleanup(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			_ = s.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
}

// Thaw lets a frozen server run again (SIGCONT).
func (s *Server) Thaw() {
	s.t.Helper()
	s.signal(syscall.SIGCONT)
}

// signal sends sig to the process; a failure fails the test.
func (s *Server) signal(sig os.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redis-server on %s: %v: %v", s.Addr, sig, err)
	}
}

// Stop kills the server by its PID and waits for it (idempotent).
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts the server again on the same port, with its arguments.
func (s *Server) Restart() { s.start(false) }

// Cluster is a Redis Cluster of masters without replicas on loopback.
type Cluster struct {
	// Nodes are the masters.
	Nodes []*Server
}

// StartCluster starts n masters and joins them with redis-cli --cluster create, then waits
// until every node reports cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	Need(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is not installed beside redis-server")
	}
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for i := 0; i < n; i++ {
		// The bus port is drawn as well, anew with the port on each attempt of startFree: the
		// default, port + 10000, lies beyond 65535 for a quarter of the ephemeral range.
		s := startFree(t, func(port int) []string {
			return []string{"--port", strconv.Itoa(port), "--cluster-port", strconv.Itoa(testnet.FreePort(t))}
		}, nil, []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"})
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, s := range c.Nodes {
		for {
			info, err := s.do(true, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ok within 15s: %v %q", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr
	}
	return out
}

// Drive calls each of calls from two goroutines of its own in a loop, pausing pause after each
// call, for about d: the clients of a shared limit. It returns the seconds from the start to the
// stop and to the end of every goroutine, and how many calls admitted; a call's error ends its
// goroutine and the first one is returned.
func Drive(calls []func() (bool, error), d, pause time.Duration) (stopped, total float64, admitted int64, err error) {
	var n atomic.Int64
	var stop atomic.Bool
	errs := make(chan error, 2*len(calls))
	var wg sync.WaitGroup
	start := time.Now()
	for _, call := range calls {
		for range 2 {
			wg.Go(func() {
				for !stop.Load() {
					ok, err := call()
					if err != nil {
						errs <- err
						return
					}
					if ok {
						n.Add(1)
					}
					time.Sleep(pause)
				}
			})
		}
	}
	time.Sleep(d)
	stopped = time.Since(start).Seconds()
	stop.Store(true)
	wg.Wait()
	total = time.Since(start).Seconds()
	close(errs)
	return stopped, total, n.Load(), <-errs
}

// CheckAdmitted fails the test unless admitted, over Drive's window, is within the GCRA bound of
// rate and burst: at most R·T + B, with T the whole window (every admitted decision lies in it),
// and at least 99% of the same over the window before the stop, less 100 ms for the first round
// trip and a busy machine's scheduling.
func CheckAdmitted(t testing.TB, admitted int64, rate, burst, stopped, total float64) {
	t.Helper()
	got := float64(admitted)
	upper := rate*total + burst
	lower := 0.99 * (rate*(stopped-0.1) + burst)
	t.Logf("admitted %v over %.3fs: bound R·T+B = %.1f", got, total, upper)
	if got > upper || got < lower {
		t.Fatalf("admitted %v over %.3fs, want within [%.1f, %.1f]", got, total, lower, upper)
	}
}
