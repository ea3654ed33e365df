package conf

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// mustLoad loads config and routes YAML text and fails the test on any error.
func mustLoad(t *testing.T, config, routes string, environ ...string) *Config {
	t.Helper()
	cfg, err := loadStrings(config, routes, environ...)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return cfg
}

// findRoute returns the route named name.
// checkJSONHas fails the test for each of want that cfg's -check JSON, compacted, lacks.
func checkJSONHas(t *testing.T, cfg *Config, want ...string) {
	t.Helper()
	indented, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, indented); err != nil {
		t.Fatal(err)
	}
	for _, s := range want {
		if !strings.Contains(compact.String(), s) {
			t.Errorf("-check lacks %s:\n%s", s, indented)
		}
	}
}

func findRoute(t *testing.T, cfg *Config, name string) Route {
	t.Helper()
	for _, r := range cfg.Routes {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no route named %q", name)
	return Route{}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	// Demo mode: no config file at all.
	cfg, err := LoadBytes("", nil, "demo routes", []byte(okRoute), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Server{
		Host:                  "0.0.0.0",
		Port:                  8080,
		WorkerPoolSize:        128,
		WorkerQueueTimeout:    50 * time.Millisecond,
		ElevatedShare:         0.25,
		MaxConnections:        64 * 128,
		ReadTimeout:           5 * time.Second,
		WriteTimeout:          5 * time.Second,
		ResponseHeaderTimeout: 10 * time.Second,
		ConnectTimeout:        3 * time.Second,
		IdleTimeout:           5 * time.Second,
		UpstreamIdleTimeout:   30 * time.Second,
		MaxBodyBytes:          4194304,
		MaxHeaderBytes:        8192,
		MinProgressBytes:      1024,
		StreamThresholdBytes:  65536,
		InboundChunkedMode:    "normalize",
		ShutdownTimeout:       30 * time.Second,
		DrainDelay:            5 * time.Second,
		HealthPath:            "/health",
		MetricsPath:           "/metrics",
		TrustedProxies:        []string{},
		ProxyProtocol:         ProxyProtocol{Allow: []string{}, Timeout: 5 * time.Second},
		Tracing:               Tracing{SampleRatio: 0.01, ServiceName: "toron", TrustIncoming: true},
	}
	if !reflect.DeepEqual(cfg.Server, want) {
		t.Errorf("server defaults\n got %+v\nwant %+v", cfg.Server, want)
	}
	if wantLog := (Log{Level: "info", Format: "json", Access: true}); cfg.Log != wantLog {
		t.Errorf("log defaults = %+v, want %+v", cfg.Log, wantLog)
	}
	if cfg.ConfigFile != "" || cfg.RoutesFile != "demo routes" {
		t.Errorf("files = %q, %q", cfg.ConfigFile, cfg.RoutesFile)
	}
	if cfg.ElevatedBudget() != 32 {
		t.Errorf("ElevatedBudget = %d, want 32", cfg.ElevatedBudget())
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings = %q", cfg.Warnings)
	}

	// Empty sections and an explicitly empty route table are valid, with a warning.
	cfg = mustLoad(t, "server:\nlog:\n", "routes: []\n")
	if !reflect.DeepEqual(cfg.Server, want) || len(cfg.Routes) != 0 {
		t.Errorf("empty sections changed the defaults: %+v", cfg.Server)
	}
	if len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0], "no routes:") {
		t.Errorf("warnings = %q, want the no-routes warning", cfg.Warnings)
	}
}

