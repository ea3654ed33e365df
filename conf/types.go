// Package conf loads, defaults and validates Toron's configuration: config.yaml (key server and
// log), routes.yaml (key routes) and the TORON_SERVER__* / TORON_LOG__* environment, in the order
// built-in defaults < files < environment (SPEC 1-2). A loaded Config is immutable; a reload builds
// a whole new one.
package conf

import (
	"crypto/x509"
	"time"
)

// Config is one complete, validated configuration.
type Config struct {
	// Server holds the server-wide settings of config.yaml.
	Server Server `koanf:"server" json:"server"`
	// Log holds the log settings of config.yaml.
	Log Log `koanf:"log" json:"log"`
	// Routes is the route table of routes.yaml, in file order, each with its effective values.
	Routes []Route `koanf:"routes" json:"routes"`

	// ConfigFile and RoutesFile name the files this configuration came from, as given to Load
	// or LoadBytes (in demo mode the names main passes, "demo config" and "demo routes").
	ConfigFile string `koanf:"-" json:"config_file"`
	RoutesFile string `koanf:"-" json:"routes_file"`
	// Warnings are the non-fatal findings of validation (the elevated-budget warning), one line each.
	Warnings []string `koanf:"-" json:"warnings,omitempty"`
}

// Server holds the server settings (config.yaml, key server). Every field has a default (SPEC 2).
// Durations and header and threshold sizes are bounded (bounds.go: floors and ceilings, with why).
type Server struct {
	// Host and Port are the listener address; defaults 0.0.0.0 and 8080.
	Host string `koanf:"host" json:"host"`
	Port int    `koanf:"port" json:"port"`
	// WorkerPoolSize bounds the requests processed at once; default 128.
	WorkerPoolSize int `koanf:"worker_pool_size" json:"worker_pool_size"`
	// WorkerQueueTimeout is how long a request may wait for a worker; default 50ms.
	WorkerQueueTimeout time.Duration `koanf:"worker_queue_timeout" json:"worker_queue_timeout"`
	// ElevatedShare is the share of workers all elevated routes may hold together; default 0.25.
	ElevatedShare float64 `koanf:"elevated_share" json:"elevated_share"`
	// MaxConnections bounds open client connections; default 64 × WorkerPoolSize.
	MaxConnections int `koanf:"max_connections" json:"max_connections"`
	// ReadTimeout is the absolute header deadline and the sliding body window; default 5s.
	ReadTimeout time.Duration `koanf:"read_timeout" json:"read_timeout"`
	// WriteTimeout is the sliding window for writes to the client; default 5s.
	WriteTimeout time.Duration `koanf:"write_timeout" json:"write_timeout"`
	// ResponseHeaderTimeout bounds the wait for upstream response headers; default 10s.
	ResponseHeaderTimeout time.Duration `koanf:"response_header_timeout" json:"response_header_timeout"`
	// ConnectTimeout bounds dialing an upstream; default 3s.
	ConnectTimeout time.Duration `koanf:"connect_timeout" json:"connect_timeout"`
	// IdleTimeout is the keep-alive wait for a client's next request; default = ReadTimeout.
	IdleTimeout time.Duration `koanf:"idle_timeout" json:"idle_timeout"`
	// UpstreamIdleTimeout is how long an idle upstream connection is kept; default 30s.
	UpstreamIdleTimeout time.Duration `koanf:"upstream_idle_timeout" json:"upstream_idle_timeout"`
	// MaxBodyBytes is the body ceiling in bytes; default 4194304 (4 MiB).
	MaxBodyBytes int64 `koanf:"max_body_bytes" json:"max_body_bytes"`
	// MaxHeaderBytes bounds the request line plus headers in bytes (431 above); default 8192.
	MaxHeaderBytes int64 `koanf:"max_header_bytes" json:"max_header_bytes"`
	// MinProgressBytes is the anti-drip minimum per window, reading and writing; default 1024.
	MinProgressBytes int64 `koanf:"min_progress_bytes" json:"min_progress_bytes"`
	// StreamThresholdBytes: bodies above it (or chunked) stream; default 65536.
	StreamThresholdBytes int64 `koanf:"stream_threshold_bytes" json:"stream_threshold_bytes"`
	// InboundChunkedMode is "normalize" (default) or "passthrough" (SPEC 7).
	InboundChunkedMode string `koanf:"inbound_chunked_mode" json:"inbound_chunked_mode"`
	// ShutdownTimeout bounds the graceful drain; default 30s.
	ShutdownTimeout time.Duration `koanf:"shutdown_timeout" json:"shutdown_timeout"`
	// DrainDelay is how long /health says draining before the listener closes; default 5s.
	DrainDelay time.Duration `koanf:"drain_delay" json:"drain_delay"`
	// HealthPath and MetricsPath are served by the gateway itself; defaults /health and /metrics.
	HealthPath  string `koanf:"health_path" json:"health_path"`
	MetricsPath string `koanf:"metrics_path" json:"metrics_path"`

	// TrustedProxies lists the IP addresses and CIDRs (IPv4 and IPv6) whose X-Forwarded-For is
	// believed (SPEC 16); default empty: every peer is the client.
	TrustedProxies []string `koanf:"trusted_proxies" json:"trusted_proxies"`
	// ProxyProtocol turns the PROXY protocol on for the listener (SPEC 16); default off.
	ProxyProtocol ProxyProtocol `koanf:"proxy_protocol" json:"proxy_protocol"`
	// TLS turns TLS on for the listener (SPEC 14); nil (the default): plain HTTP.
	TLS *TLS `koanf:"tls" json:"tls,omitempty"`
	// Tracing exports OpenTelemetry traces (SPEC 21, conf/tracing.go); off without endpoint.
	Tracing Tracing `koanf:"tracing" json:"tracing"`
	// AuthDefaults is the auth block of the routes that say auth: default (SPEC 19,
	// conf/auth.go); nil (the default): none.
	AuthDefaults *Auth `koanf:"auth_defaults" json:"auth_defaults,omitempty"`
	// Resolver is the "host:port" of the DNS server of DNS discovery (SPEC 13); "" (the
	// default): the system's resolver.
	Resolver string `koanf:"resolver" json:"resolver,omitempty"`
	// Redis holds the buckets of the global rate limits (SPEC 17); nil (the default): none,
	// and a route's rate_limit cannot have scope: global.
	Redis *Redis `koanf:"redis" json:"redis,omitempty"`
}

