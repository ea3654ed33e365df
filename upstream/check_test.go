package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/testnet"
)

// checkTarget is a real HTTP upstream on 127.0.0.1 whose health answer the test sets, and
// which can be stopped and started again on the same port.
type checkTarget struct {
	t      *testing.T
	addr   string
	status atomic.Int32
	checks atomic.Int64

	mu      sync.Mutex
	srv     *http.Server
	lastReq *http.Request
}

func newCheckTarget(t *testing.T) *checkTarget {
	ct := &checkTarget{t: t}
	ct.status.Store(200)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ct.addr = ln.Addr().String()
	ct.serve(ln)
	t.Cleanup(ct.stop)
	return ct
}

func (ct *checkTarget) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct.mu.Lock()
		ct.lastReq = r
		ct.mu.Unlock()
		ct.checks.Add(1)
		w.WriteHeader(int(ct.status.Load()))
	})}
	ct.mu.Lock()
	ct.srv = srv
	ct.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// stop closes the listener and every connection: dials are refused.
func (ct *checkTarget) stop() {
	ct.mu.Lock()
	srv := ct.srv
	ct.srv = nil
	ct.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// start listens on the same port again.
func (ct *checkTarget) start() {
	var ln net.Listener
	var err error
	for range 50 { // the port was just closed: a TIME_WAIT does not block a listener, but be patient
		if ln, err = net.Listen("tcp", ct.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		ct.t.Fatal(err)
	}
	ct.serve(ln)
}

func (ct *checkTarget) request() *http.Request {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.lastReq
}

// checkSet builds a Set with fast active checks over the given addresses.
func checkSet(t *testing.T, events chan<- Event, addrs ...string) *Set {
	t.Helper()
	cfg := Config{
		Route: "r",
		Check: &CheckConfig{Path: "/healthz", Interval: 50 * time.Millisecond, Timeout: time.Second, HealthyThreshold: 2, UnhealthyThreshold: 3},
	}
	if events != nil {
		cfg.OnEvent = func(e Event) { events <- e }
	}
	for _, a := range addrs {
		cfg.Targets = append(cfg.Targets, TargetConfig{Addr: a})
	}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestActiveCheckRequestShape(t *testing.T) {
	ct := newCheckTarget(t)
	checkSet(t, nil, ct.addr)
	testnet.Eventually(t, "a check arrives", func() bool { return ct.request() != nil })
	r := ct.request()
	if r.Method != "GET" || r.URL.Path != "/healthz" || r.Host != ct.addr || r.UserAgent() != "toron-health" {
		t.Fatalf("check %s %s Host %q User-Agent %q, want GET /healthz Host %s toron-health", r.Method, r.URL.Path, r.Host, r.UserAgent(), ct.addr)
	}
}

func TestActiveChecksTakeTargetDownAndUp(t *testing.T) {
	a, b := newCheckTarget(t), newCheckTarget(t)
	events := make(chan Event, 16)
	s := checkSet(t, events, a.addr, b.addr)
	ta := s.Targets()[0]
	testnet.Eventually(t, "checks run", func() bool { return a.checks.Load() >= 3 })
	if ta.Down() {
		t.Fatal("a healthy target is down")
	}

	// An error status: down after three failed checks in a row, and out of the balancer.
	a.status.Store(503)
	testnet.Eventually(t, "a goes down on 503", ta.Down)
	if e := <-events; e.Kind != EventDown || e.Target != a.addr || e.Route != "r" {
		t.Fatalf("event %+v, want %s down", e, a.addr)
	}
	for range 100 {
		if pickDone(s, nil) == ta {
			t.Fatal("a down target was picked")
		}
	}
	a.status.Store(204)
	testnet.Eventually(t, "a comes back up", func() bool { return !ta.Down() })
	if e := <-events; e.Kind != EventUp || e.Target != a.addr {
		t.Fatalf("event %+v, want %s up", e, a.addr)
	}

	// A refused dial: the listener closes, then listens again on the same port.
	a.stop()
	testnet.Eventually(t, "a goes down when refusing", ta.Down)
	a.start()
	testnet.Eventually(t, "a comes back after listening again", func() bool { return !ta.Down() })
	if s.Targets()[1].Down() {
		t.Fatal("b went down though it always answered 200")
	}
}

func TestActiveCheckThresholdsInARow(t *testing.T) {
	// Checks 1-3 fail (down at the third), check 4 passes alone, 5-7 fail, 8 on pass: with
	// healthy_threshold 2 the target comes back at check 9, not at check 4.
	var checks atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n := checks.Add(1); {
		case n <= 3, n >= 5 && n <= 7:
			w.WriteHeader(500)
		case n == 4:
			w.WriteHeader(200)
		default:
			w.WriteHeader(302) // 3xx passes
		}
	}))
	defer srv.Close()
	type seen struct {
		kind EventKind
		at   int64
	}
	events := make(chan seen, 8)
	cfg := Config{Route: "r", Targets: []TargetConfig{{Addr: srv.Listener.Addr().String()}},
		Check:   &CheckConfig{Path: "/", Interval: 30 * time.Millisecond, Timeout: time.Second, HealthyThreshold: 2, UnhealthyThreshold: 3},
		OnEvent: func(e Event) { events <- seen{e.Kind, checks.Load()} }}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	timeout := time.After(15 * time.Second)
	for _, want := range []seen{{EventDown, 3}, {EventUp, 9}} {
		select {
		case got := <-events:
			if got.kind != want.kind || got.at < want.at || got.at > want.at+1 {
				t.Fatalf("event %s after check %d, want %s after check %d", got.kind, got.at, want.kind, want.at)
			}
		case <-timeout:
			t.Fatalf("no %s event", want.kind)
		}
	}
}