func TestFileOverrides(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `
server:
  host: 127.0.0.1
  port: 9000
  worker_pool_size: 40
  worker_queue_timeout: 0s
  elevated_share: 0.5
  read_timeout: 7s
  write_timeout: 1m30s
  max_body_bytes: 1MiB
  max_header_bytes: 16KiB
  min_progress_bytes: 0
  stream_threshold_bytes: 0
  inbound_chunked_mode: passthrough
  shutdown_timeout: 0s
  drain_delay: 0s
  health_path: /healthz
  metrics_path: /internal/metrics
log:
  level: DEBUG
  format: console
  access: false
`, okRoute)
	s := cfg.Server
	if s.Host != "127.0.0.1" || s.Port != 9000 || s.WorkerPoolSize != 40 || s.ElevatedShare != 0.5 {
		t.Errorf("listener/pool = %+v", s)
	}
	// Derived defaults follow the overridden keys.
	if s.MaxConnections != 64*40 || s.IdleTimeout != 7*time.Second {
		t.Errorf("MaxConnections, IdleTimeout = %d, %s; want %d, 7s", s.MaxConnections, s.IdleTimeout, 64*40)
	}
	if s.WriteTimeout != 90*time.Second || s.MaxBodyBytes != 1<<20 || s.MaxHeaderBytes != 16<<10 {
		t.Errorf("timeouts/sizes = %+v", s)
	}
	// Zero is meaningful for these keys (documented on checkServer).
	if s.WorkerQueueTimeout != 0 || s.MinProgressBytes != 0 || s.StreamThresholdBytes != 0 || s.ShutdownTimeout != 0 || s.DrainDelay != 0 {
		t.Errorf("zero values not kept: %+v", s)
	}
	if s.InboundChunkedMode != "passthrough" || s.HealthPath != "/healthz" || s.MetricsPath != "/internal/metrics" {
		t.Errorf("mode/paths = %+v", s)
	}
	if cfg.Log != (Log{Level: "debug", Format: "console", Access: false}) {
		t.Errorf("log = %+v", cfg.Log)
	}
	if cfg.ElevatedBudget() != 20 {
		t.Errorf("ElevatedBudget = %d, want 20", cfg.ElevatedBudget())
	}
	// Explicit derived keys win over the derivation.
	cfg = mustLoad(t, "server: {max_connections: 100, idle_timeout: 60s}", okRoute)
	if cfg.Server.MaxConnections != 100 || cfg.Server.IdleTimeout != time.Minute {
		t.Errorf("explicit MaxConnections, IdleTimeout = %d, %s", cfg.Server.MaxConnections, cfg.Server.IdleTimeout)
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "server: {port: 8081, read_timeout: 6s}\nlog: {level: warn}\n", okRoute,
		"TORON_SERVER__PORT=9090",
		"TORON_SERVER__READ_TIMEOUT=10s",
		"TORON_LOG__LEVEL=debug",
		"TORON_SERVER__MAX_BODY_BYTES=8MiB",
		"TORON_SERVER__ELEVATED_SHARE=0.5",
		"TORON_LOG__ACCESS=false",
		// Not configuration keys: ignored, not errors.
		"TORON_FOO=1",
		"TORON_CONFIG=x",
		"TORON_ROUTES=/nowhere/routes.yaml",
		"TORON_SERVERPORT=1",
		"PATH=/usr/bin",
		"NOEQUALSSIGN",
	)
	s := cfg.Server
	if s.Port != 9090 || s.ReadTimeout != 10*time.Second || s.MaxBodyBytes != 8<<20 || s.ElevatedShare != 0.5 {
		t.Errorf("environment did not override the file: %+v", s)
	}
	if s.IdleTimeout != 10*time.Second {
		t.Errorf("IdleTimeout = %s, want read_timeout from the environment", s.IdleTimeout)
	}
	if cfg.Log.Level != "debug" || cfg.Log.Access {
		t.Errorf("log = %+v", cfg.Log)
	}
	// Keys the environment does not set keep the file's value.
	cfg = mustLoad(t, "server: {port: 8081}", okRoute, "TORON_SERVER__WRITE_TIMEOUT=7s")
	if cfg.Server.Port != 8081 || cfg.Server.WriteTimeout != 7*time.Second {
		t.Errorf("port, write_timeout = %d, %s", cfg.Server.Port, cfg.Server.WriteTimeout)
	}
	// A later duplicate of a variable wins, like in a shell.
	cfg = mustLoad(t, "", okRoute, "TORON_SERVER__PORT=1111", "TORON_SERVER__PORT=2222")
	if cfg.Server.Port != 2222 {
		t.Errorf("port = %d, want 2222", cfg.Server.Port)
	}
}

