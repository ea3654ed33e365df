package gateway

import (
	"strconv"
	"sync"
	"sync/atomic"
	"toron/auth"

	"github.com/VictoriaMetrics/metrics"

	"toron/limits"
)

// Metric names, literally as SPEC 8 lists them.
const (
	metricRequests          = "toron_requests_total"
	metricRejected          = "toron_rejected_total"
	metricRouteInflight     = "toron_route_inflight"
	metricRouteMaxConc      = "toron_route_max_concurrency"
	metricWorkersBusy       = "toron_workers_busy"
	metricWorkersMax        = "toron_workers_max"
	metricElevatedInflight  = "toron_elevated_inflight"
	metricRequestDuration   = "toron_request_duration_seconds"
	metricUpstreamWait      = "toron_upstream_header_wait_seconds"
	metricRequestBodyBytes  = "toron_request_body_bytes_total"
	metricResponseBodyBytes = "toron_response_body_bytes_total"
	metricConnectionsOpen   = "toron_connections_open"
	metricReloads           = "toron_config_reloads_total"
	metricReloadErrors      = "toron_config_reload_errors_total"
)

// noRoute is the route label of requests that matched no route (SPEC 8).
const noRoute = "none"

// reason is a toron_rejected_total reason; its zero value means "not rejected".
type reason uint8

// The reject reasons of SPEC 8, in one family.
const (
	reasonNone reason = iota
	reasonBodyTooLarge
	reasonHeaderTooLarge
	reasonConcurrency
	reasonElevatedBudget
	reasonWorkersSaturated
	reasonNoRoute
	reasonBadRequest
	reasonReadTimeout
	reasonSlowClient
	reasonUpstreamTimeout
	reasonUpstreamError
	reasonClientAbort
	reasonRateLimited
	reasonProxyProtocol
	reasonTunnelLimit
	reasonForbidden
	reasonUnauthorized
	reasonAuthDenied
	reasonAuthUnavailable
	reasonAuthBusy
	reasonNoTarget
	numReasons
)

var reasonNames = [numReasons]string{
	reasonNone:             "",
	reasonBodyTooLarge:     "body_too_large",
	reasonHeaderTooLarge:   "header_too_large",
	reasonConcurrency:      "concurrency",
	reasonElevatedBudget:   "elevated_budget",
	reasonWorkersSaturated: "workers_saturated",
	reasonNoRoute:          "no_route",
	reasonBadRequest:       "bad_request",
	reasonReadTimeout:      "read_timeout",
	reasonSlowClient:       "slow_client",
	reasonUpstreamTimeout:  "upstream_timeout",
	reasonUpstreamError:    "upstream_error",
	reasonClientAbort:      "client_abort",
	reasonRateLimited:      "rate_limited",
	reasonProxyProtocol:    "proxy_protocol",
	reasonTunnelLimit:      "tunnel_limit",
	reasonForbidden:        auth.ReasonForbidden,
	reasonUnauthorized:     auth.ReasonUnauthorized,
	reasonAuthDenied:       auth.ReasonDenied,
	reasonAuthUnavailable:  auth.ReasonUnavailable,
	reasonAuthBusy:         auth.ReasonBusy,
	reasonNoTarget:         "no_target",
}

func (r reason) String() string { return reasonNames[r] }

// durationBuckets cover fast API calls (milliseconds) up to the seed's 60 s reports and
// two-minute uploads, in Prometheus `le` buckets.
var durationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300,
}

// routeStats is everything that belongs to a route name rather than to one route table: its
// bulkhead and its metrics. The gateway keeps them in a registry keyed by name, so a reload
// keeps a route's in-flight count and counters (SPEC 2, SPEC 4).
type routeStats struct {
	name     string
	bulkhead *limits.Bulkhead

	set      *metrics.Set
	codes    [600]atomic.Pointer[metrics.Counter]
	rejected [numReasons]*metrics.Counter

	duration   *metrics.PrometheusHistogram
	headerWait *metrics.PrometheusHistogram
	bodyIn     *metrics.Counter
	bodyOut    *metrics.Counter

	// limiter holds the route name's rate-limit buckets (ratelimit.go), nil until a route of
	// that name has a rate_limit; set under statsRegistry.mu.
	limiter *limits.RateLimiter
	// global is the route name's limiter with scope: global (ratelimit.go), nil until a
	// route of that name has one; set under statsRegistry.mu.
	global *limits.GlobalLimiter
}

// codeCounter returns toron_requests_total{route,code}, creating it on the first use of a code:
// the label set is open-ended, the lookup after that is one atomic load.
func (s *routeStats) codeCounter(code int) *metrics.Counter {
	if code < 100 || code >= len(s.codes) {
		code = 599
	}
	if c := s.codes[code].Load(); c != nil {
		return c
	}
	c := s.set.GetOrCreateCounter(metricRequests + `{route=` + quoteLabel(s.name) + `,code="` + strconv.Itoa(code) + `"}`)
	s.codes[code].Store(c)
	return c
}

// quoteLabel quotes a Prometheus label value.
func quoteLabel(v string) string {
	return strconv.Quote(v)
}

// statsRegistry owns the routeStats of every route name ever configured in this process.
type statsRegistry struct {
	set *metrics.Set

	mu     sync.Mutex
	byName map[string]*routeStats
}

func newStatsRegistry(set *metrics.Set) *statsRegistry {
	return &statsRegistry{set: set, byName: make(map[string]*routeStats)}
}

// get returns the stats of a route name, creating them (and their metrics) on first use.
func (r *statsRegistry) get(name string) *routeStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.byName[name]; s != nil {
		return s
	}
	s := &routeStats{name: name, bulkhead: limits.NewBulkhead(0), set: r.set}
	label := `{route=` + quoteLabel(name)
	for i := reasonNone + 1; i < numReasons; i++ {
		s.rejected[i] = r.set.GetOrCreateCounter(metricRejected + label + `,reason="` + reasonNames[i] + `"}`)
	}
	s.duration = r.set.GetOrCreatePrometheusHistogramExt(metricRequestDuration+label+`}`, durationBuckets)
	s.headerWait = r.set.GetOrCreatePrometheusHistogramExt(metricUpstreamWait+label+`}`, durationBuckets)
	s.bodyIn = r.set.GetOrCreateCounter(metricRequestBodyBytes + label + `}`)
	s.bodyOut = r.set.GetOrCreateCounter(metricResponseBodyBytes + label + `}`)
	bh := s.bulkhead
	r.set.GetOrCreateGauge(metricRouteInflight+label+`}`, func() float64 { return float64(bh.InFlight()) })
	r.set.GetOrCreateGauge(metricRouteMaxConc+label+`}`, func() float64 { return float64(bh.Max()) })
	r.byName[name] = s
	return s
}
