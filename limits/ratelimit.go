package limits

import (
	"hash/maphash"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Per-client rate limits (SPEC 17): a token bucket of Burst tokens per key, refilled at Rate
// tokens per second.
//
// Each bucket is kept as one number, its theoretical arrival time (the generic cell rate
// algorithm, GCRA, which is a token bucket written differently): tat is the moment the bucket
// will be full again. A request at now is allowed when max(tat, now) - now <= (Burst-1)/Rate,
// and then pushes tat by 1/Rate. A bucket whose tat has passed is full, exactly like a bucket
// never seen, so it can be forgotten without changing any verdict: that is how a key whose
// bucket is full again holds no memory. Forgetting is done by a sweep of the shard that a
// request or a metrics scrape runs at most once a second, never by a goroutine or a timer per
// key.
//
// Memory is bounded: at most MaxKeys buckets (a key is 16 bytes, a bucket 8, no pointers for
// the garbage collector to scan); beyond, new keys share one overflow bucket of the same size,
// and a key already in the table is never dropped to make room. A shard whose table shrank to a
// quarter of its peak is rebuilt, since a Go map never gives its memory back by itself.

// RateKey identifies a bucket: a client IP (IPv6 per /64) or a hashed header value.
type RateKey struct{ hi, lo uint64 }

// IPKey returns the key of a client address: an IPv4 address as itself, an IPv6 address by its
// /64 (one subscriber line usually holds a whole /64 and can rotate through it at will).
// IPv4-mapped IPv6 addresses must be unmapped by the caller.
func IPKey(a netip.Addr) RateKey {
	b := a.As16()
	hi := be64(b[:8])
	if a.Is4() {
		// ::ffff:a.b.c.d: lo has 0xffff in its bytes 2-3, which no /64 key (lo = 0) has.
		return RateKey{hi: hi, lo: be64(b[8:])}
	}
	return RateKey{hi: hi}
}

// headerKeyLo marks header keys: no IP key has lo = 1 (IPv4 keys carry 0xffff, IPv6 keys 0).
const headerKeyLo = 1

func be64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// DefaultRateLimitKeys is the bound of SPEC 17 on the buckets of one route.
const DefaultRateLimitKeys = 100_000

// rateShards spreads the buckets over independently locked tables, so that concurrent
// requests of different clients rarely wait for each other.
const (
	rateShardBits = 5
	rateShards    = 1 << rateShardBits
)

// sweepEvery is how often a shard forgets its full buckets; sweepFullEvery is the same when
// the table is full and a new key arrives (a flood of new keys must not make every request
// scan a shard).
const (
	sweepEvery     = time.Second
	sweepFullEvery = 100 * time.Millisecond
	// shrinkMinPeak: a table that never held more than this many keys is not worth rebuilding.
	shrinkMinPeak = 512
)

// RateLimiter holds the buckets of one route. It outlives route tables: the gateway keys it by
// route name, so that a reload keeps every client's bucket (SPEC 17, like a bulkhead). It is safe
// for concurrent use.
type RateLimiter struct {
	epoch time.Time
	// interval is 1/Rate and tolerance (Burst-1)/Rate, in nanoseconds.
	interval  atomic.Int64
	tolerance atomic.Int64

	maxKeys int64
	keys    atomic.Int64
	seed    maphash.Seed

	overflow atomic.Int64 // tat of the bucket shared by the keys beyond maxKeys
	shards   [rateShards]rateShard
}

type rateShard struct {
	mu        sync.Mutex
	tat       map[RateKey]int64
	lastSweep int64
	peak      int
	_         [32]byte // keeps neighbouring shards' locks off one cache line
}

// NewRateLimiter returns a limiter of rate tokens per second and burst tokens per bucket
// (burst >= 1), with at most maxKeys buckets (0: DefaultRateLimitKeys).
func NewRateLimiter(rate, burst float64, maxKeys int) *RateLimiter {
	if maxKeys <= 0 {
		maxKeys = DefaultRateLimitKeys
	}
	// The epoch lies in the past so that times before the limiter was built (a request that
	// began just before a reload created it) stay positive.
	l := &RateLimiter{epoch: time.Now().Add(-time.Minute), maxKeys: int64(maxKeys), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].tat = make(map[RateKey]int64)
	}
	l.SetRate(rate, burst)
	return l
}

