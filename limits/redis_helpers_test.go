package limits

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// The global rate-limit tests run real redis-server processes (Debian's package, installed by
// scripts/need-redis.sh from `make test`) on free loopback ports, each in a temporary directory
// with persistence off, stopped by PID at the end of the test. No mock stands in for Redis.

// redisServer is one redis-server process started by a test.
type redisServer struct {
	t    testing.TB
	addr string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	out  *lockedBuffer
}

// lockedBuffer collects a server's output, written by exec's copier and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// needRedis skips the test when redis-server is not installed (outside make test), or fails it
// under CI=true, where a missing server is a broken set-up rather than a reason to skip.
func needRedis(t testing.TB) string {
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

// startRedis starts a redis-server on a free loopback port with extra arguments and waits until
// it answers PING. The server is stopped when the test ends.
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	port := testnet.FreePort(t)
	s := &redisServer{t: t, port: port, addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir()}
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--dir", s.dir, "--logfile", ""}, extra...)
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *redisServer) start() {
	s.t.Helper()
	bin := needRedis(s.t)
	s.out = &lockedBuffer{}
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Dir = s.dir
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := s.ping(); err == nil {
			return
		} else if time.Now().After(deadline) {
			s.stop()
			s.t.Fatalf("redis-server on %s does not answer PING within 10s: %v\n%s", s.addr, err, s.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping sends PING over a fresh plain connection.
func (s *redisServer) ping() error {
	_, err := s.do("PING")
	if err != nil && strings.HasPrefix(err.Error(), "redis: NOAUTH") {
		return nil // a server that requires a password answers
	}
	return err
}

// do sends one command over a fresh plain connection and returns the first line of the reply.
func (s *redisServer) do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
	if strings.HasPrefix(line, "-") {
		return "", fmt.Errorf("redis: %s", line[1:])
	}
	return line, nil
}

// stop kills the server by its PID and waits for it (idempotent).
func (s *redisServer) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// restart starts the server again on the same port, with its arguments.
func (s *redisServer) restart() { s.start() }

// redisCluster is a Redis Cluster of masters without replicas on loopback.
type redisCluster struct {
	nodes []*redisServer
}

// startRedisCluster starts n masters and joins them with redis-cli --cluster create, then waits
// until every node reports cluster_state:ok.
func startRedisCluster(t testing.TB, n int) *redisCluster {
	t.Helper()
	needRedis(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is not installed beside redis-server")
	}
	c := &redisCluster{}
	args := []string{"--cluster", "create"}
	for i := 0; i < n; i++ {
		s := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
		c.nodes = append(c.nodes, s)
		args = append(args, s.addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, s := range c.nodes {
		for {
			info, err := s.clusterInfo()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ok within 15s: %v %q", s.addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// clusterInfo returns CLUSTER INFO of a node (a bulk reply, read whole).
func (s *redisServer) clusterInfo() (string, error) {
	c, err := net.DialTimeout("tcp", s.addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("*2\r\n$7\r\nCLUSTER\r\n$4\r\nINFO\r\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 8192)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// addrs returns the nodes' addresses.
func (c *redisCluster) addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.addr
	}
	return out
}

// redisTLS is a redis-server that speaks only TLS, with certificates made by the test.
type redisTLS struct {
	*redisServer
	client *tls.Config // trusts the test CA
}

// startRedisTLS starts a redis-server with its only port on TLS (--port 0 --tls-port N) and
// client certificates not required. It skips when this redis-server was built without TLS.
func startRedisTLS(t testing.TB, extra ...string) *redisTLS {
	t.Helper()
	bin := needRedis(t)
	dir := t.TempDir()
	caPEM, certPEM, keyPEM := makeTestCerts(t)
	for name, b := range map[string][]byte{"ca.pem": caPEM, "cert.pem": certPEM, "key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := testnet.FreePort(t)
	s := &redisServer{t: t, port: port, addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
	s.args = append([]string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", filepath.Join(dir, "cert.pem"), "--tls-key-file", filepath.Join(dir, "key.pem"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", dir, "--logfile", ""}, extra...)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	r := &redisTLS{redisServer: s, client: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}}
	s.out = &lockedBuffer{}
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start redis-server with TLS: %v", err)
	}
	t.Cleanup(s.stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := tls.Dialer{Config: r.client}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := d.DialContext(ctx, "tcp", s.addr)
		cancel()
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, err = c.Write([]byte("PING\r\n"))
			buf := make([]byte, 16)
			n, rerr := c.Read(buf)
			c.Close()
			if err == nil && rerr == nil && strings.HasPrefix(string(buf[:n]), "+PONG") {
				return r
			}
		}
		if strings.Contains(s.out.String(), "not built with TLS") {
			t.Skip("this redis-server was built without TLS support")
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS redis-server on %s does not answer within 10s: %v\n%s", s.addr, err, s.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// makeTestCerts returns a CA and a server certificate for 127.0.0.1 signed by it, in PEM.
func makeTestCerts(t testing.TB) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "toron test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// silentRedis is a TCP listener that accepts and reads but never writes: a Redis that hangs.
type silentRedis struct {
	ln   net.Listener
	addr string
	done chan struct{}
}

func startSilentRedis(t testing.TB) *silentRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentRedis{ln: ln, addr: ln.Addr().String(), done: make(chan struct{})}
	conns := make(chan net.Conn, 64)
	go func() {
		defer close(s.done)
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			conns <- c
		}
	}()
	readers := make(chan struct{})
	go func() {
		defer close(readers)
		for c := range conns {
			go func(c net.Conn) {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-s.done // closes every accepted connection, which ends their readers
		close(conns)
		<-readers
	})
	return s
}
