package gateway

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"toron/conf"
	"toron/limits"
)

// Per-client rate limits (SPEC 17), decided in decide right after routing and before the
// bulkhead: a request without a token is answered 429 at once, never queued, with Retry-After
// the whole seconds until a token is back.

// metricRateLimitKeys is toron_ratelimit_keys{route}.
const metricRateLimitKeys = "toron_ratelimit_keys"

// rejRateLimited is the 429 of SPEC 17; its Retry-After is the request's own (x.retryAfter).
var rejRateLimited = newRejection(fasthttp.StatusTooManyRequests, reasonRateLimited,
	"429 Too Many Requests: Rate limit exceeded", false)

// routeRateLimit is a route's rate_limit in one route table: the limiter (which outlives the
// table, keyed by route name) and how a request's key is found.
type routeRateLimit struct {
	lim    *limits.RateLimiter
	header string // "" keys by client IP
	rate   float64
	burst  float64
}

// rateLimitOf returns the rate limit of route rc, nil when it has none. The limiter is the
// route name's, created on first use, so the buckets of a route that keeps its name survive a
// reload; its rate is applied with the snapshot (apply).
func (g *Gateway) rateLimitOf(rc *conf.Route, st *routeStats) *routeRateLimit {
	rl := rc.Effective.RateLimit
	if rl == nil {
		return nil
	}
	return &routeRateLimit{
		lim:    g.stats.rateLimiter(st, rl.RequestsPerSecond, rl.Burst),
		header: rl.HeaderName(),
		rate:   rl.RequestsPerSecond,
		burst:  rl.Burst,
	}
}

// apply puts the table's rate and burst in force (a reload may change them).
func (rl *routeRateLimit) apply() {
	if rl != nil {
		rl.lim.SetRate(rl.rate, rl.burst)
	}
}

// rateLimiter returns the limiter of a route name, creating it and its gauge on first use.
func (r *statsRegistry) rateLimiter(s *routeStats, rate, burst float64) *limits.RateLimiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.limiter == nil {
		lim := limits.NewRateLimiter(rate, burst, conf.RateLimitMaxKeys)
		s.limiter = lim
		r.set.GetOrCreateGauge(metricRateLimitKeys+`{route=`+quoteLabel(s.name)+`}`, func() float64 { return float64(lim.Keys()) })
	}
	return s.limiter
}

// allow takes a token for the request; on a refusal it records the Retry-After value.
func (rl *routeRateLimit) allow(h *fasthttp.RequestHeader, x *exchange) bool {
	var k limits.RateKey
	if v := rl.peekKey(h); len(v) > 0 {
		k = rl.lim.HeaderKey(v)
	} else {
		k = limits.IPKey(x.clientIP)
	}
	ok, wait := rl.lim.Allow(k, x.start)
	if !ok {
		x.retryAfter = strconv.AppendInt(x.retryAfter[:0], limits.RetryAfterSeconds(wait), 10)
	}
	return ok
}

// peekKey returns the value of the route's key header, nil when it keys by client IP.
func (rl *routeRateLimit) peekKey(h *fasthttp.RequestHeader) []byte {
	if rl.header == "" {
		return nil
	}
	return h.Peek(rl.header)
}
