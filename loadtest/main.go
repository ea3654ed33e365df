// Command loadtest is Toron's load-test suite (SPEC 10): it starts its own upstream on
// loopback, starts the gateway binary with generated config and routes files pointing at it,
// waits for /health, runs one scenario with vegeta, stops the gateway with SIGTERM, prints one
// summary table and writes a latency-over-time plot (HTML with an inline SVG).
//
//	go run ./loadtest -toron bin/toron -scenario small-get
//	go run ./loadtest -scenario isolation -duration 5s        # Toron, nginx and HAProxy, interleaved
//	go run ./loadtest -scenario isolation -peers toron        # Toron alone
//
// Scenarios: small-get, upload, isolation, slow-client, tls-silent, auth-flood; and four helpers: upstream (serve the
// upstream alone, for scripts/compare.sh), probe (probe a running server every -interval, for
// scripts/slowloris.sh), naive-proxy and tcp-relay (the upload scenario's references, started
// by it). Every request goes to 127.0.0.1. The isolation scenario measures the gateway, nginx
// (loadtest/peers/nginx.conf, from a temporary prefix) and HAProxy (loadtest/peers/haproxy.cfg),
// each in front of its own upstream, in interleaved rounds of one run (-peers).
//
// Exit status: 0 done, 1 a failure to set up or run, 2 bad flags, 3 the scenario ran but missed
// its target (the FAIL lines say which).
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// options are the command's flags.
type options struct {
	toron    string
	peers    []string
	nginx    string
	haproxy  string
	scenario string
	out      string
	duration time.Duration
	target   string

	rate        int
	rateSet     bool // -rate was given (slow-target keeps its own default otherwise)
	apiConnsSet bool // -api-conns was given (auth-flood runs /api open loop otherwise)
	connections int

	apiRate, healthRate, floodRate int
	apiConns                       int
	rounds                         int
	bulkhead                       int
	maxRatio                       float64

	uploads       int
	uploadBytes   int64
	uploadTimeout time.Duration
	chunked       bool
	verify        bool
	reference     bool
	minCLRatio    float64
	minChunkRatio float64
	upstream      string

	attackers int

	listen   string
	lifetime time.Duration

	paths        string
	interval     time.Duration
	probeTimeout time.Duration
	minOKPercent float64
	label        string

	tunnels     int
	tunnelBytes int64
	silentConns int // tls-silent: silent TLS connections held at once

	pid       int    // idle: the server process to measure
	tlsTarget string // idle: host:port of a TLS listener to measure instead of -target

	bareStream        bool   // bare-server: StreamRequestBody, as Toron's server needs it
	certFile, keyFile string // bare-server: serve TLS with this pair
}

// errMissed is returned by a scenario that ran but missed its target.
var errMissed = errors.New("loadtest: target missed")

