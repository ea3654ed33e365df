package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"toron/demo"
	"toron/internal/testnet"
)

// binPath is the toron binary built once for the process-level tests: signals and exit codes
// belong to a real process.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toron-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "toron")
	out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build toron: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startTestUpstream serves h on a loopback port until the test ends and returns its address.
func startTestUpstream(t testing.TB, h http.HandlerFunc) string {
	t.Helper()
	return testnet.ServeHTTP(t, &http.Server{Handler: h})
}

func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

func TestCheckShippedConfig(t *testing.T) {
	code, stdout, stderr := runBinary(nil, "-check", "-config", "conf/config.yaml", "-routes", "conf/routes.yaml")
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	for _, want := range []string{"elevated", "guardrail", "/legacy/upload"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("-check output lacks %q", want)
		}
	}
	if !strings.Contains(stderr, "warning") {
		t.Errorf("expected the elevated-budget warning on stderr, got %q", stderr)
	}
}

func TestCheckInvalidConfigExits2(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "config.yaml", "server:\n  read_timeout: -5s\n")
	routes := writeFile(t, dir, "routes.yaml", "routes:\n  - type: upstream\n    prefix: /api\n    target: http://127.0.0.1:1\n")
	for _, tc := range []struct{ config, names string }{
		{cfg, "read_timeout"},
		{filepath.Join(dir, "missing.yaml"), "missing.yaml"},
	} {
		code, _, stderr := runBinary(nil, "-check", "-config", tc.config, "-routes", routes)
		if code != 2 {
			t.Errorf("%s: exit %d, want 2; stderr %s", tc.config, code, stderr)
		}
		if !strings.Contains(stderr, tc.names) {
			t.Errorf("%s: the error does not name %s: %s", tc.config, tc.names, stderr)
		}
		// One clear line per error (SPEC 1): each line names what is wrong, none is a bare header.
		for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
			if !strings.HasPrefix(line, "toron: invalid configuration: ") || len(line) <= len("toron: invalid configuration: ") {
				t.Errorf("%s: stderr line %q is not one error on one line", tc.config, line)
			}
		}
	}
}

// TestBadFlagExits2WithOneLine: a mistake on the command line is one line on stderr and exit
// 2 (SPEC 1); -h alone prints the usage, and exits 0.
func TestBadFlagExits2WithOneLine(t *testing.T) {
	for _, args := range [][]string{{"-bogus"}, {"-check", "extra"}, {"-config"}} {
		code, _, out := runBinary(nil, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2; stderr %s", args, code, out)
		}
		if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "toron: ") {
			t.Errorf("%v: stderr is not one line starting with \"toron: \": %q", args, out)
		}
	}
	if code, _, out := runBinary(nil, "-h"); code != 0 || !strings.Contains(out, "-routes") {
		t.Errorf("-h: exit %d, want 0 with the usage; stderr %q", code, out)
	}
}

func TestPortInUseExits1(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	cfg := writeFile(t, dir, "config.yaml", fmt.Sprintf("server:\n  host: 127.0.0.1\n  port: %d\n", port))
	routes := writeFile(t, dir, "routes.yaml", "routes:\n  - type: upstream\n    prefix: /api\n    target: http://127.0.0.1:1\n")
	code, _, stderr := runBinary(nil, "-config", cfg, "-routes", routes)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "in use") {
		t.Errorf("want one line saying the address is in use, got %q", stderr)
	}
}

