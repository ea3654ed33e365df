// Package testnet holds the test set-ups that several packages' tests share: a loopback TCP
// pair, a server loop over a listener, a load loop, polls with a generous bound, a private certificate authority made for one test, a
// farm of HTTP servers on 127.0.0.N sharing one port, and the process's CPU time.
// Tests import it; no production code does.
package testnet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// LoopbackListeners returns n listeners on 127.0.0.2 .. 127.0.0.(n+1), all on one port (a
// discovered name's addresses share the entry's port), closed when the test ends. It tries
// another port when one address has it taken, and skips the test when 127.0.0.2 cannot be
// listened on.
func LoopbackListeners(t testing.TB, n int) []net.Listener {
	t.Helper()
	for range 20 {
		first, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skipf("cannot listen on 127.0.0.2: %v", err)
		}
		port := first.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{first}
		for i := 1; i < n; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i+2, port))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) < n {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		t.Cleanup(func() {
			for _, ln := range lns {
				ln.Close()
			}
		})
		return lns
	}
	t.Fatal("no port free on every loopback address")
	return nil
}

// CPUSeconds is the process's user and system CPU time so far: a test that waits on a stalled
// peer compares it before and after to show that nothing spun meanwhile.
func CPUSeconds(t testing.TB) float64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// FreePort returns a loopback port that was free a moment ago, for a server the test starts
// with a port in its configuration.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Pair returns both ends of a loopback TCP connection, closed when the test ends.
func Pair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		_ = client.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

// Serve accepts the connections of ln until it is closed, each served by handle on a goroutine
// of its own and closed when handle returns. When the test ends it closes ln and every
// connection still open (so that a handle blocked reading returns), then waits for every
// handle to return.
func Serve(t testing.TB, ln net.Listener, handle func(c net.Conn)) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]struct{}{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					mu.Lock()
					delete(open, c)
					mu.Unlock()
					_ = c.Close()
				}()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// Loop calls call over and over on each of n goroutines (worker 0 .. n-1), the load of a test,
// until the returned stop is called: stop waits for every goroutine to return, may be called
// more than once, and is called when the test ends.
func Loop(t testing.TB, n int, call func(worker int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				call(i)
			}
		})
	}
	stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(stop)
	return stop
}

// Within polls cond every 5 ms until it holds and returns how long that took; it fails the
// test when cond has not held within limit (what names the awaited condition).
func Within(t testing.TB, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if !WaitUntil(limit, cond) {
		t.Fatalf("timed out after %v waiting until %s", limit, what)
	}
	return time.Since(start)
}

// WaitUntil polls cond every 5 ms until it holds or d has passed, and reports whether it held.
func WaitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// CA is a private certificate authority made for one test, with the files it wrote in the
// test's temporary directory: nothing is committed, nothing outlives the test.
type CA struct {
	// Cert and Key sign the leaves.
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// Pool holds Cert, for a client or server that must trust the leaves.
	Pool *x509.CertPool
	// Dir is where the PEM files go; CAFile is Cert's.
	Dir    string
	CAFile string
	serial atomic.Int64
}

// NewCA makes a CA valid from an hour ago for a day, and writes its certificate to CAFile.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, der := selfSign(t, &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "toron test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
	})
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, Key: key, Pool: x509.NewCertPool(), Dir: t.TempDir()}
	ca.serial.Store(1)
	ca.Pool.AddCert(cert)
	ca.CAFile = filepath.Join(ca.Dir, "ca.pem")
	WritePEM(t, ca.CAFile, "CERTIFICATE", der)
	return ca
}

// WritePEM writes der as one PEM block of type typ to file.
func WritePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// sign signs a leaf (server and client auth) for names, valid until notAfter: DNS names, and
// IP SANs for the names that are addresses when ips is set. It returns the leaf's DER and the
// PKCS #8 DER of its key.
func (ca *CA) sign(t testing.TB, cn string, names []string, ips bool, notAfter time.Time) (*ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil && ips {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der, kb
}

// Issue signs a leaf for the DNS names, valid until notAfter, and returns it loaded (Leaf set).
func (ca *CA) Issue(t testing.TB, cn string, names []string, notAfter time.Time) tls.Certificate {
	t.Helper()
	key, der, _ := ca.sign(t, cn, names, false, notAfter)
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// IssueFiles signs a leaf for names (DNS names; an address such as "127.0.0.1" becomes an IP
// SAN), valid for a day, and returns it loaded, with the PEM files it wrote as base.crt and
// base.key in Dir.
func (ca *CA) IssueFiles(t testing.TB, base string, names ...string) (tls.Certificate, string, string) {
	t.Helper()
	_, der, kb := ca.sign(t, base, names, true, time.Now().Add(24*time.Hour))
	certFile, keyFile := filepath.Join(ca.Dir, base+".crt"), filepath.Join(ca.Dir, base+".key")
	WritePEM(t, certFile, "CERTIFICATE", der)
	WritePEM(t, keyFile, "PRIVATE KEY", kb)
	pair, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}))
	if err != nil {
		t.Fatal(err)
	}
	return pair, certFile, keyFile
}

// eventuallyBound is Eventually's patience: generous, since the suite runs under -race on
// loaded cores.
const eventuallyBound = 15 * time.Second

// Eventually polls cond every 5 ms and fails the test when it has not held within
// eventuallyBound; what names the awaited condition in the failure.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !WaitUntil(eventuallyBound, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// Farm is a set of HTTP servers on 127.0.0.2 .. 127.0.0.(n+1), all on one port: the pods
// behind a headless Service, the addresses of one discovered name.
type Farm struct {
	// Port is the port every pod listens on.
	Port int
	// Pods are the servers by IP.
	Pods map[string]*Pod
}

// Pod is one server of a Farm: it answers every request with Status (200 until set) and its
// IP as the body, after the farm's delay, and counts its requests and connections.
type Pod struct {
	// IP is the pod's address.
	IP string
	// Hits counts the requests, Conns the connections.
	Hits, Conns atomic.Int64
	// Status is the status of the answers.
	Status atomic.Int32
	srv    *http.Server
}

// NewFarm starts n pods (LoopbackListeners), each answering after delay, stopped when the
// test ends.
func NewFarm(t testing.TB, n int, delay time.Duration) *Farm {
	t.Helper()
	lns := LoopbackListeners(t, n)
	f := &Farm{Port: lns[0].Addr().(*net.TCPAddr).Port, Pods: map[string]*Pod{}}
	for i, ln := range lns {
		p := &Pod{IP: fmt.Sprintf("127.0.0.%d", i+2)}
		p.Status.Store(200)
		p.srv = &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				p.Hits.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				time.Sleep(delay)
				w.WriteHeader(int(p.Status.Load()))
				_, _ = io.WriteString(w, p.IP)
			}),
			ConnState: func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					p.Conns.Add(1)
				}
			},
		}
		go func() { _ = p.srv.Serve(ln) }()
		f.Pods[p.IP] = p
	}
	t.Cleanup(func() {
		for _, p := range f.Pods {
			_ = p.srv.Close()
		}
	})
	return f
}

// Addr is "host:port" on the farm's port.
func (f *Farm) Addr(host string) string { return net.JoinHostPort(host, strconv.Itoa(f.Port)) }