// TestEnvironmentErrorKeepsFileValue checks that a refused variable is reported once, and
// does not also surface as an error on the file's key.
func TestEnvironmentErrorKeepsFileValue(t *testing.T) {
	t.Parallel()
	_, err := loadStrings("server: {port: 8081}", okRoute, "TORON_SERVER__PORT=eighty")
	errs := configErrors(t, err)
	if len(errs) != 1 || errs[0].File != EnvironmentSource || errs[0].Key != "TORON_SERVER__PORT" {
		t.Fatalf("errors = %v", err)
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	ok := map[string]int64{
		"0":          0,
		"1024":       1024,
		"-1":         -1,
		"512B":       512,
		"8KiB":       8 << 10,
		"8kib":       8 << 10,
		"4MiB":       4 << 20,
		"200MiB":     209715200,
		"500 MiB":    524288000,
		"1GiB":       1 << 30,
		"2TiB":       2 << 40,
		" 16KiB ":    16 << 10,
		"8388608":    8388608,
		"8589934592": 8 << 30,
	}
	for in, want := range ok {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "4MB", "4M", "1.5MiB", "KiB", "0x10", "4 Mi B", "9223372036854775808", "9000000TiB", "MiB4"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
	// The same strings are accepted in files and in the environment.
	cfg := mustLoad(t, `server: {max_body_bytes: "200MiB", max_header_bytes: 8KiB}`, okRoute, "TORON_SERVER__MIN_PROGRESS_BYTES=2KiB")
	if cfg.Server.MaxBodyBytes != 200<<20 || cfg.Server.MaxHeaderBytes != 8<<10 || cfg.Server.MinProgressBytes != 2<<10 {
		t.Errorf("sizes = %+v", cfg.Server)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"0", "1024", "-1", "8KiB", "200MiB", "1 GiB", "4MB", "lots", "9000000TiB", "-9223372036854775808"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			return
		}
		// Whatever parses must be the digits times a unit, never a wrapped-around value.
		if n != 0 && strings.HasPrefix(strings.TrimSpace(s), "-") != (n < 0) {
			t.Fatalf("parseSize(%q) = %d: sign flipped", s, n)
		}
	})
}

func TestRouteDefaults(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "", route(
		`type: upstream, prefix: /api, target: "http://127.0.0.1:9001"`,
		`type: upstream, prefix: /api, host: API.Example.COM, target: "http://127.0.0.1:9001"`,
		`type: upstream, prefix: /api, methods: [GET, POST], target: "http://127.0.0.1:9001"`,
		`type: upstream, prefix: /api, host: "*.Example.com", methods: [DELETE], target: "https://10.0.0.1:8443"`,
		`type: upstream, prefix: /x, name: custom, target: "http://127.0.0.1:9001"`,
	))
	names := make([]string, 0, len(cfg.Routes))
	for _, r := range cfg.Routes {
		names = append(names, r.Name)
	}
	want := []string{"/api", "api.example.com/api", "/api GET,POST", "*.example.com/api DELETE", "custom"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("names = %q, want %q", names, want)
	}
	if cfg.Routes[1].Host != "api.example.com" {
		t.Errorf("host not lower-cased: %q", cfg.Routes[1].Host)
	}
}

