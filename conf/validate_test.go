package conf

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// okRoute is a valid route entry for cases about the config file or the environment.
const okRoute = `routes:
  - {type: upstream, prefix: /api, target: "http://127.0.0.1:9001"}
`

// loadStrings loads config and routes YAML text under the names config.yaml and routes.yaml.
func loadStrings(config, routes string, environ ...string) (*Config, error) {
	return LoadBytes("config.yaml", []byte(config), "routes.yaml", []byte(routes), environ)
}

// route wraps one flow-style route entry into a routes file.
func route(entries ...string) string {
	var b strings.Builder
	b.WriteString("routes:\n")
	for _, e := range entries {
		b.WriteString("  - {" + e + "}\n")
	}
	return b.String()
}

// configErrors splits a LoadBytes error into its *Error parts.
func configErrors(t *testing.T, err error) []*Error {
	t.Helper()
	if err == nil {
		return nil
	}
	var parts []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	} else {
		parts = []error{err}
	}
	out := make([]*Error, 0, len(parts))
	for _, p := range parts {
		ce, ok := errors.AsType[*Error](p)
		if !ok {
			t.Fatalf("error %q is not a *conf.Error", p)
		}
		out = append(out, ce)
	}
	return out
}

// oneRouteError checks that routes (a routes.yaml of one route, at prefix) is refused with one
// error, on routes[0] of routes.yaml, naming key, whose message holds msg.
func oneRouteError(t *testing.T, routes, prefix, key, msg string) {
	t.Helper()
	_, err := loadStrings("", routes)
	errs := configErrors(t, err)
	if len(errs) != 1 {
		t.Errorf("%s: want one error, got %v", routes, err)
		return
	}
	e := errs[0]
	if e.File != "routes.yaml" || e.Route != 0 || e.Prefix != prefix || e.Key != key || !strings.Contains(e.Msg, msg) {
		t.Errorf("%s:\n got %q\nwant key %q, message containing %q", routes, e.Error(), key, msg)
	}
}