// TestGracefulShutdown sends a real SIGTERM to a real process with a request in flight:
// /health says draining during drain_delay, responses carry Connection: close, the listener
// closes after drain_delay while the in-flight request is still running, that request
// completes, and the process exits 0.
func TestGracefulShutdown(t *testing.T) {
	release := make(chan struct{})
	var held sync.WaitGroup
	held.Add(1)
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			held.Done()
			<-release
		}
		io.WriteString(w, "done")
	})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	cmd, stderr, base := startGateway(t, "  drain_delay: 2s\n  shutdown_timeout: 20s\n", "  access: true\n", "routes:\n"+upstreamRoute("/", upAddr))

	type result struct {
		status int
		body   string
		err    error
	}
	inflight := make(chan result, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			inflight <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		inflight <- result{status: resp.StatusCode, body: string(b)}
	}()
	held.Wait() // the request is in flight at the upstream
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The signal is handled asynchronously: wait (generously) for the drain to show.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for {
		resp, err := http.Get(base + "/health")
		if err != nil {
			t.Fatalf("health during drain_delay: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 503 && string(b) == `{"status":"draining"}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health during drain: %d %s", resp.StatusCode, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get(base + "/fast")
	if err != nil {
		t.Fatalf("request during drain_delay: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("request during drain: status %d, Connection: close %v", resp.StatusCode, resp.Close)
	}

	// After drain_delay the listener closes, while the in-flight request still runs (the
	// upstream holds it until release).
	addr := strings.TrimPrefix(base, "http://")
	deadline = time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("listener still accepting 10s after SIGTERM (drain_delay 2s)")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case r := <-inflight:
		t.Fatalf("the in-flight request ended before it was released: %+v", r)
	default:
	}
	releaseOnce.Do(func() { close(release) })

	r := <-inflight
	if r.err != nil || r.status != 200 || r.body != "done" {
		t.Errorf("in-flight request: %+v", r)
	}
	waitExit0(t, exited(cmd), stderr)
	if !strings.Contains(stderr.String(), `"msg":"request"`) {
		t.Errorf("no access log line on stderr: %s", stderr.String())
	}
}

// TestSignalsDuringDrain: a SIGHUP 100 ms after SIGTERM reloads but never shortens the drain
// (SPEC 9): /health keeps answering 503 draining; a second SIGTERM then ends the delay early.
func TestSignalsDuringDrain(t *testing.T) {
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
	cmd, stderr, base := startGateway(t, "  drain_delay: 60s\n  shutdown_timeout: 5s\n", "  access: false\n", "routes:\n"+upstreamRoute("/", upAddr))
	done := exited(cmd)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// For 3 s after the SIGHUP (of a 60 s drain_delay), /health must answer, and say draining
	// once the SIGTERM was handled.
	draining := false
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(base + "/health")
		if err != nil {
			t.Fatalf("health during the drain after a SIGHUP: %v (the SIGHUP ended the drain); stderr:\n%s", err, stderr.String())
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == 503 && string(b) == `{"status":"draining"}`:
			draining = true
		case draining:
			t.Fatalf("health went back to %d %s during the drain", resp.StatusCode, b)
		}
	}
	if !draining {
		t.Fatalf("/health never said draining after SIGTERM")
	}
	select {
	case err := <-done:
		t.Fatalf("the process exited during the drain: %v; stderr:\n%s", err, stderr.String())
	default:
	}
	if !strings.Contains(stderr.String(), "configuration reloaded") {
		t.Errorf("the SIGHUP during the drain was not handled as a reload; stderr:\n%s", stderr.String())
	}
	// A second SIGTERM ends the 60 s delay early.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit0(t, done, stderr, 20*time.Second) // a second SIGTERM ends the drain
}

// startBinary starts the gateway binary on cfg and routes, whose server port is port, waits
// until it answers /health and kills it when the test ends. It returns the process, its stderr
// and its base URL.
func startBinary(t testing.TB, cfg, routes string, port int) (*exec.Cmd, *testnet.Buffer, string) {
	t.Helper()
	cmd := exec.Command(binPath, "-config", cfg, "-routes", routes)
	stderr, base := startCmd(t, cmd, port)
	return cmd, stderr, base
}

func waitHealthy(t testing.TB, base string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("gateway at %s never became healthy", base)
}

func TestDemoModeServes(t *testing.T) {
	port := testnet.FreePort(t)
	cmd, stdout := startDemo(t, "-demo", fmt.Sprintf("TORON_SERVER__PORT=%d", port))
	banner := make(chan string, 1)
	go func() {
		var b strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
		}
		banner <- b.String()
	}()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, base)
	if code, b := get(t, nil, base+"/api/users"); code != 200 || !strings.Contains(b, `"service":"api"`) {
		t.Errorf("demo /api: %d %s", code, b)
	}
	// The rate-limited demo route: a burst of 3 tokens, then 429s (SPEC 17).
	if got := demoBurst(t, base+"/api/limited/x"); !strings.HasPrefix(got, "200 200") || !strings.HasSuffix(got, "429") {
		t.Errorf("demo /api/limited: %s, want 200s then 429", got)
	}
	// With redis-server installed, the demo runs its own and limits /api/global in it.
	_, lookErr := exec.LookPath("redis-server")
	withRedis := lookErr == nil
	if withRedis {
		if got := demoBurst(t, base+"/api/global/x"); !strings.HasPrefix(got, "200 200 200") || !strings.HasSuffix(got, "429") {
			t.Errorf("demo /api/global: %s, want 200s then 429", got)
		}
	}
	stopBinary(t, cmd, nil)
	out := <-banner
	if !strings.Contains(out, "curl") {
		t.Errorf("banner has no curl commands: %q", out)
	}
	if !withRedis {
		return
	}
	_, addr, ok := strings.Cut(out, "in the demo's own redis-server on ")
	addr, _, _ = strings.Cut(addr, " ")
	if !ok || !strings.Contains(out, "/api/global/x") {
		t.Fatalf("banner does not show the global route: %q", out)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("the demo's redis-server on %s still answers after the demo exited", addr)
	}
}