// SetRate changes the rate and the burst (a reload may); buckets keep their state.
func (l *RateLimiter) SetRate(rate, burst float64) {
	if !(rate > 0) {
		panic("BUG: limits: rate limit with a rate that is not positive")
	}
	// Both are capped at about 36 years (a bucket never holds more than 36 years of refill), so
	// that no sum of times can overflow an int64.
	interval := math.Min(maxSpan, math.Max(1, math.Round(float64(time.Second)/rate)))
	l.interval.Store(int64(interval))
	l.tolerance.Store(int64(math.Min(maxSpan, math.Round(math.Max(0, burst-1)*interval))))
}

// maxSpan bounds the interval and the tolerance of a limiter, in nanoseconds.
const maxSpan = float64(1 << 60)

// HeaderKey returns the key of a header value. The value is hashed with a seed of this
// process, so that a key costs 16 bytes whatever its length and nobody can aim two values
// at one bucket.
func (l *RateLimiter) HeaderKey(v []byte) RateKey {
	return RateKey{hi: maphash.Bytes(l.seed, v), lo: headerKeyLo}
}

// Allow takes a token from k's bucket at now. When there is none it returns false and how long
// until one is back; the request must then be refused, never queued.
func (l *RateLimiter) Allow(k RateKey, now time.Time) (bool, time.Duration) {
	t := int64(now.Sub(l.epoch))
	interval, tolerance := l.interval.Load(), l.tolerance.Load()
	sh := &l.shards[shardOf(k)]
	sh.mu.Lock()
	tat, found := sh.tat[k]
	if !found {
		if !l.reserveKey() {
			// The table is full: forget the full buckets of this shard if that was not done
			// lately, else this key shares the overflow bucket.
			if t-sh.lastSweep >= int64(sweepFullEvery) {
				l.sweep(sh, t)
			}
			if !l.reserveKey() {
				sh.mu.Unlock()
				return l.allowOverflow(t, interval, tolerance)
			}
		}
		tat = t
	}
	if tat < t {
		tat = t
	}
	if wait := tat - tolerance - t; wait > 0 {
		// Refused: the bucket is unchanged (a key seen for the first time always has a token,
		// so found is true here and nothing was reserved).
		sh.mu.Unlock()
		return false, time.Duration(wait)
	}
	sh.tat[k] = tat + interval
	if n := len(sh.tat); n > sh.peak {
		sh.peak = n
	}
	if t-sh.lastSweep >= int64(sweepEvery) {
		l.sweep(sh, t)
	}
	sh.mu.Unlock()
	return true, 0
}

// allowOverflow is Allow on the bucket shared by the keys beyond the table.
func (l *RateLimiter) allowOverflow(t, interval, tolerance int64) (bool, time.Duration) {
	for {
		old := l.overflow.Load()
		tat := max(old, t)
		if wait := tat - tolerance - t; wait > 0 {
			return false, time.Duration(wait)
		}
		if l.overflow.CompareAndSwap(old, tat+interval) {
			return true, 0
		}
	}
}

// reserveKey counts one more key if the table has room.
func (l *RateLimiter) reserveKey() bool { return addBelow(&l.keys, l.maxKeys) }

// sweep forgets the full buckets of sh (their tat has passed) and rebuilds its table when it
// shrank to a quarter of its peak. sh.mu is held.
func (l *RateLimiter) sweep(sh *rateShard, t int64) {
	sh.lastSweep = t
	freed := 0
	for k, tat := range sh.tat {
		if tat <= t {
			delete(sh.tat, k)
			freed++
		}
	}
	l.keys.Add(int64(-freed))
	if n := len(sh.tat); sh.peak >= shrinkMinPeak && n < sh.peak/4 {
		m := make(map[RateKey]int64, n)
		for k, v := range sh.tat {
			m[k] = v
		}
		sh.tat, sh.peak = m, n
	}
}

// Keys returns how many buckets the limiter holds (toron_ratelimit_keys), after forgetting the
// full ones of shards that were not swept within the last second.
func (l *RateLimiter) Keys() int64 {
	l.SweepIfDue(time.Now())
	return l.keys.Load()
}

// SweepIfDue forgets the full buckets of every shard not swept within the last second.
func (l *RateLimiter) SweepIfDue(now time.Time) {
	t := int64(now.Sub(l.epoch))
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		if t-sh.lastSweep >= int64(sweepEvery) {
			l.sweep(sh, t)
		}
		sh.mu.Unlock()
	}
}

// shardOf spreads keys over the shards (a multiplicative hash of both halves).
func shardOf(k RateKey) uint64 {
	h := k.hi*0x9e3779b97f4a7c15 ^ k.lo*0xc2b2ae3d27d4eb4f
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	return h >> (64 - rateShardBits)
}

// RetryAfterSeconds is the Retry-After value of a refusal that must wait d: whole seconds,
// rounded up, at least 1 (SPEC 17).
func RetryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(1, s)
}