// TestValidationErrors has one case per configuration mistake of SPEC 2. Each must be
// reported alone (no follow-on noise), naming the file, route (index and prefix) and key.
func TestValidationErrors(t *testing.T) {
	t.Parallel()
	const api = `type: upstream, prefix: /api, target: "http://127.0.0.1:9001"`
	const legacy = `type: upstream, prefix: /legacy, target: "http://127.0.0.1:9000"`
	cases := []struct {
		name    string
		config  string
		routes  string
		env     []string
		want    string // the whole error line, or its beginning when it ends with "..."
		wantKey string // the Error's Key
		route   int    // the Error's Route
	}{
		// config.yaml: keys and types.
		{name: "unknown top key", config: "serverr: {}", want: "config.yaml: serverr: unknown key (the config file has the keys server and log)", wantKey: "serverr", route: -1},
		{name: "routes in config file", config: okRoute, want: "config.yaml: routes: routes belong in the routes file (routes.yaml)", wantKey: "routes", route: -1},
		{name: "unknown server key", config: "server: {read_timout: 5s}", want: "config.yaml: server.read_timout: unknown key (did you mean read_timeout?)", wantKey: "server.read_timout", route: -1},
		{name: "unknown server key far from any", config: "server: {colour: blue}", want: "config.yaml: server.colour: unknown key (known keys: auth_defaults, connect_timeout, ...", wantKey: "server.colour", route: -1},
		{name: "unknown log key", config: "log: {levle: debug}", want: "config.yaml: log.levle: unknown key (did you mean level?)", wantKey: "log.levle", route: -1},
		{name: "server not a mapping", config: "server: [1, 2]", want: "config.yaml: server: must be a mapping of keys, not a list", wantKey: "server", route: -1},
		{name: "invalid yaml", config: "server: {port: 1", want: "config.yaml: invalid YAML: yaml: ...", route: -1},
		{name: "port string", config: `server: {port: "abc"}`, want: `config.yaml: server.port: must be an integer, not "abc"`, wantKey: "server.port", route: -1},
		{name: "port quoted number", config: `server: {port: "8080"}`, want: `config.yaml: server.port: must be an integer, not "8080"`, wantKey: "server.port", route: -1},
		{name: "port bool", config: "server: {port: true}", want: "config.yaml: server.port: must be an integer, not the boolean true", wantKey: "server.port", route: -1},
		{name: "port float", config: "server: {port: 80.5}", want: "config.yaml: server.port: must be an integer, not the number 80.5", wantKey: "server.port", route: -1},
		{name: "port null", config: "server: {port: ~}", want: "config.yaml: server.port: has no value: write an integer, or remove the key for the default", wantKey: "server.port", route: -1},
		{name: "port zero", config: "server: {port: 0}", want: "config.yaml: server.port: must be between 1 and 65535, not 0", wantKey: "server.port", route: -1},
		{name: "port too high", config: "server: {port: 70000}", want: "config.yaml: server.port: must be between 1 and 65535, not 70000", wantKey: "server.port", route: -1},
		{name: "host empty", config: `server: {host: ""}`, want: "config.yaml: server.host: must not be empty (write 0.0.0.0 to listen on every interface)", wantKey: "server.host", route: -1},
		{name: "host with port", config: `server: {host: "0.0.0.0:80"}`, want: `config.yaml: server.host: "0.0.0.0:80" must be an IP address or host name without a port (set server.port)`, wantKey: "server.host", route: -1},
		{name: "worker pool zero", config: "server: {worker_pool_size: 0}", want: "config.yaml: server.worker_pool_size: must be between 1 and 1048576, not 0", wantKey: "server.worker_pool_size", route: -1},
		{name: "max connections zero", config: "server: {max_connections: 0}", want: "config.yaml: server.max_connections: must be at least 1, not 0 (remove the key for 64 × worker_pool_size)", wantKey: "server.max_connections", route: -1},
		{name: "elevated share zero", config: "server: {elevated_share: 0}", want: "config.yaml: server.elevated_share: must be greater than 0 and at most 1, not 0", wantKey: "server.elevated_share", route: -1},
		{name: "elevated share above one", config: "server: {elevated_share: 1.5}", want: "config.yaml: server.elevated_share: must be greater than 0 and at most 1, not 1.5", wantKey: "server.elevated_share", route: -1},
		{name: "elevated share text", config: "server: {elevated_share: half}", want: `config.yaml: server.elevated_share: must be a number, not "half"`, wantKey: "server.elevated_share", route: -1},
		{name: "bad duration", config: "server: {read_timeout: soon}", want: `config.yaml: server.read_timeout: "soon" is not a Go duration such as "5s" or "1m30s"`, wantKey: "server.read_timeout", route: -1},
		{name: "duration without unit", config: "server: {read_timeout: 5}", want: `config.yaml: server.read_timeout: 5 has no unit: write a Go duration such as "5s" or "1m30s"`, wantKey: "server.read_timeout", route: -1},
		{name: "negative timeout", config: "server: {read_timeout: -1s}", want: "config.yaml: server.read_timeout: must not be negative, not -1s", wantKey: "server.read_timeout", route: -1},
		{name: "negative queue timeout", config: "server: {worker_queue_timeout: -1ms}", want: "config.yaml: server.worker_queue_timeout: must not be negative, not -1ms", wantKey: "server.worker_queue_timeout", route: -1},
		{name: "negative drain delay", config: "server: {drain_delay: -5s}", want: "config.yaml: server.drain_delay: must not be negative, not -5s", wantKey: "server.drain_delay", route: -1},
		{name: "zero read timeout", config: "server: {read_timeout: 0s}", want: "config.yaml: server.read_timeout: must be greater than 0: a client could hold its connection forever (Slowloris)", wantKey: "server.read_timeout", route: -1},
		{name: "zero write timeout", config: "server: {write_timeout: 0s}", want: "config.yaml: server.write_timeout: must be greater than 0: ...", wantKey: "server.write_timeout", route: -1},
		{name: "zero response header timeout", config: "server: {response_header_timeout: 0s}", want: "config.yaml: server.response_header_timeout: must be greater than 0: ...", wantKey: "server.response_header_timeout", route: -1},
		{name: "zero connect timeout", config: "server: {connect_timeout: 0s}", want: "config.yaml: server.connect_timeout: must be greater than 0: ...", wantKey: "server.connect_timeout", route: -1},
		{name: "zero idle timeout", config: "server: {idle_timeout: 0s}", want: "config.yaml: server.idle_timeout: must be greater than 0: remove the key to use read_timeout", wantKey: "server.idle_timeout", route: -1},
		{name: "zero upstream idle timeout", config: "server: {upstream_idle_timeout: 0s}", want: "config.yaml: server.upstream_idle_timeout: must be greater than 0: ...", wantKey: "server.upstream_idle_timeout", route: -1},
		{name: "bad size", config: "server: {max_body_bytes: lots}", want: `config.yaml: server.max_body_bytes: "lots" is not a number of bytes or an IEC size such as "8KiB" or "200MiB" (IEC units only: B, KiB, MiB, GiB, TiB)`, wantKey: "server.max_body_bytes", route: -1},
		{name: "SI size", config: "server: {max_body_bytes: 4MB}", want: `config.yaml: server.max_body_bytes: "4MB" is not a number of bytes...`, wantKey: "server.max_body_bytes", route: -1},
		{name: "fractional size", config: "server: {max_body_bytes: 4.5}", want: "config.yaml: server.max_body_bytes: must be a number of bytes or an IEC size such as \"8KiB\" or \"200MiB\", not the number 4.5", wantKey: "server.max_body_bytes", route: -1},
		{name: "negative size", config: "server: {max_body_bytes: -1}", want: "config.yaml: server.max_body_bytes: must not be negative, not -1", wantKey: "server.max_body_bytes", route: -1},
		{name: "negative IEC size", config: "server: {min_progress_bytes: -1KiB}", want: "config.yaml: server.min_progress_bytes: must not be negative, not -1024", wantKey: "server.min_progress_bytes", route: -1},
		{name: "overflowing size", config: "server: {max_body_bytes: 9000000TiB}", want: `config.yaml: server.max_body_bytes: "9000000TiB" is too large`, wantKey: "server.max_body_bytes", route: -1},
		{name: "zero max header bytes", config: "server: {max_header_bytes: 0}", want: "config.yaml: server.max_header_bytes: must be greater than 0: no request line would fit", wantKey: "server.max_header_bytes", route: -1},
		// Values that validated and then broke at run time (issue 14): bounds.go.
		{name: "upstream idle timeout below floor", config: "server: {upstream_idle_timeout: 1ns}", want: "config.yaml: server.upstream_idle_timeout: must be at least 1s, not 1ns: no upstream connection would be reused and the idle cleanup would spin", wantKey: "server.upstream_idle_timeout", route: -1},
		{name: "read timeout below floor", config: "server: {read_timeout: 1us}", want: "config.yaml: server.read_timeout: must be at least 100ms, not 1µs: every client would be cut before its request arrives", wantKey: "server.read_timeout", route: -1},
		{name: "read timeout above ceiling", config: "server: {read_timeout: 168h}", want: "config.yaml: server.read_timeout: must be at most 1h, not 168h", wantKey: "server.read_timeout", route: -1},
		{name: "write timeout below floor", config: "server: {write_timeout: 5ms}", want: "config.yaml: server.write_timeout: must be at least 100ms, not 5ms: ...", wantKey: "server.write_timeout", route: -1},
		{name: "idle timeout below floor", config: "server: {idle_timeout: 1ms}", want: "config.yaml: server.idle_timeout: must be at least 100ms, not 1ms: ...", wantKey: "server.idle_timeout", route: -1},
		{name: "response header timeout below floor", config: "server: {response_header_timeout: 1ns}", want: "config.yaml: server.response_header_timeout: must be at least 100ms, not 1ns: no upstream can answer that fast", wantKey: "server.response_header_timeout", route: -1},
		{name: "connect timeout below floor", config: "server: {connect_timeout: 1ns}", want: "config.yaml: server.connect_timeout: must be at least 10ms, not 1ns: dials would fail before they can complete", wantKey: "server.connect_timeout", route: -1},
		{name: "connect timeout above ceiling", config: "server: {connect_timeout: 5m}", want: "config.yaml: server.connect_timeout: must be at most 1m, not 5m", wantKey: "server.connect_timeout", route: -1},
		{name: "queue timeout above ceiling", config: "server: {worker_queue_timeout: 1m}", want: "config.yaml: server.worker_queue_timeout: must be at most 30s, not 1m", wantKey: "server.worker_queue_timeout", route: -1},
		{name: "shutdown timeout above ceiling", config: "server: {shutdown_timeout: 2h}", want: "config.yaml: server.shutdown_timeout: must be at most 1h, not 2h", wantKey: "server.shutdown_timeout", route: -1},
		{name: "drain delay above ceiling", config: "server: {drain_delay: 1h}", want: "config.yaml: server.drain_delay: must be at most 10m, not 1h", wantKey: "server.drain_delay", route: -1},
		{name: "max header bytes above ceiling", config: "server: {max_header_bytes: 1TiB}", want: "config.yaml: server.max_header_bytes: must be at most 1048576 (1 MiB), not 1099511627776: every open connection holds a read buffer of this size", wantKey: "server.max_header_bytes", route: -1},
		{name: "max header bytes below floor", config: "server: {max_header_bytes: 100}", want: "config.yaml: server.max_header_bytes: must be at least 1024 (1 KiB), not 100: the headers every client sends would not fit", wantKey: "server.max_header_bytes", route: -1},
		{name: "stream threshold above ceiling", config: "server: {stream_threshold_bytes: 9223372036854775807}", want: "config.yaml: server.stream_threshold_bytes: must be at most 1073741824 (1 GiB), not 9223372036854775807: bodies at or below it are buffered whole in memory", wantKey: "server.stream_threshold_bytes", route: -1},
		{name: "health path encodes unreserved", config: "server: {health_path: /st%61tus}", want: `config.yaml: server.health_path: "/st%61tus" must not percent-encode "a" (%61): request paths are matched after it is decoded; write "/status"`, wantKey: "server.health_path", route: -1},
		{name: "metrics path malformed percent", config: "server: {metrics_path: /m%2}", want: `config.yaml: server.metrics_path: "/m%2" has a % not followed by two hex digits: such request paths are refused`, wantKey: "server.metrics_path", route: -1},
		{name: "route prefix encodes unreserved", routes: route(`type: upstream, prefix: /api%2Dv1, target: "http://127.0.0.1:9001"`), want: `routes.yaml: routes[0] (/api%2Dv1): prefix: "/api%2Dv1" must not percent-encode "-" (%2D): request paths are matched after it is decoded; write "/api-v1"`, wantKey: "prefix", route: 0},
		{name: "route read timeout below floor", routes: route(legacy + ", read_timeout: 1ms"), want: "routes.yaml: routes[0] (/legacy): read_timeout: must be at least 100ms, not 1ms: ...", wantKey: "read_timeout", route: 0},
		{name: "route connect timeout above ceiling", routes: route(legacy + ", connect_timeout: 1h"), want: "routes.yaml: routes[0] (/legacy): connect_timeout: must be at most 1m, not 1h", wantKey: "connect_timeout", route: 0},
		// Issue 25: more values that validated and then misbehaved.
		{name: "health check interval below floor", routes: route(legacy + ", health_check: {path: /h, interval: 1ns}"), want: "routes.yaml: routes[0] (/legacy): health_check: interval must be at least 100ms, not 1ns: every target would be checked in a loop", wantKey: "health_check", route: 0},
		{name: "health check interval above ceiling", routes: route(legacy + ", health_check: {path: /h, interval: 2h}"), want: "routes.yaml: routes[0] (/legacy): health_check: interval must be at most 1h, not 2h", wantKey: "health_check", route: 0},
		{name: "health check timeout below floor", routes: route(legacy + ", health_check: {path: /h, timeout: 1ns}"), want: "routes.yaml: routes[0] (/legacy): health_check: timeout must be at least 10ms, not 1ns: the check's dial would fail before it can complete", wantKey: "health_check", route: 0},
		{name: "health check timeout above ceiling", routes: route(legacy + ", health_check: {path: /h, timeout: 5m}"), want: "routes.yaml: routes[0] (/legacy): health_check: timeout must be at most 1m, not 5m", wantKey: "health_check", route: 0},
		{name: "max eject time overflowing", routes: route(legacy + ", passive_health: {max_eject_time: 2000000h}"), want: "routes.yaml: routes[0] (/legacy): passive_health: max_eject_time must be at most 24h, not 2000000h", wantKey: "passive_health", route: 0},
		{name: "eject time above ceiling", routes: route(legacy + ", passive_health: {eject_time: 48h, max_eject_time: 24h}"), want: "routes.yaml: routes[0] (/legacy): passive_health: eject_time must be at most 24h, not 48h", wantKey: "passive_health", route: 0},
		{name: "tunnel idle timeout below floor", routes: route(legacy + ", websocket: true, tunnel_idle_timeout: 1ms"), want: "routes.yaml: routes[0] (/legacy): tunnel_idle_timeout: must be at least 1s, not 1ms: a tunnel would be cut between two messages", wantKey: "tunnel_idle_timeout", route: 0},
		{name: "tunnel idle timeout above ceiling", routes: route(legacy + ", websocket: true, tunnel_idle_timeout: 720h"), want: "routes.yaml: routes[0] (/legacy): tunnel_idle_timeout: must be at most 24h, not 720h", wantKey: "tunnel_idle_timeout", route: 0},
		{name: "proxy protocol timeout below floor", config: "server: {proxy_protocol: {enabled: true, timeout: 1ns}}", want: "config.yaml: server.proxy_protocol.timeout: must be at least 100ms, not 1ns: a balancer's PROXY header could not arrive", wantKey: "server.proxy_protocol.timeout", route: -1},
		{name: "proxy protocol timeout above ceiling", config: "server: {proxy_protocol: {enabled: true, timeout: 1h}}", want: "config.yaml: server.proxy_protocol.timeout: must be at most 1m, not 1h", wantKey: "server.proxy_protocol.timeout", route: -1},
		{name: "bad chunked mode", config: "server: {inbound_chunked_mode: smuggle}", want: `config.yaml: server.inbound_chunked_mode: must be normalize or passthrough, not "smuggle"`, wantKey: "server.inbound_chunked_mode", route: -1},
		{name: "health path relative", config: "server: {health_path: health}", want: `config.yaml: server.health_path: must start with /, not "health"`, wantKey: "server.health_path", route: -1},
		{name: "metrics path is health path", config: "server: {metrics_path: /health}", want: "config.yaml: server.metrics_path: must differ from health_path (/health)", wantKey: "server.metrics_path", route: -1},
		{name: "bad log level", config: "log: {level: verbose}", want: `config.yaml: log.level: must be debug, info, warn or error, not "verbose"`, wantKey: "log.level", route: -1},
		{name: "bad log format", config: "log: {format: xml}", want: `config.yaml: log.format: must be json or console, not "xml"`, wantKey: "log.format", route: -1},
		{name: "log access not bool", config: "log: {access: yes please}", want: `config.yaml: log.access: must be true or false, not "yes please"`, wantKey: "log.access", route: -1},

		// The environment: errors name the variable.
		{name: "env bad int", env: []string{"TORON_SERVER__PORT=abc"}, want: `environment: TORON_SERVER__PORT: "abc" is not an integer`, wantKey: "TORON_SERVER__PORT", route: -1},
		{name: "env out of range", env: []string{"TORON_SERVER__PORT=0"}, want: "environment: TORON_SERVER__PORT: must be between 1 and 65535, not 0", wantKey: "TORON_SERVER__PORT", route: -1},
		{name: "env bad duration", env: []string{"TORON_SERVER__READ_TIMEOUT=10"}, want: `environment: TORON_SERVER__READ_TIMEOUT: "10" is not a Go duration such as "5s" or "1m30s"`, wantKey: "TORON_SERVER__READ_TIMEOUT", route: -1},
		{name: "env bad size", env: []string{"TORON_SERVER__MAX_BODY_BYTES=lots"}, want: `environment: TORON_SERVER__MAX_BODY_BYTES: "lots" is not a number of bytes...`, wantKey: "TORON_SERVER__MAX_BODY_BYTES", route: -1},
		{name: "env bad float", env: []string{"TORON_SERVER__ELEVATED_SHARE=most"}, want: `environment: TORON_SERVER__ELEVATED_SHARE: "most" is not a number`, wantKey: "TORON_SERVER__ELEVATED_SHARE", route: -1},
		{name: "env float not finite", env: []string{"TORON_SERVER__ELEVATED_SHARE=NaN"}, want: `environment: TORON_SERVER__ELEVATED_SHARE: "NaN" is not a number`, wantKey: "TORON_SERVER__ELEVATED_SHARE", route: -1},
		{name: "env bad bool", env: []string{"TORON_LOG__ACCESS=maybe"}, want: `environment: TORON_LOG__ACCESS: "maybe" is not true or false`, wantKey: "TORON_LOG__ACCESS", route: -1},
		{name: "env bad level", env: []string{"TORON_LOG__LEVEL=loud"}, want: `environment: TORON_LOG__LEVEL: must be debug, info, warn or error, not "loud"`, wantKey: "TORON_LOG__LEVEL", route: -1},
		{name: "env unknown key", env: []string{"TORON_SERVER__PORTT=1"}, want: "environment: TORON_SERVER__PORTT: server.portt is not a configuration key (did you mean TORON_SERVER__PORT?)", wantKey: "TORON_SERVER__PORTT", route: -1},
		{name: "env unknown nested key", env: []string{"TORON_LOG__A__B=1"}, want: "environment: TORON_LOG__A__B: log.a__b is not a configuration key", wantKey: "TORON_LOG__A__B", route: -1},

		// routes.yaml: file shape.
		{name: "routes missing", routes: "# nothing\n", want: "routes.yaml: routes: is required (write routes: [] for a gateway that only answers /health and /metrics)", wantKey: "routes", route: -1},
		{name: "routes not a list", routes: "routes: {prefix: /api}", want: "routes.yaml: routes: must be a list of routes, not a mapping", wantKey: "routes", route: -1},
		{name: "server in routes file", routes: okRoute + "server: {port: 1}\n", want: "routes.yaml: server: server and log settings belong in the config file (config.yaml)", wantKey: "server", route: -1},
		{name: "unknown routes file key", routes: okRoute + "rotues: []\n", want: "routes.yaml: rotues: unknown key (the routes file has one key, routes)", wantKey: "rotues", route: -1},
		{name: "route not a mapping", routes: "routes:\n  - /api\n", want: `routes.yaml: routes[0]: must be a mapping with at least type, prefix and target, not "/api"`, route: 0},
		{name: "routes invalid yaml", routes: "routes:\n  - {type: upstream\n", want: "routes.yaml: invalid YAML: yaml: ...", route: -1},

		// routes.yaml: keys and types of a route.
		{name: "unknown route key", routes: route(api + ", max_body_byte: 5"), want: "routes.yaml: routes[0] (/api): max_body_byte: unknown key (did you mean max_body_bytes?)", wantKey: "max_body_byte", route: 0},
		{name: "route index counts", routes: route(api, legacy+", timeout: 5s"), want: "routes.yaml: routes[1] (/legacy): timeout: unknown key (known keys: ...", wantKey: "timeout", route: 1},
		{name: "methods not a list", routes: route(api + ", methods: 5"), want: "routes.yaml: routes[0] (/api): methods: must be a list of strings, not the number 5", wantKey: "methods", route: 0},
		{name: "methods item not a string", routes: route(api + ", methods: [GET, 5]"), want: "routes.yaml: routes[0] (/api): methods: item 1 (the number 5) must be a string", wantKey: "methods", route: 0},
		{name: "route size not a size", routes: route(legacy + ", max_body_bytes: lots"), want: `routes.yaml: routes[0] (/legacy): max_body_bytes: "lots" is not a number of bytes...`, wantKey: "max_body_bytes", route: 0},
		{name: "route negative size", routes: route(legacy + ", max_body_bytes: -1"), want: "routes.yaml: routes[0] (/legacy): max_body_bytes: must not be negative, not -1", wantKey: "max_body_bytes", route: 0},
		{name: "route negative progress", routes: route(legacy + ", min_progress_bytes: -1"), want: "routes.yaml: routes[0] (/legacy): min_progress_bytes: must not be negative, not -1", wantKey: "min_progress_bytes", route: 0},
		{name: "route bad duration", routes: route(legacy + ", read_timeout: soon"), want: `routes.yaml: routes[0] (/legacy): read_timeout: "soon" is not a Go duration...`, wantKey: "read_timeout", route: 0},
		{name: "route negative timeout", routes: route(legacy + ", write_timeout: -30s"), want: "routes.yaml: routes[0] (/legacy): write_timeout: must not be negative, not -30s", wantKey: "write_timeout", route: 0},
		{name: "route zero timeout", routes: route(legacy + ", response_header_timeout: 0s"), want: "routes.yaml: routes[0] (/legacy): response_header_timeout: must be greater than 0: a hung upstream could hold its worker forever", wantKey: "response_header_timeout", route: 0},
		{name: "route zero connect timeout", routes: route(legacy + ", connect_timeout: 0s"), want: "routes.yaml: routes[0] (/legacy): connect_timeout: must be greater than 0: ...", wantKey: "connect_timeout", route: 0},
		{name: "route bool not bool", routes: route(legacy + ", stream_request_body: yes"), want: `routes.yaml: routes[0] (/legacy): stream_request_body: must be true or false, not "yes"`, wantKey: "stream_request_body", route: 0},
		{name: "route concurrency text", routes: route(legacy + ", max_concurrency: many"), want: `routes.yaml: routes[0] (/legacy): max_concurrency: must be an integer, not "many"`, wantKey: "max_concurrency", route: 0},

		// routes.yaml: required keys and values.
		{name: "missing type", routes: route(`prefix: /api, target: "http://127.0.0.1:9001"`), want: "routes.yaml: routes[0] (/api): type: is required (upstream or redirect)", wantKey: "type", route: 0},
		{name: "unknown type", routes: route(`type: static, prefix: /api, target: "http://127.0.0.1:9001"`), want: `routes.yaml: routes[0] (/api): type: unknown route type "static": the types are upstream and redirect`, wantKey: "type", route: 0},
		{name: "missing prefix", routes: route(`type: upstream, target: "http://127.0.0.1:9001"`), want: "routes.yaml: routes[0]: prefix: is required (a path such as /api; / matches every path)", wantKey: "prefix", route: 0},
		{name: "missing target", routes: route(`type: upstream, prefix: /api`), want: "routes.yaml: routes[0] (/api): target: is required (http://host:port or https://host:port)", wantKey: "target", route: 0},
		{name: "prefix without slash", routes: route(`type: upstream, prefix: api, target: "http://127.0.0.1:9001"`), want: `routes.yaml: routes[0] (api): prefix: "api" must start with /`, wantKey: "prefix", route: 0},
		{name: "prefix with double slash", routes: route(`type: upstream, prefix: /a//b, target: "http://127.0.0.1:9001"`), want: `routes.yaml: routes[0] (/a//b): prefix: "/a//b" must not contain "//"...`, wantKey: "prefix", route: 0},
		{name: "prefix with dot segment", routes: route(`type: upstream, prefix: /a/../b, target: "http://127.0.0.1:9001"`), want: `routes.yaml: routes[0] (/a/../b): prefix: "/a/../b" must not contain "." or ".." segments...`, wantKey: "prefix", route: 0},
		{name: "prefix with query", routes: route(`type: upstream, prefix: "/a?b", target: "http://127.0.0.1:9001"`), want: `routes.yaml: routes[0] (/a?b): prefix: "/a?b" must be a path, without query or fragment`, wantKey: "prefix", route: 0},
		{name: "target scheme", routes: route(`type: upstream, prefix: /api, target: "ftp://127.0.0.1:21"`), want: `routes.yaml: routes[0] (/api): target: "ftp://127.0.0.1:21" must start with http:// or https://`, wantKey: "target", route: 0},
		{name: "target without scheme", routes: route(`type: upstream, prefix: /api, target: "127.0.0.1:9001"`), want: `routes.yaml: routes[0] (/api): target: "127.0.0.1:9001"...`, wantKey: "target", route: 0},
		{name: "target without port", routes: route(`type: upstream, prefix: /api, target: "http://api.internal"`), want: `routes.yaml: routes[0] (/api): target: "http://api.internal" must have an explicit port, as in http://api.internal:80`, wantKey: "target", route: 0},
		{name: "target without host", routes: route(`type: upstream, prefix: /api, target: "http://:9001"`), want: `routes.yaml: routes[0] (/api): target: "http://:9001" must name a host and port, as in http://10.0.0.5:8080`, wantKey: "target", route: 0},
		{name: "target with path", routes: route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001/v1"`), want: `routes.yaml: routes[0] (/api): target: "http://127.0.0.1:9001/v1" must not have a path (not even /): the request's path is forwarded as it is`, wantKey: "target", route: 0},
		{name: "target with slash", routes: route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001/"`), want: `routes.yaml: routes[0] (/api): target: "http://127.0.0.1:9001/" must not have a path...`, wantKey: "target", route: 0},
		{name: "target with query", routes: route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001?a=b"`), want: `routes.yaml: routes[0] (/api): target: "http://127.0.0.1:9001?a=b" must not have a query...`, wantKey: "target", route: 0},
		{name: "target with userinfo", routes: route(`type: upstream, prefix: /api, target: "http://u:secret@127.0.0.1:9001"`), want: `routes.yaml: routes[0] (/api): target: "http://u:xxxxx@127.0.0.1:9001" must not contain user information`, wantKey: "target", route: 0},
		{name: "target port zero", routes: route(`type: upstream, prefix: /api, target: "http://127.0.0.1:0"`), want: `routes.yaml: routes[0] (/api): target: "http://127.0.0.1:0": the port must be between 1 and 65535`, wantKey: "target", route: 0},
		{name: "target not a URL", routes: route(`type: upstream, prefix: /api, target: "http://[::1"`), want: `routes.yaml: routes[0] (/api): target: "http://[::1" is not a URL: ...`, wantKey: "target", route: 0},
		{name: "host with port", routes: route(api + ", host: api.example.com:443"), want: `routes.yaml: routes[0] (/api): host: "api.example.com:443" must not have a port: the port of the Host header is ignored when matching`, wantKey: "host", route: 0},
		{name: "host wildcard inside", routes: route(api + `, host: "api.*.com"`), want: `routes.yaml: routes[0] (/api): host: "api.*.com": a wildcard must be the whole first label, as in *.example.com`, wantKey: "host", route: 0},
		{name: "host wildcard alone", routes: route(api + `, host: "*."`), want: `routes.yaml: routes[0] (/api): host: "*." must be a host name such as api.example.com or a wildcard such as *.example.com`, wantKey: "host", route: 0},
		{name: "host not a name", routes: route(api + `, host: "exa mple.com"`), want: `routes.yaml: routes[0] (/api): host: "exa mple.com" must be a host name...`, wantKey: "host", route: 0},
		{name: "host empty", routes: route(api + `, host: ""`), want: "routes.yaml: routes[0] (/api): host: must not be empty (remove the key to match every host)", wantKey: "host", route: 0},
		{name: "method lower case", routes: route(api + ", methods: [get]"), want: `routes.yaml: routes[0] (/api): methods: "get" must be upper case (methods are case-sensitive)`, wantKey: "methods", route: 0},
		{name: "method not a token", routes: route(api + `, methods: ["GE T"]`), want: `routes.yaml: routes[0] (/api): methods: "GE T" is not an HTTP method token`, wantKey: "methods", route: 0},
		{name: "methods empty", routes: route(api + ", methods: []"), want: "routes.yaml: routes[0] (/api): methods: must list at least one method (remove the key to allow every method)", wantKey: "methods", route: 0},
		{name: "method twice", routes: route(api + ", methods: [GET, GET]"), want: "routes.yaml: routes[0] (/api): methods: lists GET twice", wantKey: "methods", route: 0},
		{name: "route chunked mode", routes: route(legacy + ", inbound_chunked_mode: raw"), want: `routes.yaml: routes[0] (/legacy): inbound_chunked_mode: must be normalize or passthrough, not "raw"`, wantKey: "inbound_chunked_mode", route: 0},
		{name: "max concurrency zero", routes: route(legacy + ", max_concurrency: 0"), want: "routes.yaml: routes[0] (/legacy): max_concurrency: must be at least 1, not 0...", wantKey: "max_concurrency", route: 0},
		{name: "max upstream conns zero", routes: route(legacy + ", max_upstream_conns: 0"), want: "routes.yaml: routes[0] (/legacy): max_upstream_conns: must be at least 1, not 0 (remove the key for max_concurrency, else 512)", wantKey: "max_upstream_conns", route: 0},
		{name: "buffered body above 8 MiB", routes: route(legacy + ", stream_request_body: false, max_body_bytes: 16MiB"), want: "routes.yaml: routes[0] (/legacy): stream_request_body: false buffers every body in memory, which is refused with max_body_bytes above 8388608 (8 MiB): it is 16777216 here; remove the key to stream large bodies", wantKey: "stream_request_body", route: 0},
		{name: "buffered body above 8 MiB inherited", config: "server: {max_body_bytes: 9MiB}", routes: route(legacy + ", stream_request_body: false"), want: "routes.yaml: routes[0] (/legacy): stream_request_body: false buffers every body in memory, which is refused with max_body_bytes above 8388608 (8 MiB): it is 9437184 here...", wantKey: "stream_request_body", route: 0},
		{name: "name empty", routes: route(api + `, name: ""`), want: "routes.yaml: routes[0] (/api): name: must not be empty (remove the key for the default host + prefix + methods)", wantKey: "name", route: 0},
		{name: "name reserved", routes: route(api + ", name: none"), want: `routes.yaml: routes[0] (/api): name: "none" is reserved for requests that match no route`, wantKey: "name", route: 0},
		{name: "name not a string", routes: route(api + ", name: [a]"), want: "routes.yaml: routes[0] (/api): name: must be a string, not a list", wantKey: "name", route: 0},

		// routes.yaml: across routes.
		{name: "duplicate names", routes: route(api+", name: main", legacy+", name: main"), want: `routes.yaml: routes[1] (/legacy): name: "main" is already the name of routes[0] (/api)`, wantKey: "name", route: 1},
		{name: "explicit name equals default name", routes: route(api, legacy+", name: /api"), want: `routes.yaml: routes[1] (/legacy): name: "/api" is already the name of routes[0] (/api)`, wantKey: "name", route: 1},
		{name: "tie without methods", routes: route(api, api+", name: other"), want: "routes.yaml: routes[1] (/api): prefix: ties with routes[0] (/api): same prefix, and both allow every method; give one of them a host or methods", wantKey: "prefix", route: 1},
		{name: "tie on host case", routes: route(api+", host: API.example.com", api+", host: api.EXAMPLE.com, name: other"), want: "routes.yaml: routes[1] (/api): prefix: ties with routes[0] (/api): same host api.example.com and prefix, and both allow every method...", wantKey: "prefix", route: 1},
		{name: "tie on methods", routes: route(api+", methods: [GET, POST]", api+", methods: [PUT, POST]"), want: "routes.yaml: routes[1] (/api): methods: ties with routes[0] (/api): same prefix, and both list POST", wantKey: "methods", route: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			routes := tc.routes
			if routes == "" {
				routes = okRoute
			}
			cfg, err := loadStrings(tc.config, routes, tc.env...)
			if err == nil {
				t.Fatalf("loaded without error; want %q", tc.want)
			}
			if cfg != nil {
				t.Errorf("returned a Config with an error")
			}
			errs := configErrors(t, err)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1:\n%v", len(errs), err)
			}
			got := errs[0]
			if want, ok := strings.CutSuffix(tc.want, "..."); ok {
				if !strings.HasPrefix(got.Error(), want) {
					t.Errorf("error\n got %q\nwant %q...", got.Error(), want)
				}
			} else if got.Error() != tc.want {
				t.Errorf("error\n got %q\nwant %q", got.Error(), tc.want)
			}
			if got.Key != tc.wantKey || got.Route != tc.route {
				t.Errorf("Key, Route = %q, %d; want %q, %d", got.Key, got.Route, tc.wantKey, tc.route)
			}
		})
	}
}

// TestNotTies lists route pairs that the matching rules order, so they load.
func TestNotTies(t *testing.T) {
	t.Parallel()
	const api = `type: upstream, prefix: /api, target: "http://127.0.0.1:9001"`
	cases := map[string]string{
		"disjoint methods":            route(api+", methods: [GET]", api+", methods: [POST]"),
		"methods win over all":        route(api, api+", methods: [GET]"),
		"different hosts":             route(api+", host: a.example.com", api+", host: b.example.com"),
		"host wins over none":         route(api, api+", host: a.example.com"),
		"exact wins over wildcard":    route(api+", host: a.example.com", api+`, host: "*.example.com"`),
		"longer wildcard wins":        route(api+`, host: "*.a.example.com"`, api+`, host: "*.example.com"`),
		"trailing slash differs":      route(api, `type: upstream, prefix: /api/, target: "http://127.0.0.1:9001"`),
		"longer prefix wins":          route(api, `type: upstream, prefix: /api/v2, target: "http://127.0.0.1:9001"`),
		"same default names differ":   route(api+", methods: [GET, POST]", api+", methods: [PUT]"),
		"catch-all beside a prefix":   route(api, `type: upstream, prefix: /, target: "http://127.0.0.1:9001"`),
		"different targets, no clash": route(api+", host: x.example.com", `type: upstream, prefix: /api, host: y.example.com, target: "https://10.0.0.1:443"`),
	}
	for name, routes := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := loadStrings("", routes); err != nil {
				t.Fatalf("want no error, got:\n%v", err)
			}
		})
	}
}