func TestGuardrail(t *testing.T) {
	t.Parallel()
	const up = `type: upstream, target: "http://127.0.0.1:9000", `
	cfg := mustLoad(t, "", route(
		up+"prefix: /fast",
		up+"prefix: /tighter, read_timeout: 2s, max_body_bytes: 1KiB, min_progress_bytes: 4KiB",
		up+"prefix: /body, max_body_bytes: 200MiB",
		up+"prefix: /read, read_timeout: 10s",
		up+"prefix: /write, write_timeout: 30s",
		up+"prefix: /headers, response_header_timeout: 1m",
		up+"prefix: /drip, min_progress_bytes: 512",
		up+"prefix: /explicit, read_timeout: 10s, max_concurrency: 4",
		up+"prefix: /bulkhead, max_concurrency: 100",
		up+"prefix: /pool, max_upstream_conns: 7, read_timeout: 10s",
		up+"prefix: /connect, connect_timeout: 30s",
	))
	cases := []struct {
		name      string
		elevated  bool
		reasons   []string
		maxConc   int
		source    string
		upstreams int
	}{
		{"/fast", false, nil, 0, SourceUnlimited, DefaultMaxUpstreamConns},
		{"/tighter", false, nil, 0, SourceUnlimited, DefaultMaxUpstreamConns},
		{"/body", true, []string{"max_body_bytes 209715200 > server 4194304"}, 32, SourceGuardrail, 32},
		{"/read", true, []string{"read_timeout 10s > server 5s"}, 32, SourceGuardrail, 32},
		{"/write", true, []string{"write_timeout 30s > server 5s"}, 32, SourceGuardrail, 32},
		{"/headers", true, []string{"response_header_timeout 1m > server 10s"}, 32, SourceGuardrail, 32},
		{"/drip", true, []string{"min_progress_bytes 512 < server 1024"}, 32, SourceGuardrail, 32},
		{"/explicit", true, []string{"read_timeout 10s > server 5s"}, 4, SourceExplicit, 4},
		{"/bulkhead", false, nil, 100, SourceExplicit, 100},
		{"/pool", true, []string{"read_timeout 10s > server 5s"}, 32, SourceGuardrail, 7},
		// connect_timeout is not one of the guardrail's limits (SPEC 2).
		{"/connect", false, nil, 0, SourceUnlimited, DefaultMaxUpstreamConns},
	}
	for _, tc := range cases {
		e := findRoute(t, cfg, tc.name).Effective
		if e.Elevated != tc.elevated || !reflect.DeepEqual(e.ElevatedReasons, tc.reasons) {
			t.Errorf("%s: elevated, reasons = %v, %q; want %v, %q", tc.name, e.Elevated, e.ElevatedReasons, tc.elevated, tc.reasons)
		}
		if e.MaxConcurrency != tc.maxConc || e.MaxConcurrencySource != tc.source || e.MaxUpstreamConns != tc.upstreams {
			t.Errorf("%s: max_concurrency %d (%s), upstreams %d; want %d (%s), %d",
				tc.name, e.MaxConcurrency, e.MaxConcurrencySource, e.MaxUpstreamConns, tc.maxConc, tc.source, tc.upstreams)
		}
	}
	// Several reasons are all listed, in key order.
	e := mustLoad(t, "", route(up+"prefix: /all, max_body_bytes: 5MiB, read_timeout: 6s, write_timeout: 6s, response_header_timeout: 11s, min_progress_bytes: 1")).Routes[0].Effective
	wantReasons := []string{
		"max_body_bytes 5242880 > server 4194304",
		"read_timeout 6s > server 5s",
		"write_timeout 6s > server 5s",
		"response_header_timeout 11s > server 10s",
		"min_progress_bytes 1 < server 1024",
	}
	if !reflect.DeepEqual(e.ElevatedReasons, wantReasons) {
		t.Errorf("reasons = %q, want %q", e.ElevatedReasons, wantReasons)
	}

	// The guardrail value follows worker_pool_size: min(32, pool/4), at least 1.
	for pool, want := range map[int]int{128: 32, 1000: 32, 40: 10, 7: 1, 2: 1, 1: 1} {
		cfg := mustLoad(t, "server: {worker_pool_size: "+strconv.Itoa(pool)+"}", route(up+"prefix: /read, read_timeout: 10s"))
		if got := cfg.Routes[0].Effective.MaxConcurrency; got != want {
			t.Errorf("worker_pool_size %d: guardrail max_concurrency = %d, want %d", pool, got, want)
		}
	}
}