// demoBurst makes 5 quick requests to url and returns their status codes.
func demoBurst(t *testing.T, url string) string {
	t.Helper()
	var codes []string
	for range 5 {
		codes = append(codes, fmt.Sprint(statusOf(t, url)))
	}
	return strings.Join(codes, " ")
}

// TestReloadOnSIGHUP: a real SIGHUP re-reads both files; an invalid configuration and a changed
// port are refused with a logged error while the old configuration keeps serving.
func TestReloadOnSIGHUP(t *testing.T) {
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Path)
	})

	g := writeGateway(t, "  drain_delay: 0s\n", "  level: info\n  access: false\n", "routes:\n"+upstreamRoute("/a", upAddr))
	dir := g.dir
	cmd, stderr, base := g.start(t)
	if statusOf(t, base+"/b/x") != 404 {
		t.Fatal("route /b exists before the reload")
	}

	writeFile(t, dir, "routes.yaml", "routes:\n"+upstreamRoute("/a", upAddr)+upstreamRoute("/b", upAddr))
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, stderr, "route /b not served after SIGHUP", func() bool { return statusOf(t, base+"/b/x") == 200 })

	writeFile(t, dir, "routes.yaml", "routes:\n  - type: upstream\n    prefix: nope\n    target: http://x\n")
	cmd.Process.Signal(syscall.SIGHUP)
	waitLogged(t, stderr, "reload refused", "invalid reload not logged")
	if statusOf(t, base+"/a/x") != 200 || statusOf(t, base+"/b/x") != 200 {
		t.Errorf("old configuration stopped serving after an invalid reload")
	}

	writeFile(t, dir, "routes.yaml", "routes:\n"+upstreamRoute("/a", upAddr)+upstreamRoute("/b", upAddr))
	writeFile(t, dir, "config.yaml", serverYAML(g.port+1, "  drain_delay: 0s\n", "  level: info\n  access: false\n"))
	cmd.Process.Signal(syscall.SIGHUP)
	waitLogged(t, stderr, "server.port", "port change not refused")

	_, metrics := get(t, nil, base+"/metrics")
	for _, want := range []string{"toron_config_reloads_total 1", "toron_config_reload_errors_total 2"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	stopBinary(t, cmd, stderr)
}

// TestReloadLogFormatNamesTheRunningEncoder: log.format applies at the next start, so a reload
// that asks for another format is warned about, with the format still in use; one that asks for
// the running format again is not, whatever the reloads in between asked for.
func TestReloadLogFormatNamesTheRunningEncoder(t *testing.T) {
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
	logLines := func(format string) string { return "  format: " + format + "\n  access: false\n" }
	g := writeGateway(t, "  drain_delay: 0s\n", logLines("json"), "routes:\n"+upstreamRoute("/a", upAddr))
	cmd, stderr, _ := g.start(t)
	reloadTo := func(format string, reloads int) {
		t.Helper()
		writeFile(t, g.dir, "config.yaml", serverYAML(g.port, "  drain_delay: 0s\n", logLines(format)))
		cmd.Process.Signal(syscall.SIGHUP)
		waitFor(t, stderr, fmt.Sprintf("reload %d not logged", reloads), func() bool {
			return strings.Count(stderr.String(), "configuration reloaded") >= reloads
		})
	}
	reloadTo("console", 1)
	reloadTo("json", 2)
	logged := stderr.String()
	if n := strings.Count(logged, "log.format changes at the next start"); n != 1 {
		t.Errorf("%d format warnings, want 1 (for console only); stderr:\n%s", n, logged)
	}
	if !strings.Contains(logged, `"running":"json","configured":"console"`) {
		t.Errorf("the warning does not name the running json encoder; stderr:\n%s", logged)
	}
	stopBinary(t, cmd, stderr)
}

