package limits

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Global rate limits (SPEC 17, scope: global): every replica shares a key's bucket in Redis, so
// N replicas together admit what one would.
//
// A decision is one server-side script (gcraScript): the same GCRA as RateLimiter, on the Redis
// server's clock (TIME), so the replicas' clocks do not matter, and atomic, so two replicas can
// never both take the last token. The bucket's theoretical arrival time is kept in microseconds
// under toron:rl:{ROUTE}:HASH and expires when the bucket is full again (a full bucket and a
// missing key are the same), so Redis holds only the keys that are limited at the moment.
// {ROUTE} is a hash tag: a route's keys sit in one slot of a cluster, and the script touches one
// key only. HASH is the first 16 hex digits of the SHA-256 of the key: no client IP or header
// value is stored in Redis.
//
// What is hashed: for a client IP, the byte 'i' and the 16 bytes of its RateKey (an IPv4
// address as ::ffff:a.b.c.d, an IPv6 address as its /64 followed by zeros); for a header, the
// byte 'h' and the value. Every replica computes the same name for the same client.

// gcraScript decides one request. KEYS[1] is the bucket, ARGV[1] the interval 1/R and ARGV[2]
// the tolerance (B-1)/R, both in microseconds. It returns {1, 0} when a token was taken, else
// {0, wait} with wait the microseconds until one is back. Lua numbers are doubles: a time in
// microseconds (about 2^51 today) is exact. It is loaded on every connection as it is set up
// (SCRIPT LOAD) and sent as EVALSHA gcraSHA; EVAL with the script follows a NOSCRIPT reply (a
// restarted or failed-over server has an empty script cache).
const gcraScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end
local wait = tat - tolerance - now
if wait > 0 then return {0, wait} end
tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000))
return {1, 0}
`

// OnError is what a global rate limit does when Redis gives no decision in time (on_error).
type OnError uint8

const (
	// OnErrorLocal lets the route's per-instance bucket decide, charged only for the decisions
	// it makes (the default).
	OnErrorLocal OnError = iota
	// OnErrorAllow admits the request.
	OnErrorAllow
	// OnErrorDeny refuses it, Retry-After 1.
	OnErrorDeny
)

// maxGlobalSpanMicros caps the interval and the tolerance sent to Redis (about 3 years), so
// that a sum with the server's time stays exact in a Lua double.
const maxGlobalSpanMicros = 1e14

// GlobalOptions configures one route's global rate limit.
type GlobalOptions struct {
	// Route names the route; its keys are toron:rl:{Route}:HASH.
	Route string
	// Local is the route's per-instance limiter, which decides under OnErrorLocal; required.
	Local *RateLimiter
	// OnError is what a failed decision does.
	OnError OnError
	// Errors counts failed decisions (toron_ratelimit_backend_errors_total{route}); may be nil.
	Errors *metrics.Counter
}

// GlobalLimiter is the rate limit of one route with scope: global. Like RateLimiter it is kept
// by route name across reloads; SetRate and SetRedis change it in place. It is safe for
// concurrent use.
type GlobalLimiter struct {
	prefix  string // toron:rl:{ROUTE}:
	local   *RateLimiter
	errors  *metrics.Counter
	onError atomic.Uint32
	redis   atomic.Pointer[Redis]
	args    atomic.Pointer[[]string] // ARGV of gcraScript
}

// NewGlobalLimiter returns a global limiter of rate tokens per second and burst tokens per
// bucket, deciding in r.
func NewGlobalLimiter(r *Redis, rate, burst float64, o GlobalOptions) *GlobalLimiter {
	if o.Local == nil {
		panic("BUG: limits: a global rate limit needs the route's local limiter")
	}
	g := &GlobalLimiter{prefix: "toron:rl:{" + o.Route + "}:", local: o.Local, errors: o.Errors}
	g.SetRate(rate, burst)
	g.SetRedis(r)
	g.SetOnError(o.OnError)
	return g
}

// SetRate changes the rate and the burst (a reload may); the buckets in Redis keep their state.
// The local limiter is not changed: its owner sets it.
func (g *GlobalLimiter) SetRate(rate, burst float64) {
	if !(rate > 0) {
		panic("BUG: limits: rate limit with a rate that is not positive")
	}
	interval := math.Min(maxGlobalSpanMicros, math.Max(1, math.Round(1e6/rate)))
	tolerance := math.Min(maxGlobalSpanMicros, math.Round(math.Max(0, burst-1)*interval))
	args := []string{strconv.FormatInt(int64(interval), 10), strconv.FormatInt(int64(tolerance), 10)}
	g.args.Store(&args)
}

// SetRedis changes the client (a reload that changed server.redis rebuilds it).
func (g *GlobalLimiter) SetRedis(r *Redis) { g.redis.Store(r) }

// SetOnError changes what a failed decision does.
func (g *GlobalLimiter) SetOnError(m OnError) { g.onError.Store(uint32(m)) }

// Local returns the route's per-instance limiter.
func (g *GlobalLimiter) Local() *RateLimiter { return g.local }

// AllowIP decides a request keyed by client address a (IPv4-mapped addresses unmapped by the
// caller), as RateLimiter.Allow does: false and the wait until a token is back when refused.
func (g *GlobalLimiter) AllowIP(a netip.Addr, now time.Time) (bool, time.Duration) {
	k := IPKey(a)
	var in [17]byte
	in[0] = 'i'
	binary.BigEndian.PutUint64(in[1:9], k.hi)
	binary.BigEndian.PutUint64(in[9:], k.lo)
	return g.allow(sha256.Sum256(in[:]), k, now)
}

// AllowHeader decides a request keyed by the value v of the route's key header.
func (g *GlobalLimiter) AllowHeader(v []byte, now time.Time) (bool, time.Duration) {
	h := sha256.New()
	h.Write([]byte{'h'})
	h.Write(v)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return g.allow(sum, g.local.HeaderKey(v), now)
}

// allow asks Redis about the bucket named by sum; when Redis gives no answer in time, on_error
// decides, local with k.
func (g *GlobalLimiter) allow(sum [sha256.Size]byte, k RateKey, now time.Time) (bool, time.Duration) {
	var hx [16]byte
	hex.Encode(hx[:], sum[:8])
	if r := g.redis.Load(); r != nil {
		if res, err := r.decide(g.prefix, hx[:], *g.args.Load()); err == nil {
			return res.ok, time.Duration(res.wait) * time.Microsecond
		}
	}
	if g.errors != nil {
		g.errors.Inc()
	}
	switch OnError(g.onError.Load()) {
	case OnErrorAllow:
		return true, 0
	case OnErrorDeny:
		return false, time.Second
	default:
		return g.local.Allow(k, now)
	}
}

var errBadVerdict = errors.New("limits: redis script answered an unexpected reply")
