package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"
)

// BenchmarkToronCPUPaired measures the CPU of the Toron process alone (the real binary; the
// clients and the upstream are this test process, so their work is not counted), in paired
// rounds: each round sends toronRound requests with one side, then as many with the other (the
// order alternates), and reads each Toron process's CPU time from the kernel's per-thread
// accounting (/proc/PID/task/*/schedstat, nanoseconds). cpu-ratio is the median over rounds of
// the second side's CPU per request over the first's; base-cpu-ns/req and cpu-ns/req are the medians
// of each side's CPU per request (testnet.PairedCPU).
//
//   - traffic-rules: a small GET (with an Origin and a Cookie) to a Toron without traffic rules,
//     then to one whose route has SPEC 20's header rules and CORS (target: within 3%).
//   - traffic-rules-one-process: the same pair as two routes of one Toron process, one
//     without the rules and one with them: the steadier measure of the rules' cost (two
//     processes with the same configuration differ by a few percent).
//   - compress-2KiB/CODING: one Toron with compress: true in front of a 2 KiB JSON answer (with a
//     Content-Length), the answer sent as it is (no Accept-Encoding), then compressed.
func BenchmarkToronCPUPaired(b *testing.B) {
	tiny := []byte(`{"service":"api","ok":true}`)
	upTiny := startTestUpstream(b, jsonHandler(tiny))
	b.Run("traffic-rules", func(b *testing.B) {
		rules := "\n" + strings.TrimSuffix(trafficRulesYAML, "\n")
		headers := []string{"Origin", "https://app.example.com", "Cookie", "session=abc"}
		off := startToronRoute(b, upTiny, "")
		on := startToronRoute(b, upTiny, rules)
		measureToronPaired(b, [2]toronSide{off.side(b, headers...), on.side(b, headers...)})
	})
	b.Run("traffic-rules-one-process", func(b *testing.B) {
		// The same pair as two routes of one Toron process (/api without the rules, /app with
		// them) on one client connection, so that no difference between two processes or two
		// connections (memory layout, threads' placement) counts as the rules' cost.
		headers := []string{"Origin", "https://app.example.com", "Cookie", "session=abc"}
		p := startToronRoutes(b, upstreamRoute("/api", upTiny)+upstreamRoute("/app", upTiny)+trafficRulesYAML)
		p.client = keepAliveClient(b)
		on := p
		on.prefix = "/app"
		measureToronPaired(b, [2]toronSide{p.side(b, headers...), on.side(b, headers...)})
	})
	up2k := startTestUpstream(b, jsonHandler(jsonList(2<<10)))
	gw := startToronRoute(b, up2k, "\n    compress: true")
	for _, enc := range []string{"zstd", "br", "gzip"} {
		b.Run("compress-2KiB/"+enc, func(b *testing.B) {
			measureToronPaired(b, [2]toronSide{gw.side(b), gw.side(b, "Accept-Encoding", enc)})
		})
	}
}

// trafficRulesYAML are SPEC 20's header rules and CORS as an operator writes them, the route
// keys of the traffic-rules benchmarks (indented for a route of routes.yaml).
const trafficRulesYAML = `    request_headers: {set: {X-Env: prod, X-Client: "{client_ip}"}, remove: [Cookie]}
    response_headers: {set: {Strict-Transport-Security: max-age=63072000, X-Route: "{route}"}, remove: [Server]}
    cors: {allow_origins: ["https://app.example.com"], allow_methods: [GET, POST], expose_headers: [X-Total]}
`

// jsonHandler answers body as application/json.
func jsonHandler(body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	}
}

// jsonList is about n bytes of an API's JSON list.
func jsonList(n int) []byte {
	b := []byte(`{"items":[`)
	for i := 0; len(b) < n-80; i++ {
		b = fmt.Appendf(b, `{"id":%d,"name":"user-%d","email":"u%d@example.com","active":%t},`, i, i*7, i, i%3 == 0)
	}
	return append(b[:len(b)-1], "]}"...)
}

// toronProc is a Toron process started for a benchmark, the route prefix its sides request
// (/api when empty) and the client they share (each its own when nil).
type toronProc struct {
	pid    int
	base   string
	prefix string
	client *http.Client
}

// startToronRoute starts the binary with one route, /api to upstream, with the extra route keys
// (indented YAML lines), and the access log off.
func startToronRoute(b *testing.B, upstream, extra string) toronProc {
	b.Helper()
	return startToronRoutes(b, fmt.Sprintf("  - type: upstream\n    prefix: /api\n    target: \"http://%s\"%s\n", upstream, extra))
}

// startToronRoutes starts the binary with the routes (the lines of routes.yaml under routes:)
// and the access log off.
func startToronRoutes(b *testing.B, routes string) toronProc {
	b.Helper()
	cmd, _, base := startGateway(b, "  drain_delay: 0s\n", "  access: false\n", "routes:\n"+routes)
	return toronProc{pid: cmd.Process.Pid, base: base}
}

// toronSide sends one request to a Toron process.
type toronSide struct {
	pid  int
	send func()
}

// side returns a keep-alive client of p sending GET PREFIX/users with the header pairs (name,
// value, ...), failing the benchmark on an error or a status other than 200. The transport
// never adds an Accept-Encoding of its own.
func (p toronProc) side(b *testing.B, headers ...string) toronSide {
	client := p.client
	if client == nil {
		client = keepAliveClient(b)
	}
	prefix := p.prefix
	if prefix == "" {
		prefix = "/api"
	}
	req, err := http.NewRequest("GET", p.base+prefix+"/users", nil)
	if err != nil {
		b.Fatal(err)
	}
	for k := 0; k+1 < len(headers); k += 2 {
		req.Header.Set(headers[k], headers[k+1])
	}
	return toronSide{pid: p.pid, send: func() {
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}}
}

// keepAliveClient is a client holding one keep-alive connection, which never adds an
// Accept-Encoding of its own.
func keepAliveClient(b *testing.B) *http.Client {
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 1}
	b.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// measureToronPaired runs the paired rounds of BenchmarkToronCPUPaired over sides, each
// measured on its own Toron process.
func measureToronPaired(b *testing.B, sides [2]toronSide) {
	const toronRound = 200
	var paired [2]testnet.PairedSide
	for i, s := range sides {
		paired[i] = testnet.PairedSide{Send: s.send, CPU: func() time.Duration { return threadsCPU(b, s.pid) }}
	}
	testnet.PairedCPU(b, toronRound, paired)
}

// threadsCPU is testnet.ThreadsCPU for a benchmark: it skips where /proc cannot tell.
func threadsCPU(b *testing.B, pid int) time.Duration {
	d, err := testnet.ThreadsCPU(pid)
	if err != nil {
		b.Skip(err)
	}
	return d
}