// TestMetricsAreTyped: every family on /metrics carries its # TYPE line before its samples,
// so that Prometheus ingests counters, gauges and histograms as such rather than untyped.
func TestMetricsAreTyped(t *testing.T) {
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
	cmd, stderr, base := startGateway(t, "  drain_delay: 0s\n", "  access: false\n", "routes:\n"+upstreamRoute("/a", upAddr))
	statusOf(t, base+"/a/x")
	_, b := get(t, nil, base+"/metrics")
	want := map[string]string{
		"toron_requests_total": "counter", "toron_rejected_total": "counter",
		"toron_route_inflight": "gauge", "toron_route_max_concurrency": "gauge",
		"toron_workers_busy": "gauge", "toron_workers_max": "gauge", "toron_elevated_inflight": "gauge",
		"toron_request_duration_seconds": "histogram", "toron_upstream_header_wait_seconds": "histogram",
		"toron_request_body_bytes_total": "counter", "toron_response_body_bytes_total": "counter",
		"toron_connections_open": "gauge", "toron_config_reloads_total": "counter",
		"toron_config_reload_errors_total": "counter",
	}
	typed := map[string]string{}
	for _, line := range strings.Split(b, "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			typed[name] = typ
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		family := line[:strings.IndexAny(line, "{ ")]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(family, suffix); ok && want[base] == "histogram" {
				family = base
			}
		}
		if typed[family] == "" {
			t.Errorf("sample %q comes before any # TYPE line of %s", line, family)
		}
	}
	for name, typ := range want {
		if typed[name] != typ {
			t.Errorf("# TYPE %s is %q, want %q", name, typed[name], typ)
		}
	}
	stopBinary(t, cmd, stderr)
}

// TestConfigValuesThatBrokeAtRunTime: each value of issue 14 that passed -check and then broke
// the running gateway is a configuration error naming the file and the key, with -check and
// when the gateway starts (exit 2 both times, nothing served).
func TestConfigValuesThatBrokeAtRunTime(t *testing.T) {
	okRoutes := "routes:\n  - type: upstream\n    prefix: /api\n    target: http://127.0.0.1:1\n"
	for _, tc := range []struct {
		name, server, routes, key string
	}{
		{"upstream_idle_timeout 1ns", "  upstream_idle_timeout: 1ns\n", okRoutes, "server.upstream_idle_timeout"},
		{"read_timeout 1ns", "  read_timeout: 1ns\n", okRoutes, "server.read_timeout"},
		{"response_header_timeout a week", "  response_header_timeout: 168h\n", okRoutes, "server.response_header_timeout"},
		{"max_header_bytes 1TiB", "  max_header_bytes: 1TiB\n", okRoutes, "server.max_header_bytes"},
		{"stream_threshold_bytes max int64", "  stream_threshold_bytes: 9223372036854775807\n", okRoutes, "server.stream_threshold_bytes"},
		{"health_path encoded", "  health_path: /st%61tus\n", okRoutes, "server.health_path"},
		{"prefix encoded", "", "routes:\n  - type: upstream\n    prefix: /api%2Dv1\n    target: http://127.0.0.1:1\n", "routes[0] (/api%2Dv1): prefix"},
		{"route connect_timeout 1ns", "", okRoutes + "    connect_timeout: 1ns\n", "routes[0] (/api): connect_timeout"},
		// Issue 25.
		{"health_check interval 1ns", "", okRoutes + "    health_check: {path: /h, interval: 1ns}\n", "routes[0] (/api): health_check"},
		{"max_eject_time overflowing", "", okRoutes + "    passive_health: {max_eject_time: 2000000h}\n", "routes[0] (/api): passive_health"},
		{"tunnel_idle_timeout 1ns", "", okRoutes + "    websocket: true\n    tunnel_idle_timeout: 1ns\n", "routes[0] (/api): tunnel_idle_timeout"},
		{"proxy_protocol timeout 1ns", "  proxy_protocol: {enabled: true, timeout: 1ns}\n", okRoutes, "server.proxy_protocol.timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			port := testnet.FreePort(t)
			cfg := writeFile(t, dir, "config.yaml", fmt.Sprintf("server:\n  host: 127.0.0.1\n  port: %d\n%s", port, tc.server))
			routes := writeFile(t, dir, "routes.yaml", tc.routes)
			for _, args := range [][]string{{"-check"}, {}} {
				cmd := exec.Command(binPath, append(args, "-config", cfg, "-routes", routes)...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := exited(cmd)
				select {
				case err := <-done:
					if code := exitCode(err); code != 2 {
						t.Errorf("%v: exit %d, want 2; stderr %s", args, code, stderr.String())
					}
				case <-time.After(10 * time.Second):
					_ = cmd.Process.Kill()
					<-done
					t.Fatalf("%v: still running after 10s: the value was accepted", args)
				}
				file := "config.yaml"
				if tc.server == "" {
					file = "routes.yaml"
				}
				if out := stderr.String(); !strings.Contains(out, file+": "+tc.key+": ") {
					t.Errorf("%v: the error does not name %s and %s: %s", args, file, tc.key, out)
				}
			}
		})
	}
}