// TestAllErrorsReported checks that the operator sees every mistake at once, in file order.
func TestAllErrorsReported(t *testing.T) {
	t.Parallel()
	_, err := loadStrings(
		"server: {port: abc, read_timeout: -1s}\nlog: {level: loud}\n",
		route(
			`type: upstream, prefix: /api, target: "http://127.0.0.1:9001"`,
			`type: upstream, prefix: /legacy, target: "http://127.0.0.1:9000", max_body_bytes: -1, methods: [get]`,
		),
		"TORON_SERVER__WRITE_TIMEOUT=fast",
	)
	want := []string{
		`config.yaml: server.port: must be an integer, not "abc"`,
		"config.yaml: server.read_timeout: must not be negative, not -1s",
		`config.yaml: log.level: must be debug, info, warn or error, not "loud"`,
		`environment: TORON_SERVER__WRITE_TIMEOUT: "fast" is not a Go duration such as "5s" or "1m30s"`,
		`routes.yaml: routes[1] (/legacy): methods: "get" must be upper case (methods are case-sensitive)`,
		"routes.yaml: routes[1] (/legacy): max_body_bytes: must not be negative, not -1",
	}
	errs := configErrors(t, err)
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestElevatedBudgetExact: floor(worker_pool_size × elevated_share) on the decimal written, not
// on its float64 (100 × 0.29 was 28, 100 × 0.57 was 56; issue 14).
func TestElevatedBudgetExact(t *testing.T) {
	for _, tc := range []struct {
		workers int
		share   string
		want    int
	}{
		{100, "0.29", 29}, {100, "0.57", 57}, {128, "0.25", 32}, {10, "0.01", 1}, {1000, "0.333", 333},
		{3, "0.5", 1}, {7, "1", 7}, {100, "0.58", 58}, {1 << 20, "0.1", 104857},
	} {
		cfg, err := loadStrings("server: {worker_pool_size: "+strconv.Itoa(tc.workers)+", elevated_share: "+tc.share+"}", okRoute)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.ElevatedBudget(); got != tc.want {
			t.Errorf("worker_pool_size %d, elevated_share %s: budget %d, want %d", tc.workers, tc.share, got, tc.want)
		}
	}
}

// TestDurationBoundsAccepted: the bounds themselves are accepted.
func TestDurationBoundsAccepted(t *testing.T) {
	cfg := "server: {read_timeout: 100ms, write_timeout: 1h, idle_timeout: 100ms, response_header_timeout: 100ms, connect_timeout: 10ms, upstream_idle_timeout: 1s, worker_queue_timeout: 30s, shutdown_timeout: 1h, drain_delay: 10m, max_header_bytes: 1MiB, stream_threshold_bytes: 1GiB}"
	if _, err := loadStrings(cfg, okRoute); err != nil {
		t.Errorf("the bounds themselves: %v", err)
	}
	for _, r := range []string{
		`type: upstream, prefix: /a, target: "http://127.0.0.1:9000", health_check: {path: /h, interval: 100ms, timeout: 10ms}, passive_health: {eject_time: 24h, max_eject_time: 24h}`,
		`type: upstream, prefix: /b, target: "http://127.0.0.1:9000", health_check: {path: /h, interval: 1h, timeout: 1m}, websocket: true, tunnel_idle_timeout: 1s`,
		`type: upstream, prefix: /c, target: "http://127.0.0.1:9000", websocket: true, tunnel_idle_timeout: 24h`,
	} {
		if _, err := loadStrings("server: {proxy_protocol: {enabled: true, timeout: 1m}}", route(r)); err != nil {
			t.Errorf("the bounds themselves: %v", err)
		}
	}
	// Left out, proxy_protocol.timeout is read_timeout (SPEC 16), beyond an explicit value's
	// ceiling too.
	cfg2, err := loadStrings("server: {read_timeout: 10m, proxy_protocol: {enabled: true}}", okRoute)
	if err != nil || cfg2.Server.ProxyProtocol.Timeout != 10*time.Minute {
		t.Errorf("default proxy_protocol.timeout: %v %v", cfg2, err)
	}
}