func TestActiveCheckTimeout(t *testing.T) {
	// A target that accepts and never answers fails its checks after the timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, ln, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	cfg := Config{Route: "r", Targets: []TargetConfig{{Addr: ln.Addr().String()}},
		Check: &CheckConfig{Path: "/", Interval: 50 * time.Millisecond, Timeout: 100 * time.Millisecond, UnhealthyThreshold: 2, HealthyThreshold: 1}}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	testnet.Eventually(t, "a silent target goes down", s.Targets()[0].Down)
	s.Close()
}

func TestActiveCheckTLS(t *testing.T) {
	var ua atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ua.Store(r.UserAgent() + " " + r.TLS.ServerName)
		w.WriteHeader(200)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the unknown-CA case logs handshake errors
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	addr := srv.Listener.Addr().String()
	for _, c := range []struct {
		name     string
		tls      *tls.Config
		wantDown bool
	}{
		{"verified", &tls.Config{RootCAs: pool, ServerName: "example.com"}, false},
		{"unknown CA", &tls.Config{ServerName: "example.com"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dials atomic.Int64
			cfg := Config{Route: "r", Targets: []TargetConfig{{Addr: addr}},
				Check: &CheckConfig{Path: "/", Interval: 50 * time.Millisecond, Timeout: time.Second, UnhealthyThreshold: 2, HealthyThreshold: 1,
					TLS: c.tls,
					Dial: func(ctx context.Context, addr string) (net.Conn, error) {
						dials.Add(1)
						var d net.Dialer
						return d.DialContext(ctx, "tcp", addr)
					}}}
			s, err := NewSet(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if c.wantDown {
				testnet.Eventually(t, "a target with an unverifiable certificate goes down", s.Targets()[0].Down)
				return
			}
			testnet.Eventually(t, "three checks through the caller's dial", func() bool { return dials.Load() >= 3 })
			if s.Targets()[0].Down() {
				t.Fatal("a verified TLS target is down")
			}
			if got, _ := ua.Load().(string); got != "toron-health example.com" {
				t.Fatalf("TLS check seen as %q, want toron-health with SNI example.com", got)
			}
		})
	}
}

func TestCloseStopsCheckerMidCheck(t *testing.T) {
	// A check blocked on a silent target must not hold Close for its timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	cfg := Config{Route: "r", Targets: []TargetConfig{{Addr: ln.Addr().String()}},
		Check: &CheckConfig{Path: "/", Interval: 10 * time.Millisecond, Timeout: time.Minute}}
	s, err := NewSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	defer c.Close()
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close waited %s for a check with a 1m timeout", d)
	}
}

func TestStatusCode(t *testing.T) {
	for line, want := range map[string]int{
		"HTTP/1.1 200 OK\r\n": 200, "HTTP/1.0 302\r\n": 302, "HTTP/1.1 503 Service Unavailable\n": 503,
		"HTTP/1.1 20 OK\r\n": -1, "HTTP/2 200\r\n": -1, "HTTP/1.1 2000\r\n": -1, "http/1.1 200 OK\r\n": -1, "HTTP/1.1  200\r\n": -1, "": -1,
	} {
		code, ok := statusCode([]byte(line))
		if !ok {
			code = -1
		}
		if code != want {
			t.Errorf("statusCode(%q) = %d, want %d", line, code, want)
		}
	}
}

// FuzzStatusCode: the check's status-line parser never panics, and what it accepts is a
// three-digit status after "HTTP/1.x ".
func FuzzStatusCode(f *testing.F) {
	for _, s := range []string{"HTTP/1.1 200 OK\r\n", "HTTP/1.0 302\r\n", "HTTP/1.1 20 OK\r\n", "HTTP/1.1 -20 x\r\n", "HTTP/1.1 +99\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		code, ok := statusCode(line)
		if ok && (code < 0 || code > 999 || !bytes.HasPrefix(line, []byte("HTTP/1."))) {
			t.Fatalf("statusCode(%q) = %d", line, code)
		}
	})
}