// TestCheckWarnsOpenProxyProtocol: -check warns when proxy_protocol is on with an empty allow
// on a listener that is not loopback (anyone who reaches it could choose their client IP, hence
// their rate-limit key), and not when the listener is loopback or allow is set.
func TestCheckWarnsOpenProxyProtocol(t *testing.T) {
	routes := "routes:\n  - type: upstream\n    prefix: /api\n    target: http://127.0.0.1:1\n"
	for _, tc := range []struct {
		server string
		warns  bool
	}{
		{"  host: 0.0.0.0\n  proxy_protocol: {enabled: true}\n", true},
		{"  host: \"::\"\n  proxy_protocol: {enabled: true, allow: []}\n", true},
		{"  host: 10.1.2.3\n  proxy_protocol: {enabled: true}\n", true},
		{"  host: 127.0.0.1\n  proxy_protocol: {enabled: true}\n", false},
		{"  host: localhost\n  proxy_protocol: {enabled: true}\n", false},
		{"  host: 0.0.0.0\n  proxy_protocol: {enabled: true, allow: [10.0.0.0/8]}\n", false},
		{"  host: 0.0.0.0\n", false},
	} {
		dir := t.TempDir()
		cfg := writeFile(t, dir, "config.yaml", "server:\n"+tc.server)
		code, _, stderr := runBinary(nil, "-check", "-config", cfg, "-routes", writeFile(t, dir, "routes.yaml", routes))
		if code != 0 {
			t.Fatalf("%q: exit %d, want 0; stderr %s", tc.server, code, stderr)
		}
		got := strings.Contains(stderr, "server.proxy_protocol: enabled with an empty allow")
		if got != tc.warns {
			t.Errorf("%q: warned %v, want %v; stderr %s", tc.server, got, tc.warns, stderr)
		}
	}
}

// TestCheckElevatedBudgetExact: -check prints the elevated budget floor(100 × 0.29) = 29, not
// the float64 product's 28.
func TestCheckElevatedBudgetExact(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "config.yaml", "server:\n  worker_pool_size: 100\n  elevated_share: 0.29\n")
	routes := writeFile(t, dir, "routes.yaml", "routes:\n  - type: upstream\n    prefix: /api\n    target: http://127.0.0.1:1\n")
	code, out, stderr := runBinary(nil, "-check", "-config", cfg, "-routes", routes)
	if code != 0 {
		t.Fatalf("exit %d; stderr %s", code, stderr)
	}
	var v struct {
		Budget int `json:"elevated_budget"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.Budget != 29 {
		t.Errorf("elevated_budget %d, want 29", v.Budget)
	}
}

// TestSIGTERMWithOpenTunnel: on SIGTERM an open tunnel keeps working through drain_delay, is
// closed by the end of shutdown_timeout, the process exits 0 and the tunnel's access line is
// written.
func TestSIGTERMWithOpenTunnel(t *testing.T) {
	ws := demo.ServeWSEcho(testnet.Listen(t), true) // the load test's raw echo: bytes back as they come
	t.Cleanup(func() { _ = ws.Close() })
	up := ws.Addr()
	cmd, stderr, base := startGateway(t, "  drain_delay: 1s\n  shutdown_timeout: 2s\n", "  access: true\n", "routes:\n"+upstreamRoute("/ws", up)+"    websocket: true\n")

	c := testnet.Dial(t, strings.TrimPrefix(base, "http://"))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	echo := func(msg string) error {
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		b := make([]byte, len(msg))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(br, b); err != nil {
			return err
		}
		if string(b) != msg {
			return fmt.Errorf("echo %q", b)
		}
		return nil
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := echo("during the drain delay"); err != nil {
		t.Errorf("tunnel during drain_delay: %v", err)
	}
	// Closed at the latest when shutdown_timeout (2s after the 1s delay) ends.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = br.ReadByte()
	closedAfter := time.Since(start)
	if err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("tunnel not closed by the shutdown: %v", err)
	}
	if closedAfter < 900*time.Millisecond || closedAfter > 6*time.Second {
		t.Errorf("tunnel closed %s after SIGTERM, want between drain_delay and drain_delay + shutdown_timeout", closedAfter)
	}
	waitExit0(t, exited(cmd), stderr)
	if log := stderr.String(); !strings.Contains(log, `"msg":"tunnel"`) || !strings.Contains(log, `"status":101`) {
		t.Errorf("no tunnel access line:\n%s", log)
	}
}