func TestEffectiveInherits(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "server: {read_timeout: 7s, connect_timeout: 1s, inbound_chunked_mode: passthrough}",
		route(`type: upstream, prefix: /a, target: "http://127.0.0.1:1", inbound_chunked_mode: normalize, stream_request_body: false`,
			`type: upstream, prefix: /b, target: "http://127.0.0.1:1", stream_request_body: true, connect_timeout: 2s`))
	a, b := cfg.Routes[0].Effective, cfg.Routes[1].Effective
	if a.ReadTimeout != 7*time.Second || a.ConnectTimeout != time.Second || a.InboundChunkedMode != "normalize" || a.StreamRequestBody != StreamNever {
		t.Errorf("/a effective = %+v", a)
	}
	if b.InboundChunkedMode != "passthrough" || b.ConnectTimeout != 2*time.Second || b.StreamRequestBody != StreamAlways || b.MaxBodyBytes != DefaultMaxBodyBytes {
		t.Errorf("/b effective = %+v", b)
	}
	// stream_request_body: false is fine up to exactly 8 MiB.
	mustLoad(t, "", route(`type: upstream, prefix: /a, target: "http://127.0.0.1:1", stream_request_body: false, max_body_bytes: 8MiB`))
}

func TestElevatedBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pool  int
		share float64
		want  int
	}{{128, 0.25, 32}, {128, 1, 128}, {10, 0.25, 2}, {3, 0.25, 1}, {1, 0.01, 1}, {100, 0.333, 33}} {
		c := &Config{Server: Server{WorkerPoolSize: tc.pool, ElevatedShare: tc.share}}
		if got := c.ElevatedBudget(); got != tc.want {
			t.Errorf("ElevatedBudget(%d × %v) = %d, want %d", tc.pool, tc.share, got, tc.want)
		}
	}
}

func TestBudgetWarning(t *testing.T) {
	t.Parallel()
	const up = `type: upstream, target: "http://127.0.0.1:9000", `
	// 16 + 8 = 24 <= 32: no warning.
	cfg := mustLoad(t, "", route(up+"prefix: /a, read_timeout: 10s, max_concurrency: 16", up+"prefix: /b, read_timeout: 10s, max_concurrency: 8", up+"prefix: /fast"))
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings = %q, want none", cfg.Warnings)
	}
	// 16 + 8 + 32 (guardrail) > 32.
	cfg = mustLoad(t, "", route(up+"prefix: /a, read_timeout: 10s, max_concurrency: 16", up+"prefix: /fast", up+"prefix: /b, read_timeout: 10s, max_concurrency: 8", up+"prefix: /c, max_body_bytes: 1GiB, name: bulk"))
	want := []string{"elevated routes /a (16), /b (8), bulk (32) may hold 56 workers together but share an elevated budget of 32: they cannot all be full at once"}
	if !reflect.DeepEqual(cfg.Warnings, want) {
		t.Errorf("warnings\n got %q\nwant %q", cfg.Warnings, want)
	}
}

// TestLargeStreamThresholdWarning: a threshold above 8 MiB is legal but buffers large bodies
// whole on the routes whose ceiling allows them, which -check and a reload warn about; 8 MiB
// exactly, a route with a smaller ceiling, and a route that always streams do not.
func TestLargeStreamThresholdWarning(t *testing.T) {
	t.Parallel()
	const up = `type: upstream, target: "http://127.0.0.1:9000", `
	if cfg := mustLoad(t, "server:\n  stream_threshold_bytes: 8MiB\n", route(up+"prefix: /a, max_body_bytes: 1GiB")); len(cfg.Warnings) != 0 {
		t.Errorf("8 MiB: warnings = %q, want none", cfg.Warnings)
	}
	cfg := mustLoad(t, "server:\n  stream_threshold_bytes: 100MiB\n", route(
		up+"prefix: /small",
		up+"prefix: /big, max_body_bytes: 1GiB, max_concurrency: 4",
		up+"prefix: /mid, max_body_bytes: 20MiB, max_concurrency: 4",
		up+"prefix: /streams, max_body_bytes: 1GiB, max_concurrency: 4, stream_request_body: true, inbound_chunked_mode: passthrough",
	))
	want := []string{"stream_threshold_bytes 104857600 is above 8 MiB: routes /big (104857600), /mid (20971520) buffer bodies of up to that many bytes whole in memory, one per busy worker (worker_pool_size 128)"}
	if !reflect.DeepEqual(cfg.Warnings, want) {
		t.Errorf("warnings\n got %q\nwant %q", cfg.Warnings, want)
	}
}

