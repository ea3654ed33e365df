package conf

import "time"

// Built-in defaults (SPEC 2), the lowest configuration layer. Each says why it has its value.
const (
	// DefaultHost listens on every interface: Toron is an edge proxy, and a container's
	// loopback is unreachable from its load balancer.
	DefaultHost = "0.0.0.0"
	// DefaultPort is the conventional unprivileged HTTP alternate port, so Toron needs no
	// CAP_NET_BIND_SERVICE.
	DefaultPort = 8080
	// DefaultWorkerPoolSize is the seed's reactor worker count: enough parallel requests for a
	// gateway in front of a few backends, small enough that the elevated share (32) still
	// bounds the legacy routes.
	DefaultWorkerPoolSize = 128
	// DefaultWorkerQueueTimeout is short on purpose: a request that cannot get a worker within
	// 50ms is better answered 503 at once (the client retries elsewhere) than queued behind a
	// saturated pool, which is how latency collapses.
	DefaultWorkerQueueTimeout = 50 * time.Millisecond
	// DefaultElevatedShare keeps at least 75% of the workers for fast routes and probes
	// whatever the legacy routes do (SPEC 4).
	DefaultElevatedShare = 0.25
	// DefaultMaxConnectionsPerWorker sizes max_connections when unset: idle keep-alive
	// connections hold no worker, so many more connections than workers are cheap, yet a bound
	// still stops file-descriptor exhaustion (SPEC 4: a fasthttp Concurrency of only 128
	// starved /health under slowloris).
	DefaultMaxConnectionsPerWorker = 64
	// DefaultReadTimeout is the hardened perimeter value of the seed: a legitimate client
	// sends its headers, and keeps a body moving, well within 5s.
	DefaultReadTimeout = 5 * time.Second
	// DefaultWriteTimeout mirrors DefaultReadTimeout for the slow-read defence.
	DefaultWriteTimeout = 5 * time.Second
	// DefaultResponseHeaderTimeout is twice the client windows: fast upstreams answer in
	// milliseconds, and a slower one must opt in per route (which makes the route elevated).
	DefaultResponseHeaderTimeout = 10 * time.Second
	// DefaultConnectTimeout covers a SYN retransmission (1s, then 2s) on a lossy network
	// before the dial is given up with a 502.
	DefaultConnectTimeout = 3 * time.Second
	// DefaultUpstreamIdleTimeout keeps upstream connections across the gaps of ordinary
	// traffic while staying below common upstream keep-alive timeouts (nginx: 75s), so Toron
	// usually closes an idle connection before the upstream does; a shorter upstream timeout
	// is covered by the safe retry of SPEC 3 step 9.
	DefaultUpstreamIdleTimeout = 30 * time.Second
	// DefaultMaxBodyBytes is the seed's 4 MiB global ceiling: enough for JSON APIs and form
	// posts, small enough that buffered bodies cannot exhaust memory.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultMaxHeaderBytes matches the common 8 KiB header limit of nginx and Apache, so
	// requests valid behind them are valid behind Toron.
	DefaultMaxHeaderBytes = 8 << 10
	// DefaultMinProgressBytes is the anti-drip floor per window (SPEC 5): 1 KiB per 5s is far
	// below any live client and far above a Slowloris drip.
	DefaultMinProgressBytes = 1 << 10
	// DefaultStreamThresholdBytes: at or below 64 KiB a body is cheaper to buffer than to
	// stream, and 64 KiB is the streaming buffer size (SPEC 6).
	DefaultStreamThresholdBytes = 64 << 10
	// DefaultInboundChunkedMode converts chunked bodies for legacy upstreams that cannot read
	// them (SPEC 7).
	DefaultInboundChunkedMode = ChunkedNormalize
	// DefaultShutdownTimeout is the common Kubernetes terminationGracePeriodSeconds: in-flight
	// requests get as long as the orchestrator would wait anyway.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultDrainDelay covers a load balancer's health check interval (typically 2-5s), so
	// it sees /health draining and stops sending before the listener closes.
	DefaultDrainDelay = 5 * time.Second
	// DefaultHealthPath and DefaultMetricsPath are the paths load balancers and Prometheus
	// scrape by default.
	DefaultHealthPath  = "/health"
	DefaultMetricsPath = "/metrics"

	// DefaultLogLevel logs startup, reloads and errors, and access lines, but no debug detail.
	DefaultLogLevel = "info"
	// DefaultLogFormat is JSON because log pipelines parse it; console is for humans.
	DefaultLogFormat = "json"
	// DefaultLogAccess is on: one line per request is what operators of nginx expect.
	DefaultLogAccess = true

	// DefaultMaxUpstreamConns bounds the upstream pool of a route without a bulkhead; it is
	// four times the default worker pool, so a route that is not elevated is never limited by
	// its pool before the workers are.
	DefaultMaxUpstreamConns = 512
	// GuardrailMaxConcurrency caps the bulkhead the guardrail gives an elevated route without
	// max_concurrency (SPEC 2): min(32, worker_pool_size/4), at least 1.
	GuardrailMaxConcurrency = 32
	// MaxBufferedBodyBytes is the largest max_body_bytes a route that always buffers
	// (stream_request_body: false) may have: above it one request could pin too much memory.
	MaxBufferedBodyBytes = 8 << 20
	// MaxSensibleHeaderBytes is the max_header_bytes above which the configuration is warned
	// about: fasthttp allocates a read buffer of that size for every open connection.
	MaxSensibleHeaderBytes = 64 << 10
)