// Log holds the log settings (config.yaml, key log).
type Log struct {
	// Level is a zap level name; default "info".
	Level string `koanf:"level" json:"level"`
	// Format is "json" (default) or "console".
	Format string `koanf:"format" json:"format"`
	// Access turns the one-line-per-request access log on; default true.
	Access bool `koanf:"access" json:"access"`
}

// Route is one entry of routes.yaml. The override fields are pointers: nil means "inherit the
// server value". Load fills Effective; handlers should read Effective, not the overrides.
type Route struct {
	// Type is the route type: "upstream" (RouteTypeUpstream) or "redirect"
	// (RouteTypeRedirect, answered at routing with Traffic.Redirect). Required.
	Type string `koanf:"type" json:"type"`
	// Name labels the route in logs and metrics and keys its bulkhead counter across reloads.
	// Unique; Load fills in the default host + prefix (+ " " + comma-joined methods).
	Name string `koanf:"name" json:"name"`
	// Prefix is the path prefix, matched at a segment boundary against the normalized
	// path. Required; starts with "/" and is itself normalized.
	Prefix string `koanf:"prefix" json:"prefix"`
	// Host is "" (every host), an exact host name, or a wildcard "*.example.com" matching one
	// or more labels. Load lower-cases it; it never has a port.
	Host string `koanf:"host" json:"host,omitempty"`
	// Methods are the upper-case methods the route takes; nil means every method.
	Methods []string `koanf:"methods" json:"methods,omitempty"`
	// Target is the upstream, exactly "http://host:port" or "https://host:port" (no path,
	// query or user information). Required.
	Target string `koanf:"target" json:"target"`

	// MaxBodyBytes overrides Server.MaxBodyBytes (bytes; 0 accepts no body).
	MaxBodyBytes *int64 `koanf:"max_body_bytes" json:"-"`
	// ReadTimeout overrides Server.ReadTimeout (> 0).
	ReadTimeout *time.Duration `koanf:"read_timeout" json:"-"`
	// WriteTimeout overrides Server.WriteTimeout (> 0).
	WriteTimeout *time.Duration `koanf:"write_timeout" json:"-"`
	// ResponseHeaderTimeout overrides Server.ResponseHeaderTimeout (> 0).
	ResponseHeaderTimeout *time.Duration `koanf:"response_header_timeout" json:"-"`
	// ConnectTimeout overrides Server.ConnectTimeout (> 0).
	ConnectTimeout *time.Duration `koanf:"connect_timeout" json:"-"`
	// MinProgressBytes overrides Server.MinProgressBytes (bytes; 0 turns the drip check off).
	MinProgressBytes *int64 `koanf:"min_progress_bytes" json:"-"`
	// InboundChunkedMode overrides Server.InboundChunkedMode.
	InboundChunkedMode *string `koanf:"inbound_chunked_mode" json:"-"`
	// MaxConcurrency is the bulkhead size (>= 1); nil lets the guardrail decide.
	MaxConcurrency *int `koanf:"max_concurrency" json:"-"`
	// MaxUpstreamConns is the upstream pool size (>= 1); nil means MaxConcurrency, else 512.
	MaxUpstreamConns *int `koanf:"max_upstream_conns" json:"-"`
	// StreamRequestBody: true always streams, false always buffers, nil decides by size.
	StreamRequestBody *bool `koanf:"stream_request_body" json:"-"`

	// RateLimit is the per-client token bucket of SPEC 17; nil means no limit. The resolved
	// value (burst and key defaulted) is Effective.RateLimit.
	RateLimit *RateLimit `koanf:"rate_limit" json:"-"`
	// Access and Auth are access control before the body (SPEC 19, conf/auth.go); nil means
	// none. Their resolved values (auth: default filled in) are Effective.Access and .Auth.
	Access *Access `koanf:"access" json:"-"`
	Auth   *Auth   `koanf:"auth" json:"-"`
	// WebSocket tunnels and path rewriting (SPEC 15, SPEC 16; conf/tunnel.go).
	// Websocket lets WebSocket upgrades through this route; default false (they get a 501).
	Websocket bool `koanf:"websocket" json:"-"`
	// MaxTunnels bounds the open tunnels of the route (>= 1); nil means DefaultMaxTunnels.
	MaxTunnels *int `koanf:"max_tunnels" json:"-"`
	// TunnelIdleTimeout closes a tunnel that moved no byte either way for this long (> 0); nil
	// means DefaultTunnelIdleTimeout.
	TunnelIdleTimeout *time.Duration `koanf:"tunnel_idle_timeout" json:"-"`
	// StripPrefix removes the route's prefix from the forwarded path; default false.
	StripPrefix bool `koanf:"strip_prefix" json:"-"`
	// AddPrefix is prepended to the forwarded path (after the strip); "" adds nothing. It
	// starts with "/", has no trailing "/" and no "." or ".." segment.
	AddPrefix string `koanf:"add_prefix" json:"-"`

	// Effective holds the values in force for this route once defaults, overrides and the
	// guardrail are applied.
	Effective Effective `koanf:"-" json:"effective"`

	// Several upstreams (SPEC 13, conf/targets.go); resolved in Effective.Targets and after.
	// Targets replaces Target (exactly one of the two); with Targets, Load sets Target to the
	// first target's URL. Targets, PassiveHealth and HealthCheck are nested, so decoded by
	// decodeUpstreamKey rather than the flat route schema.
	Targets []TargetEntry `koanf:"-" json:"-"`
	// Balance is BalanceP2C (nil: the default), BalanceLeastRequest, BalanceRoundRobin or
	// BalanceClientIPHash.
	Balance *string `koanf:"balance" json:"-"`
	// LatencyDecay is peak EWMA's time constant, 1s..5m; nil: DefaultLatencyDecay.
	LatencyDecay *time.Duration `koanf:"latency_decay" json:"-"`
	// DiscoveryRefresh is the time between two lookups of a discover: dns entry, 1s..5m; nil:
	// DefaultDiscoveryRefresh.
	DiscoveryRefresh *time.Duration `koanf:"discovery_refresh" json:"-"`
	// PassiveHealth is passive_health with its defaults filled in; nil: all defaults.
	PassiveHealth *PassiveHealth `koanf:"-" json:"-"`
	// HealthCheck is health_check with its defaults filled in; nil: no active checks.
	HealthCheck *HealthCheck `koanf:"-" json:"-"`
	// Retries is how many other targets a request may try, 0..3; nil: DefaultRetries.
	Retries *int `koanf:"retries" json:"-"`
	// TLSCAFile is a PEM bundle the https:// upstream's certificate must chain to; empty:
	// the system roots (SPEC 14).
	TLSCAFile string `koanf:"tls_ca_file" json:"tls_ca_file,omitempty"`
	// TLSServerName is the name sent as SNI and verified; empty: the target's host.
	TLSServerName string `koanf:"tls_server_name" json:"tls_server_name,omitempty"`
	// TLSInsecureSkipVerify turns verification of the upstream's certificate off (warned).
	TLSInsecureSkipVerify bool `koanf:"tls_insecure_skip_verify" json:"tls_insecure_skip_verify,omitempty"`
	// TLSRootCAs is TLSCAFile parsed by Load; nil for the system roots.
	TLSRootCAs *x509.CertPool `koanf:"-" json:"-"`

	// Traffic holds the traffic-rule keys (to, status, https_only, request_headers,
	// response_headers, cors, compress; SPEC 20, conf/traffic.go), decoded by decodeTrafficKey;
	// resolved in Effective.Traffic.
	Traffic Traffic `koanf:"-" json:"-"`
}