// TestLargeHeaderBufferWarning: max_header_bytes sizes every connection's read buffer.
func TestLargeHeaderBufferWarning(t *testing.T) {
	t.Parallel()
	const up = `type: upstream, target: "http://127.0.0.1:9000", prefix: /a`
	if cfg := mustLoad(t, "server:\n  max_header_bytes: 64KiB\n", route(up)); len(cfg.Warnings) != 0 {
		t.Errorf("64 KiB: warnings = %q, want none", cfg.Warnings)
	}
	cfg := mustLoad(t, "server:\n  max_header_bytes: 1MiB\n  worker_pool_size: 4\n", route(up))
	want := []string{"max_header_bytes 1048576 is above 64 KiB: it is the read buffer of every open connection, up to 256 of them (max_connections)"}
	if !reflect.DeepEqual(cfg.Warnings, want) {
		t.Errorf("warnings\n got %q\nwant %q", cfg.Warnings, want)
	}
}

// TestShippedFiles loads conf/config.yaml and conf/routes.yaml, the seed's recipes.
func TestShippedFiles(t *testing.T) {
	t.Parallel()
	cfg, err := Load("config.yaml", "routes.yaml", []string{"TORON_CONFIG=config.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := LoadBytes("", nil, "routes.yaml", []byte("routes: []"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Server, defaults.Server) || cfg.Log != defaults.Log {
		t.Errorf("config.yaml differs from the built-in defaults:\n file %+v\n  def %+v", cfg.Server, defaults.Server)
	}
	if cfg.ConfigFile != "config.yaml" || cfg.RoutesFile != "routes.yaml" {
		t.Errorf("files = %q, %q", cfg.ConfigFile, cfg.RoutesFile)
	}
	// What a route inherits from the shipped server section, then each route's own values.
	inherited := Effective{
		MaxBodyBytes: 4194304, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		ResponseHeaderTimeout: 10 * time.Second, ConnectTimeout: 3 * time.Second, MinProgressBytes: 1024,
		InboundChunkedMode: "normalize", StreamRequestBody: StreamAuto,
	}
	with := func(set func(e *Effective)) Effective { e := inherited; set(&e); return e }
	want := map[string]Effective{
		"/legacy/upload": with(func(e *Effective) {
			e.MaxBodyBytes, e.ReadTimeout = 209715200, 10*time.Second
			e.MaxConcurrency, e.MaxConcurrencySource, e.MaxUpstreamConns = 16, SourceExplicit, 16
			e.StreamRequestBody, e.Elevated = StreamAlways, true
			e.ElevatedReasons = []string{"max_body_bytes 209715200 > server 4194304", "read_timeout 10s > server 5s"}
		}),
		"/api": with(func(e *Effective) {
			e.MaxConcurrency, e.MaxConcurrencySource, e.MaxUpstreamConns = 0, SourceUnlimited, 512
		}),
		"/legacy/reports": with(func(e *Effective) {
			e.WriteTimeout, e.ResponseHeaderTimeout = 30*time.Second, 60*time.Second
			e.MaxConcurrency, e.MaxConcurrencySource, e.MaxUpstreamConns = 8, SourceExplicit, 8
			e.Elevated = true
			e.ElevatedReasons = []string{"write_timeout 30s > server 5s", "response_header_timeout 1m > server 10s"}
		}),
		"/legacy/stream-upload": with(func(e *Effective) {
			e.MaxBodyBytes, e.ReadTimeout, e.InboundChunkedMode = 524288000, 15*time.Second, "passthrough"
			e.MaxConcurrency, e.MaxConcurrencySource, e.MaxUpstreamConns = 32, SourceGuardrail, 32
			e.StreamRequestBody, e.Elevated = StreamAlways, true
			e.ElevatedReasons = []string{"max_body_bytes 524288000 > server 4194304", "read_timeout 15s > server 5s"}
		}),
	}
	if len(cfg.Routes) != len(want) {
		t.Fatalf("%d routes, want %d", len(cfg.Routes), len(want))
	}
	targets := map[string]string{"/legacy/upload": "http://127.0.0.1:9000", "/api": "http://127.0.0.1:9001", "/legacy/reports": "http://127.0.0.1:9003", "/legacy/stream-upload": "http://127.0.0.1:9002"}
	for name, e := range want {
		r := findRoute(t, cfg, name)
		if !reflect.DeepEqual(withoutPool(r.Effective), e) { // the pool's values: targets_test.go
			t.Errorf("%s effective\n got %+v\nwant %+v", name, r.Effective, e)
		}
		if r.Prefix != name || r.Target != targets[name] || r.Type != "upstream" {
			t.Errorf("%s: prefix, target, type = %q, %q, %q", name, r.Prefix, r.Target, r.Type)
		}
	}
	wantWarn := "elevated routes /legacy/upload (16), /legacy/reports (8), /legacy/stream-upload (32) may hold 56 workers together but share an elevated budget of 32: they cannot all be full at once"
	if !reflect.DeepEqual(cfg.Warnings, []string{wantWarn}) {
		t.Errorf("warnings\n got %q\nwant %q", cfg.Warnings, wantWarn)
	}
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.yaml")
	_, err := Load(missing, "routes.yaml", nil)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want fs.ErrNotExist", err)
	}
	if want := missing + ": cannot read the config file: no such file or directory"; err.Error() != want {
		t.Errorf("err = %q, want %q", err, want)
	}
	_, err = Load(filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), nil)
	if err == nil || !strings.Contains(err.Error(), "a.yaml: cannot read the config file") || !strings.Contains(err.Error(), "b.yaml: cannot read the routes file") {
		t.Errorf("err = %v, want both files named", err)
	}
	// A path is printed as given.
	_, err = Load("config.yaml", filepath.Join(dir, "routes.yaml"), nil)
	if err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dir, "routes.yaml")+": ") {
		t.Errorf("err = %v", err)
	}
}