func main() {
	var o options
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.StringVar(&o.toron, "toron", "bin/toron", "gateway binary to start")
	peers := fs.String("peers", "toron,nginx,haproxy", "isolation: the servers measured in the same interleaved rounds, comma-separated: toron, nginx, haproxy (loadtest/peers/)")
	fs.StringVar(&o.nginx, "nginx", "nginx", "nginx binary for -peers nginx")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "haproxy binary for -peers haproxy")
	fs.StringVar(&o.scenario, "scenario", "", "small-get, upload, isolation, slow-client, slow-target, tunnel, tls-silent, idle, global-rl, auth-flood; helpers: upstream, probe, ws-echo, bare-server")
	fs.StringVar(&o.out, "out", "out/loadtest", "folder for the plots, tables and the gateway's log")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured phase")
	fs.StringVar(&o.target, "target", "", "measure this running server (base URL on 127.0.0.1; for upload the full URL) instead of starting the gateway")
	fs.IntVar(&o.rate, "rate", 0, "small-get: requests per second, 0 for as fast as -connections allow; global-rl: default 5000")
	fs.IntVar(&o.connections, "connections", 64, "small-get: concurrent connections")
	fs.IntVar(&o.apiRate, "api-rate", 200, "slow-client, tunnel: /api requests per second; isolation: the same when -api-conns is 0; auth-flood: the same unless -api-conns is given")
	fs.IntVar(&o.apiConns, "api-conns", 8, "isolation: /api keep-alive connections, each sending its next request when the last is answered (closed loop: the throughput figure); 0 for -api-rate")
	fs.IntVar(&o.healthRate, "health-rate", 20, "isolation, slow-client: /health requests per second")
	fs.IntVar(&o.floodRate, "flood-rate", 200, "isolation: requests per second to the saturated legacy route; auth-flood: wrong-password requests per second to /private")
	fs.IntVar(&o.rounds, "rounds", 0, "isolation: interleaved idle/flood rounds of every peer (default 9); auth-flood: idle/flood rounds (default 5); upload, slow-target, tunnel: rounds of every series (default 3); medians are reported")
	fs.IntVar(&o.bulkhead, "bulkhead", 8, "isolation: max_concurrency of /legacy/reports in the generated routes")
	fs.Float64Var(&o.maxRatio, "max-ratio", 1.5, "isolation, auth-flood: target for /api p99 saturated (flooded) / idle")
	fs.IntVar(&o.uploads, "uploads", 8, "upload: concurrent uploads")
	fs.Int64Var(&o.uploadBytes, "upload-bytes", 200_000_000, "upload: bytes per upload")
	fs.BoolVar(&o.chunked, "chunked", false, "upload with -target: send the bodies chunked instead of with a Content-Length")
	fs.BoolVar(&o.verify, "verify", true, "upload: byte-exact uploads (SHA-256 by the client and the upstream); false: the upstream only counts")
	fs.BoolVar(&o.reference, "reference", true, "upload: also measure a naive fasthttp proxy and a plain TCP relay in the same rounds")
	fs.Float64Var(&o.minCLRatio, "min-cl-ratio", 0.8, "upload: target for toron / direct MB/s with a Content-Length (median of the rounds)")
	fs.Float64Var(&o.minChunkRatio, "min-chunked-ratio", 0.6, "upload: target for toron / direct MB/s with chunked bodies (median of the rounds)")
	fs.StringVar(&o.upstream, "upstream", "", "naive-proxy, tcp-relay: the upstream's host:port")
	fs.DurationVar(&o.uploadTimeout, "upload-timeout", 5*time.Minute, "upload: time limit of one upload")
	fs.IntVar(&o.attackers, "attackers", 40, "slow-client: connections of each attack kind")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:18081", "upstream: address to serve on")
	fs.DurationVar(&o.lifetime, "lifetime", time.Hour, "upstream: exit after this long even without a signal")
	fs.StringVar(&o.paths, "paths", "/health,/api/probe", "probe: comma-separated paths to probe")
	fs.DurationVar(&o.interval, "interval", 50*time.Millisecond, "probe: time between two probes of a path")
	fs.DurationVar(&o.probeTimeout, "probe-timeout", time.Second, "probe: time limit of one probe")
	fs.Float64Var(&o.minOKPercent, "min-ok", 99, "probe: target share of 200 answers, percent")
	fs.StringVar(&o.label, "label", "", "probe, upload with -target: name of the measured server in the table")
	fs.IntVar(&o.tunnels, "tunnels", 2000, "tunnel: idle WebSocket tunnels held open for the memory and /api p99 measurements")
	fs.Int64Var(&o.tunnelBytes, "tunnel-bytes", 64<<20, "tunnel: bytes each echo connection sends (and reads back) per round")
	fs.IntVar(&o.silentConns, "silent-conns", 1000, "tls-silent: TCP connections to the TLS listener that never send a ClientHello, held at once")
	fs.IntVar(&o.pid, "pid", 0, "idle: pid of the server whose RSS is measured (its children are added)")
	fs.StringVar(&o.tlsTarget, "tls-target", "", "idle: host:port of a TLS listener on 127.0.0.1 to measure instead of -target")
	fs.BoolVar(&o.bareStream, "bare-stream", true, "bare-server: StreamRequestBody on (as Toron's server needs it for streamed uploads)")
	fs.StringVar(&o.certFile, "cert", "", "bare-server: PEM certificate file: serve TLS")
	fs.StringVar(&o.keyFile, "key", "", "bare-server: PEM key file of -cert")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	fs.Visit(func(f *flag.Flag) {
		o.rateSet = o.rateSet || f.Name == "rate"
		o.apiConnsSet = o.apiConnsSet || f.Name == "api-conns"
	})
	o.peers = strings.Split(*peers, ",")
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	err := run(o)
	switch {
	case errors.Is(err, errMissed):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// scenarios are the values of -scenario.
var scenarios = []string{"small-get", "upload", "isolation", "slow-client", "slow-target", "tls-silent", "upstream", "probe", "naive-proxy", "tcp-relay", "tunnel", "ws-echo", "ws-upstream", "idle", "bare-server", "global-rl", "auth-flood"}

func (o *options) validate() error {
	if !slices.Contains(scenarios, o.scenario) {
		return fmt.Errorf("loadtest: -scenario must be one of %s, got %q", strings.Join(scenarios, ", "), o.scenario)
	}
	if len(o.peers) == 0 {
		o.peers = []string{"toron"}
	}
	for i, p := range o.peers {
		if !slices.Contains(isolationPeers, p) || slices.Index(o.peers, p) != i {
			return fmt.Errorf("loadtest: -peers holds each of %s at most once, got %q", strings.Join(isolationPeers, ", "), strings.Join(o.peers, ","))
		}
	}
	if o.rounds == 0 {
		o.rounds = 3
		switch o.scenario {
		case "isolation":
			o.rounds = isolationRounds
		case "auth-flood":
			o.rounds = authFloodRounds
		}
	}
	if o.scenario == "auth-flood" && !o.apiConnsSet {
		o.apiConns = 0 // open loop at -api-rate (authflood.go)
	}
	if o.bulkhead < 1 || o.bulkhead > 1000 {
		return fmt.Errorf("loadtest: -bulkhead must be between 1 and 1000, got %d", o.bulkhead)
	}
	if o.duration <= 0 || o.duration > time.Hour {
		return fmt.Errorf("loadtest: -duration must be between 0 and 1h, got %s", o.duration)
	}
	if o.target != "" {
		u, err := url.Parse(o.target)
		if err != nil || u.Scheme != "http" || u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost" {
			return fmt.Errorf("loadtest: -target must be an http URL on 127.0.0.1, got %q", o.target)
		}
		o.target = strings.TrimSuffix(o.target, "/")
	}
	if o.rounds < 1 || o.rounds > 20 {
		return fmt.Errorf("loadtest: -rounds must be between 1 and 20, got %d", o.rounds)
	}
	if o.uploads < 1 || o.uploads > 64 {
		return fmt.Errorf("loadtest: -uploads must be between 1 and 64, got %d", o.uploads)
	}
	if o.connections < 1 || o.attackers < 0 || o.apiRate < 1 || o.apiConns < 0 || o.healthRate < 1 || o.floodRate < 0 || o.rate < 0 {
		return errors.New("loadtest: rates and counts must be positive")
	}
	if o.interval < time.Millisecond || o.probeTimeout <= 0 {
		return errors.New("loadtest: -interval must be at least 1ms and -probe-timeout positive")
	}
	return nil
}

func run(o options) error {
	switch o.scenario {
	case "global-rl":
		return globalRL(o)
	case "auth-flood":
		return authFlood(o)
	case "small-get":
		return smallGet(o)
	case "upload":
		return uploadScenario(o)
	case "isolation":
		return isolation(o)
	case "slow-target":
		return slowTarget(o)
	case "slow-client":
		return slowClient(o)
	case "tls-silent":
		return tlsSilent(o)
	case "upstream":
		return serveUpstream(o)
	case "probe":
		return probe(o)
	case "naive-proxy":
		return serveNaiveProxy(o)
	case "tcp-relay":
		return serveTCPRelay(o)
	case "tunnel":
		return tunnelScenario(o)
	case "ws-echo":
		return wsEchoClient(o)
	case "ws-upstream":
		return serveWSUpstream(o)
	case "idle":
		return idleConns(o)
	case "bare-server":
		return serveBareServer(o)
	}
	panic("BUG: loadtest: scenario " + o.scenario + " passed validation but has no runner")
}
