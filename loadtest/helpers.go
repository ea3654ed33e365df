package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// The helper scenarios, run by the scripts (and, as processes of their own, by the scenarios):
// upstream, naive-proxy and probe here, tcp-relay in relay.go, ws-upstream in tunnel.go,
// bare-server in idle.go; and what starting one and stopping it takes.

// The upload scenario's reference: the reverse proxy an engineer writes in ten lines with
// fasthttp (StreamRequestBody on the server, HostClient.Do with the request as it came, the
// response streamed back), with none of Toron's limits, deadlines or framing checks. Issue 5
// set Toron's upload targets against such a proxy (0.83 of direct with a Content-Length, 0.33
// chunked, where fasthttp copies through 4 KiB buffers); running it in the same rounds shows
// whether this machine and harness reproduce those conditions.

// serveNaiveProxy is the naive-proxy helper scenario: it listens on -listen and forwards every
// request to -upstream until SIGINT, SIGTERM or -lifetime.
func serveNaiveProxy(o options) error {
	if o.upstream == "" {
		return fmt.Errorf("loadtest: naive-proxy needs -upstream host:port")
	}
	hc := &fasthttp.HostClient{Addr: o.upstream, StreamResponseBody: true}
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error("naive proxy: "+err.Error(), fasthttp.StatusBadGateway)
			}
		},
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           1 << 40,
		CloseOnShutdown:              true,
		Name:                         "loadtest-naive-proxy",
	}
	ln, err := o.listenHelper("naive proxy")
	if err != nil {
		return err
	}
	fmt.Printf("loadtest naive proxy on %s -> %s (pid %d)\n", ln.Addr(), o.upstream, os.Getpid())
	err = serveUntilStop(srv, func() error { return srv.Serve(ln) }, o.lifetime)
	hc.CloseIdleConnections()
	return err
}

// listenHelper listens on -listen for the helper scenario what (named in the error).
func (o options) listenHelper(what string) (net.Listener, error) {
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("loadtest: %s cannot listen on %s: %w", what, o.listen, err)
	}
	return ln, nil
}

// serveUntilStop runs serve (srv serving its listener) until waitStop returns: what serve
// returned when it ended first, else srv shut down.
func serveUntilStop(srv *fasthttp.Server, serve func() error, lifetime time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- serve() }()
	if err := waitStop(served, lifetime); err != nil {
		return err
	}
	return srv.Shutdown()
}

// waitStop waits for SIGINT, SIGTERM or lifetime, and returns nil then, or for served, and
// returns what the server's Serve returned (nil served: a server that only stops when told): a
// helper scenario's server runs until it is told to stop, or until it fails.
func waitStop(served <-chan error, lifetime time.Duration) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case <-sig:
	case err := <-served:
		return err
	case <-time.After(lifetime):
	}
	return nil
}

// startUpstreamProcess starts this program as the upstream helper (a separate process: in the
// upload scenario the client, the gateway and the upstream are three programs, as in
// production, and none of them shares a Go runtime with another).
func startUpstreamProcess(dir string) (*process, error) {
	return startHelper(dir, "upstream")
}

// startNaiveProxy starts this program as the naive-proxy helper in front of upstream (a
// separate process, like the gateway, so that it competes for the same cores the same way).
func startNaiveProxy(dir, upstream string) (*process, error) {
	return startHelper(dir, "naive-proxy", "-upstream", upstream)
}

// startHelper starts this program as the helper scenario on a free loopback port, with its log
// in dir/SCENARIO.log, and waits until it answers /health.
func startHelper(dir, scenario string, args ...string) (*process, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("loadtest: cannot find its own binary for the %s helper: %w", scenario, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args = append([]string{"-scenario", scenario, "-listen", "127.0.0.1:" + strconv.Itoa(port)}, args...)
	cmd := exec.Command(self, args...)
	return startProcess("the "+scenario+" helper", cmd, port, filepath.Join(dir, scenario+".log"), syscall.SIGTERM)
}

// closed reports, without waiting, whether c is closed (the stop was given).
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// toronDir makes the scenario's Toron directory (configuration and logs) under -out.
func (o options) toronDir() (string, error) { return o.subdir(o.scenario + "-toron") }

// subdir makes the directory name under -out, for a server's generated files and logs.
func (o options) subdir(name string) (string, error) {
	dir := filepath.Join(o.out, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("loadtest: cannot create %s: %w", dir, err)
	}
	return dir, nil
}

// serveUpstream serves the upstream alone until SIGINT, SIGTERM or -lifetime.
func serveUpstream(o options) error {
	up, err := StartUpstream(o.listen)
	if err != nil {
		return err
	}
	fmt.Printf("loadtest upstream listening on %s (pid %d)\n", up.URL(), os.Getpid())
	_ = waitStop(nil, o.lifetime) // a signal or the lifetime: nothing else ends it
	return up.Close()
}

// probe checks every path of a running server every -interval on a new connection, as a load
// balancer's health check does, and reports the share answered 200.
func probe(o options) error {
	if o.target == "" {
		return fmt.Errorf("loadtest: probe needs -target, such as http://127.0.0.1:8080")
	}
	paths := strings.Split(o.paths, ",")
	client := &http.Client{Timeout: o.probeTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	results := probeEvery(client, o.target, paths, o.interval, o.duration, nil)

	label := labelOr(o, o.target)
	series := make([]Series, len(paths))
	for i, p := range paths {
		series[i] = Series{label + " " + p, results[i]}
	}
	rows := summarizeAll(series)
	var checks []check
	for _, r := range rows {
		checks = append(checks, check{fmt.Sprintf("%s: %.2f%% answered 200 within %s (target >= %.0f%%)", r.Name, r.OKShare(), o.probeTimeout, o.minOKPercent),
			r.OKShare() >= o.minOKPercent})
	}
	title := fmt.Sprintf("probe %s: %s every %s, new connection each, %s timeout, for %s", label, o.paths, o.interval, o.probeTimeout, o.duration)
	name := "probe"
	if o.label != "" {
		name += "-" + o.label
	}
	return conclude(o, name, title, series, rows, nil, checks, nil)
}