// Values of Server.InboundChunkedMode and Effective.InboundChunkedMode (SPEC 7).
const (
	// ChunkedNormalize decodes a chunked body and forwards it with a Content-Length when it is
	// small, re-chunked otherwise.
	ChunkedNormalize = "normalize"
	// ChunkedPassthrough always forwards a chunked body chunked.
	ChunkedPassthrough = "passthrough"
)

// Values of Effective.MaxConcurrencySource.
const (
	// SourceExplicit: the route sets max_concurrency.
	SourceExplicit = "explicit"
	// SourceGuardrail: the route is elevated and has no max_concurrency, so the guardrail set it.
	SourceGuardrail = "guardrail"
	// SourceUnlimited: the route is not elevated and has no max_concurrency (MaxConcurrency 0).
	SourceUnlimited = "unlimited"
)

// Values of Effective.StreamRequestBody.
const (
	// StreamAuto (stream_request_body unset) streams bodies above stream_threshold_bytes and
	// chunked bodies, and buffers the rest (SPEC 6).
	StreamAuto = "auto"
	// StreamAlways (stream_request_body: true) streams every body.
	StreamAlways = "always"
	// StreamNever (stream_request_body: false) buffers every body.
	StreamNever = "never"
)

// RouteTypeUpstream is the only route type: proxy to Target.
const RouteTypeUpstream = "upstream"

// NoRouteName is the metrics label of requests without a route (SPEC 8); no route may use it.
const NoRouteName = "none"

// defaultLayer is the built-in layer as koanf keys. max_connections and idle_timeout are
// absent on purpose: their defaults derive from other keys and are computed after the merge.
func defaultLayer() map[string]any {
	return map[string]any{
		"server.host":                    DefaultHost,
		"server.port":                    DefaultPort,
		"server.worker_pool_size":        DefaultWorkerPoolSize,
		"server.worker_queue_timeout":    DefaultWorkerQueueTimeout,
		"server.elevated_share":          DefaultElevatedShare,
		"server.read_timeout":            DefaultReadTimeout,
		"server.write_timeout":           DefaultWriteTimeout,
		"server.response_header_timeout": DefaultResponseHeaderTimeout,
		"server.connect_timeout":         DefaultConnectTimeout,
		"server.upstream_idle_timeout":   DefaultUpstreamIdleTimeout,
		"server.max_body_bytes":          int64(DefaultMaxBodyBytes),
		"server.max_header_bytes":        int64(DefaultMaxHeaderBytes),
		"server.min_progress_bytes":      int64(DefaultMinProgressBytes),
		"server.stream_threshold_bytes":  int64(DefaultStreamThresholdBytes),
		"server.inbound_chunked_mode":    DefaultInboundChunkedMode,
		"server.shutdown_timeout":        DefaultShutdownTimeout,
		"server.drain_delay":             DefaultDrainDelay,
		"server.health_path":             DefaultHealthPath,
		"server.metrics_path":            DefaultMetricsPath,
		"server.tracing.sample_ratio":    DefaultTracingSampleRatio,
		"server.tracing.service_name":    DefaultTracingServiceName,
		"server.tracing.trust_incoming":  DefaultTracingTrustIncoming,
		"log.level":                      DefaultLogLevel,
		"log.format":                     DefaultLogFormat,
		"log.access":                     DefaultLogAccess,
	}
}
