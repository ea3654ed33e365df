package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"toron/demo"
)

// tlsHandshakeTimeout is the handshake_timeout of configTemplate's TLS listener (= read_timeout's
// default).
const tlsHandshakeTimeout = 5 * time.Second

// StartToronTLS is StartToron with TLS on the listener: a self-signed certificate for
// 127.0.0.1 is written into dir; the returned client trusts it.
func StartToronTLS(binary, dir string, ro RouteOptions) (*Toron, *http.Client, error) {
	certFile, keyFile, err := demo.WriteSelfSignedCert(dir)
	if err != nil {
		return nil, nil, err
	}
	pem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	routes, err := routesText(ro)
	if err != nil {
		return nil, nil, err
	}
	// Probes: a new connection (a full handshake) each, as a load balancer's health check.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
		DisableKeepAlives: true,
	}}
	gw, err := startToronConfig(binary, dir, routes, map[string]any{"Cert": certFile, "Key": keyFile}, client)
	if err != nil {
		return nil, nil, err
	}
	return gw, client, nil
}

// silentCrowd holds n TCP connections to addr that never send a byte: each waits for the
// server to close it, then a new one takes its place, until stop. Every connection's lifetime is
// one result (Latency = time until the server closed it).
type silentCrowd struct {
	addr string
	n    int

	mu      sync.Mutex
	results []vegeta.Result
	open    atomic.Int64
}

func (s *silentCrowd) run(stop <-chan struct{}, limit time.Duration) {
	var wg sync.WaitGroup
	for i := 0; i < s.n; i++ {
		wg.Go(func() {
			for !closed(stop) {
				r := s.once(stop, limit)
				if strings.HasPrefix(r.Error, "stopped") {
					return // cut short by the end of the phase: no measurement
				}
				s.mu.Lock()
				s.results = append(s.results, r)
				s.mu.Unlock()
				if strings.HasPrefix(r.Error, "dial") {
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
		if i%100 == 99 {
			time.Sleep(20 * time.Millisecond) // the crowd arrives over a fraction of a second, not in one SYN burst
		}
	}
	wg.Wait()
}

// once opens one silent connection and waits until the server closes it, stop, or limit.
func (s *silentCrowd) once(stop <-chan struct{}, limit time.Duration) vegeta.Result {
	r := vegeta.Result{Attack: "silent", Method: "TLS", URL: "tls://" + s.addr, Timestamp: time.Now()}
	conn, err := net.DialTimeout("tcp", s.addr, 2*time.Second)
	if err != nil {
		r.Latency = time.Since(r.Timestamp)
		r.Error = "dial: " + errorText(err)
		return r
	}
	s.open.Add(1)
	defer s.open.Add(-1)
	done := make(chan struct{})
	go func() {
		select {
		case <-stop:
			_ = conn.SetReadDeadline(time.Now())
		case <-done:
		}
	}()
	_ = conn.SetReadDeadline(r.Timestamp.Add(limit))
	_, err = io.Copy(io.Discard, conn)
	close(done)
	conn.Close()
	r.Latency = time.Since(r.Timestamp)
	switch {
	case isTimeout(err) && r.Latency >= limit:
		r.Error = "not-cut: still open after " + limit.String()
	case isTimeout(err):
		r.Error = "stopped: the phase ended"
	default:
		// The server closed it (EOF, or a reset): what the scenario wants.
		r.Error = "closed: by the server"
	}
	return r
}

// tlsSilent is the tls-silent scenario (SPEC 14): -silent-conns TCP connections to the TLS
// listener that never send their ClientHello, replaced as soon as the gateway closes them,
// while /health and /api are probed over TLS (a new connection each, every -interval). The
// probes must be answered at least -min-ok percent of the time, and the silent connections must
// be closed at handshake_timeout.
func tlsSilent(o options) error {
	dir, err := o.toronDir()
	if err != nil {
		return err
	}
	var client *http.Client
	up, gw, err := startBehindUpstream(func(upstream string) (gw *Toron, err error) {
		gw, client, err = StartToronTLS(o.toron, dir, RouteOptions{Upstream: upstream, ReportsMaxConcurrency: o.bulkhead})
		return gw, err
	})
	if err != nil {
		return err
	}
	defer up.Close()
	fmt.Printf("loadtest tls-silent: upstream %s, gateway %s (pid %d, files in %s)\n", up.URL(), gw.URL(), gw.PID(), dir)
	addr := gw.Addr()

	crowd := &silentCrowd{addr: addr, n: o.silentConns}
	stop := make(chan struct{})
	crowdDone := make(chan struct{})
	go func() {
		crowd.run(stop, 3*tlsHandshakeTimeout)
		close(crowdDone)
	}()
	// Measure once the crowd is at full size.
	for deadline := time.Now().Add(10 * time.Second); crowd.open.Load() < int64(o.silentConns) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	atStart := crowd.open.Load()

	minOpen := atStart
	results := probeEvery(client, gw.URL(), []string{"/health", "/api/items"}, o.interval, o.duration, func() {
		if n := crowd.open.Load(); n < minOpen {
			minOpen = n
		}
	})
	close(stop)
	<-crowdDone
	handshakeErrors := gw.Metrics("toron_tls_handshake_errors_total")
	rss := gw.PeakRSSBytes()
	runErr := gw.Stop()

	var closed []time.Duration
	notCut := 0
	for _, r := range crowd.results {
		switch transportClass(r.Error) {
		case "closed":
			closed = append(closed, r.Latency)
		case "not-cut":
			notCut++
		}
	}
	sort.Slice(closed, func(i, j int) bool { return closed[i] < closed[j] })
	series := []Series{
		{"/health over TLS", results[0]},
		{"/api over TLS", results[1]},
		{fmt.Sprintf("silent TLS connections (%d at once)", o.silentConns), crowd.results},
	}
	rows := summarizeAll(series)
	med := time.Duration(0)
	if len(closed) > 0 {
		med = closed[len(closed)/2]
	}
	notes := []string{
		fmt.Sprintf("silent crowd: %d open when the probes started (of %d), at least %d while probing; %d closed by the gateway, median after %s (handshake_timeout %s), %d not closed within %s",
			atStart, o.silentConns, minOpen, len(closed), med.Round(10*time.Millisecond), tlsHandshakeTimeout, notCut, 3*tlsHandshakeTimeout),
		fmt.Sprintf("gateway: %s; peak RSS %s", strings.Join(handshakeErrors, ", "), mib(rss)),
	}
	checks := []check{}
	for _, r := range rows[:2] {
		checks = append(checks, check{fmt.Sprintf("%s: %.2f%% answered 200 within %s (target >= %.0f%%; %s)", r.Name, r.OKShare(), client.Timeout, o.minOKPercent, r.ErrorsText()),
			r.OKShare() >= o.minOKPercent})
	}
	checks = append(checks, check{fmt.Sprintf("the crowd was at full size: %d of %d open", atStart, o.silentConns), atStart >= int64(o.silentConns)*95/100})
	if o.duration > tlsHandshakeTimeout {
		checks = append(checks, check{fmt.Sprintf("silent connections closed at handshake_timeout: median %s, %d not closed", med.Round(10*time.Millisecond), notCut),
			len(closed) > 0 && notCut == 0 && med >= tlsHandshakeTimeout-500*time.Millisecond && med <= tlsHandshakeTimeout+3*time.Second})
	}
	title := fmt.Sprintf("tls-silent: %d silent TLS connections (no ClientHello); /health and /api over TLS every %s, new connection each, for %s",
		o.silentConns, o.interval, o.duration)
	return conclude(o, "tls-silent", title, series, rows, notes, checks, runErr)
}