func TestCheckJSON(t *testing.T) {
	t.Parallel()
	cfg, err := Load("config.yaml", "routes.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for _, want := range []string{
		`"read_timeout": "5s"`,
		`"response_header_timeout": "1m"`,
		`"elevated": true`,
		`"elevated_reasons": [`,
		`"read_timeout 10s > server 5s"`,
		`"max_concurrency_source": "guardrail"`,
		`"max_concurrency_source": "explicit"`,
		`"max_concurrency_source": "unlimited"`,
		`"elevated_budget": 32`,
		`"warnings": [`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("CheckJSON lacks %s:\n%s", want, text)
		}
	}
	if strings.Contains(text, `\u003e`) {
		t.Errorf("CheckJSON escapes '>':\n%s", text)
	}

	var doc struct {
		Server struct {
			ReadTimeout    string `json:"read_timeout"`
			MaxConnections int    `json:"max_connections"`
		} `json:"server"`
		Routes []struct {
			Name      string `json:"name"`
			Effective struct {
				ReadTimeout          string   `json:"read_timeout"`
				MaxConcurrency       int      `json:"max_concurrency"`
				MaxConcurrencySource string   `json:"max_concurrency_source"`
				Elevated             bool     `json:"elevated"`
				ElevatedReasons      []string `json:"elevated_reasons"`
			} `json:"effective"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("CheckJSON is not JSON: %v", err)
	}
	if doc.Server.ReadTimeout != "5s" || doc.Server.MaxConnections != 8192 {
		t.Errorf("server = %+v", doc.Server)
	}
	if len(doc.Routes) != 4 {
		t.Fatalf("%d routes", len(doc.Routes))
	}
	up := doc.Routes[0]
	if up.Name != "/legacy/upload" || up.Effective.ReadTimeout != "10s" || !up.Effective.Elevated ||
		up.Effective.MaxConcurrency != 16 || up.Effective.MaxConcurrencySource != "explicit" || len(up.Effective.ElevatedReasons) != 2 {
		t.Errorf("routes[0] = %+v", up)
	}
	// Every duration parses back.
	for _, r := range doc.Routes {
		if _, err := time.ParseDuration(r.Effective.ReadTimeout); err != nil {
			t.Errorf("%s: read_timeout %q: %v", r.Name, r.Effective.ReadTimeout, err)
		}
	}
	// An empty table is [], not null.
	empty := mustLoad(t, "", "routes: []")
	out, _ = empty.CheckJSON()
	if !strings.Contains(string(out), `"routes": []`) {
		t.Errorf("empty table:\n%s", out)
	}
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 50 * time.Millisecond: "50ms", 5 * time.Second: "5s", time.Minute: "1m",
		90 * time.Second: "1m30s", time.Hour: "1h", 90 * time.Minute: "1h30m", time.Hour + time.Second: "1h0m1s",
	} {
		got := formatDuration(d)
		if got != want {
			t.Errorf("formatDuration(%s) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != d {
			t.Errorf("formatDuration(%s) = %q does not parse back: %v, %v", d, got, back, err)
		}
	}
}

func TestReloadCompatible(t *testing.T) {
	t.Parallel()
	old := mustLoad(t, "", okRoute)
	// Everything else may change, routes included.
	same := mustLoad(t, "server: {read_timeout: 9s, max_body_bytes: 1MiB}\nlog: {level: debug}", route(`type: upstream, prefix: /new, target: "http://127.0.0.1:1"`))
	if err := same.ReloadCompatible(old); err != nil {
		t.Errorf("compatible reload refused: %v", err)
	}
	changed := mustLoad(t, "server: {port: 9090, host: 127.0.0.1, max_header_bytes: 16KiB}", okRoute)
	err := changed.ReloadCompatible(old)
	if err == nil {
		t.Fatal("port change accepted")
	}
	want := []string{
		"config.yaml: server.host: cannot change on reload (0.0.0.0 -> 127.0.0.1): restart the gateway to apply it",
		"config.yaml: server.port: cannot change on reload (8080 -> 9090): restart the gateway to apply it",
		"config.yaml: server.max_header_bytes: cannot change on reload (8192 -> 16384): restart the gateway to apply it",
	}
	if err.Error() != strings.Join(want, "\n") {
		t.Errorf("err\n got %q\nwant %q", err, strings.Join(want, "\n"))
	}
	// worker_pool_size also moves the derived max_connections: both are named.
	pool := mustLoad(t, "server: {worker_pool_size: 64}", okRoute)
	err = pool.ReloadCompatible(old)
	if err == nil || !strings.Contains(err.Error(), "server.worker_pool_size") || !strings.Contains(err.Error(), "server.max_connections") {
		t.Errorf("err = %v", err)
	}
}

func FuzzLoadBytes(f *testing.F) {
	f.Add([]byte("server: {port: 9090, max_body_bytes: 8MiB}"), []byte(okRoute))
	f.Add([]byte("log: {level: debug}"), []byte(route(`type: upstream, prefix: /a, host: "*.x.com", methods: [GET], target: "http://h:1", max_concurrency: 3`)))
	f.Add([]byte("server: [1]"), []byte("routes: [1, {prefix: 5}]"))
	f.Fuzz(func(t *testing.T, config, routes []byte) {
		cfg, err := LoadBytes("config.yaml", config, "routes.yaml", routes, nil)
		if (cfg == nil) == (err == nil) {
			t.Fatalf("cfg %v and err %v: exactly one must be set", cfg != nil, err)
		}
		if err != nil {
			for _, e := range configErrors(t, err) {
				if e.Error() == "" {
					t.Fatal("empty error")
				}
			}
			return
		}
		if _, err := cfg.CheckJSON(); err != nil {
			t.Fatal(err)
		}
	})
}