// Effective is a route's resolved settings: each override, else the server's value, with
// the guardrail applied. Every field is set by Load.
type Effective struct {
	// MaxBodyBytes is the body ceiling in bytes; 0 means no body is accepted.
	MaxBodyBytes int64 `json:"max_body_bytes"`
	// ReadTimeout is the route's sliding body window (headers are read under the server's
	// read_timeout: the route is not known before them); always > 0.
	ReadTimeout time.Duration `json:"read_timeout"`
	// WriteTimeout is the sliding window for writes to the client; always > 0.
	WriteTimeout time.Duration `json:"write_timeout"`
	// ResponseHeaderTimeout bounds the wait for upstream response headers; always > 0.
	ResponseHeaderTimeout time.Duration `json:"response_header_timeout"`
	// ConnectTimeout bounds dialing the upstream; always > 0.
	ConnectTimeout time.Duration `json:"connect_timeout"`
	// MinProgressBytes is the anti-drip minimum per window; 0 turns the drip check off (a
	// pause longer than ReadTimeout is still cut).
	MinProgressBytes int64 `json:"min_progress_bytes"`
	// InboundChunkedMode is ChunkedNormalize or ChunkedPassthrough.
	InboundChunkedMode string `json:"inbound_chunked_mode"`
	// MaxConcurrency is the bulkhead size; 0 means unlimited.
	MaxConcurrency int `json:"max_concurrency"`
	// MaxConcurrencySource is SourceExplicit, SourceGuardrail or SourceUnlimited.
	MaxConcurrencySource string `json:"max_concurrency_source"`
	// MaxUpstreamConns is the upstream pool size: explicit, else MaxConcurrency, else 512.
	MaxUpstreamConns int `json:"max_upstream_conns"`
	// StreamRequestBody is StreamAuto, StreamAlways or StreamNever.
	StreamRequestBody string `json:"stream_request_body"`
	// Elevated is true when any limit exceeds the server's (SPEC 2 guardrail); ElevatedReasons
	// names each one, e.g. "max_body_bytes 209715200 > server 4194304".
	Elevated        bool     `json:"elevated"`
	ElevatedReasons []string `json:"elevated_reasons,omitempty"`

	// Targets are the route's upstreams with their weights: the targets list, or target as one
	// entry of weight 1 (SPEC 13).
	Targets []EffectiveTarget `json:"targets"`
	// Balance is BalanceP2C, BalanceLeastRequest, BalanceRoundRobin or BalanceClientIPHash.
	Balance string `json:"balance"`
	// LatencyDecay is p2c's peak-EWMA decay (SPEC 13 latency_decay).
	LatencyDecay time.Duration `json:"latency_decay"`
	// DiscoveryRefresh is the lookup period of discovered entries; 0 when the route has none.
	DiscoveryRefresh time.Duration `json:"discovery_refresh,omitempty"`
	// PassiveHealth is always set; ConsecutiveFailures 0 means off.
	PassiveHealth PassiveHealth `json:"passive_health"`
	// HealthCheck is nil when the route has no active checks.
	HealthCheck *HealthCheck `json:"health_check"`
	// Retries is the route's retries, capped at its number of other targets.
	Retries int `json:"retries"`
	// RateLimit is the route's rate_limit with burst and key defaulted; nil means no limit.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// Access is the route's IP lists; nil when it has none. Auth is its auth block, with auth:
	// default resolved to server.auth_defaults; nil when it has none.
	Access *Access `json:"access,omitempty"`
	Auth   *Auth   `json:"auth,omitempty"`
	// Websocket is the route's websocket key. MaxTunnels and TunnelIdleTimeout are its tunnel
	// limits, set only when Websocket is true (SPEC 15).
	Websocket         bool          `json:"websocket"`
	MaxTunnels        int           `json:"max_tunnels,omitempty"`
	TunnelIdleTimeout time.Duration `json:"tunnel_idle_timeout,omitempty"`
	// StripPrefix and AddPrefix are the route's rewriting keys (SPEC 16); RewriteExamples shows
	// what they do to example paths, for -check (nil when the route does not rewrite).
	StripPrefix     bool             `json:"strip_prefix,omitempty"`
	AddPrefix       string           `json:"add_prefix,omitempty"`
	RewriteExamples []RewriteExample `json:"rewrite_examples,omitempty"`
	// Traffic is the route's traffic rules with their defaults (SPEC 20); nil when it has none.
	Traffic *Traffic `json:"traffic,omitempty"`
}
