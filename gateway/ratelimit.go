package gateway

import (
	"crypto/tls"
	"reflect"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"toron/conf"
	"toron/limits"
)

// Per-client rate limits (SPEC 17), decided in decide right after routing and before the
// bulkhead: a request without a token is answered 429 at once, never queued, with Retry-After
// the whole seconds until a token is back.
//
// scope: global asks Redis (limits.GlobalLimiter) in the connection's goroutine, before any
// slot or worker is taken, bounded by server.redis.timeout; the route's on_error decides when
// Redis does not answer in time (deny: Retry-After 1).

// Metric names of the rate limits.
const (
	metricRateLimitKeys   = "toron_ratelimit_keys"
	metricRateLimitErrors = "toron_ratelimit_backend_errors_total"
	metricRedisUp         = "toron_redis_up"
)

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

	// global is the route name's global limiter with scope: global, else nil; redis and
	// onError are put in force with the table.
	global  *limits.GlobalLimiter
	redis   *limits.Redis
	onError limits.OnError
}

// rateLimitOf returns the rate limit of route rc, nil when it has none. The limiter is the
// route name's, created on first use, so the buckets of a route that keeps its name survive a
// reload; its rate is applied with the snapshot (apply).
func (g *Gateway) rateLimitOf(rc *conf.Route, st *routeStats, redis *limits.Redis) *routeRateLimit {
	rl := rc.Effective.RateLimit
	if rl == nil {
		return nil
	}
	out := &routeRateLimit{
		lim:    g.stats.rateLimiter(st, rl.RequestsPerSecond, rl.Burst),
		header: rl.HeaderName(),
		rate:   rl.RequestsPerSecond,
		burst:  rl.Burst,
	}
	if rl.IsGlobal() && redis != nil {
		out.redis, out.onError = redis, onErrorOf(rl.OnError)
		out.global = g.stats.globalLimiter(st, out)
	}
	return out
}

// onErrorOf maps rate_limit.on_error to its limits value.
func onErrorOf(s string) limits.OnError {
	switch s {
	case conf.RateOnErrorAllow:
		return limits.OnErrorAllow
	case conf.RateOnErrorDeny:
		return limits.OnErrorDeny
	}
	return limits.OnErrorLocal
}

// apply puts the table's rate, burst, Redis and on_error in force (a reload may change them).
func (rl *routeRateLimit) apply() {
	if rl == nil {
		return
	}
	rl.lim.SetRate(rl.rate, rl.burst)
	if rl.global != nil {
		rl.global.SetRate(rl.rate, rl.burst)
		rl.global.SetRedis(rl.redis)
		rl.global.SetOnError(rl.onError)
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

// globalLimiter returns the global limiter of a route name, creating it and its error counter
// on first use; its local fallback is the route name's limiter.
func (r *statsRegistry) globalLimiter(s *routeStats, rl *routeRateLimit) *limits.GlobalLimiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.global == nil {
		errs := r.set.GetOrCreateCounter(metricRateLimitErrors + `{route=` + quoteLabel(s.name) + `}`)
		s.global = limits.NewGlobalLimiter(rl.redis, rl.rate, rl.burst, limits.GlobalOptions{
			Route: s.name, Local: s.limiter, OnError: rl.onError, Errors: errs})
	}
	return s.global
}

// allow takes a token for the request; on a refusal it records the Retry-After value.
func (rl *routeRateLimit) allow(h *fasthttp.RequestHeader, x *exchange) bool {
	v := rl.peekKey(h)
	var ok bool
	var wait time.Duration
	switch {
	case rl.global != nil && len(v) > 0:
		ok, wait = rl.global.AllowHeader(v, x.start)
	case rl.global != nil:
		ok, wait = rl.global.AllowIP(x.clientIP, x.start)
	case len(v) > 0:
		ok, wait = rl.lim.Allow(rl.lim.HeaderKey(v), x.start)
	default:
		ok, wait = rl.lim.Allow(limits.IPKey(x.clientIP), x.start)
	}
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

// redisOf returns the Redis client of cfg for a new snapshot: prev's when server.redis did not
// change (its connections and health carry over), a new one when it did, nil without
// server.redis. A new client connects in the background and never fails here for want of Redis.
func redisOf(cfg *conf.Config, prev *snapshot) (*limits.Redis, error) {
	rc := cfg.Server.Redis
	if rc == nil {
		return nil, nil
	}
	if prev != nil && prev.redis != nil && reflect.DeepEqual(prev.cfg.Server.Redis, rc) {
		return prev.redis, nil
	}
	o := limits.RedisOptions{Addrs: rc.Addrs, Username: rc.Username, Password: rc.Password, DB: rc.DB, Timeout: rc.Timeout}
	if rc.TLS {
		// The server name is each address's host (crypto/tls fills it from the dialed address).
		o.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return limits.NewRedis(o)
}
