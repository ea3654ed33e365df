package conf

import (
	"net"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// server.redis and a route's rate_limit.scope and rate_limit.on_error: the global rate limits of
// SPEC 17, shared by every replica through one Redis.

// Redis is server.redis: the Redis that holds the buckets of the routes whose rate_limit has
// scope: global. Load never connects to it: -check passes while it is down.
type Redis struct {
	// Addrs are host:port addresses: one is a standalone server or a cluster found from it,
	// several are Redis Cluster seeds. Required.
	Addrs []string `koanf:"addrs" json:"addrs"`
	// Username is the ACL user; empty (the default) authenticates with the password alone.
	Username string `koanf:"username" json:"username,omitempty"`
	// Password authenticates; empty by default. Also TORON_SERVER__REDIS__PASSWORD, which keeps
	// it out of the file. Never printed.
	Password string `koanf:"password" json:"-"`
	// DB is the database of a standalone server; default 0 (a cluster has only 0).
	DB int `koanf:"db" json:"db"`
	// TLS speaks TLS to Redis, verified against the system's roots; default false.
	TLS bool `koanf:"tls" json:"tls"`
	// Timeout bounds one rate-limit decision; past it the route's on_error decides.
	// Default 10ms (DefaultRedisTimeout).
	Timeout time.Duration `koanf:"timeout" json:"timeout"`
}

// MarshalJSON encodes the timeout as a Go duration string.
func (r Redis) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(r)) }

// Values of rate_limit.scope and rate_limit.on_error, and the bounds of server.redis.
const (
	// RateScopeLocal (the default) gives each instance its own buckets.
	RateScopeLocal = "local"
	// RateScopeGlobal shares each key's bucket across instances in server.redis.
	RateScopeGlobal = "global"
	// RateOnErrorLocal (the default): when Redis gives no decision in time, the route's
	// per-instance bucket decides, as with scope: local.
	RateOnErrorLocal = "local"
	// RateOnErrorAllow admits the request when Redis gives no decision in time.
	RateOnErrorAllow = "allow"
	// RateOnErrorDeny refuses it (429, Retry-After: 1).
	RateOnErrorDeny = "deny"
	// DefaultRedisTimeout is server.redis.timeout: a few same-zone round trips, small beside an
	// upstream's latency, so a slow Redis adds little to a request.
	DefaultRedisTimeout = 10 * time.Millisecond
	// maxRedisTimeout bounds server.redis.timeout: every request of a global route may wait
	// this long for a Redis that hangs (until 5 failures open the breaker).
	maxRedisTimeout = time.Second
	// maxRedisDB is the highest database number a Redis server can be configured with.
	maxRedisDB = 1<<31 - 1
)

// IsGlobal reports scope: global.
func (r *RateLimit) IsGlobal() bool { return r.Scope == RateScopeGlobal }

// checkRedis validates server.redis and fills its default timeout.
func (l *loader) checkRedis(cfg *Config) {
	r := cfg.Server.Redis
	if r == nil {
		return
	}
	if len(r.Addrs) == 0 {
		l.configErr("server.redis", "addrs: is required: the host:port of a Redis (one: a standalone server or a cluster found from it; several: Redis Cluster seeds)")
	}
	for i, a := range r.Addrs {
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 || strings.TrimSpace(a) != a {
			l.configErr("server.redis", "addrs: item %d (%q) must be host:port, as in redis:6379 or 10.0.0.5:6379", i, a)
		}
	}
	if r.DB < 0 || r.DB > maxRedisDB {
		l.configErr("server.redis", "db: must be a database number, 0 or more, not %d", r.DB)
	}
	if r.DB != 0 && len(r.Addrs) > 1 {
		l.configErr("server.redis", "db: a Redis Cluster (several addrs) has only database 0, not %d", r.DB)
	}
	switch {
	case r.Timeout < 0:
		l.configErr("server.redis", "timeout: must not be negative, not %s", r.Timeout)
	case r.Timeout == 0:
		r.Timeout = DefaultRedisTimeout
	case r.Timeout > maxRedisTimeout:
		l.configErr("server.redis", "timeout: must be at most %s, not %s: every request of a global route may wait this long for a Redis that hangs", maxRedisTimeout, r.Timeout)
	}
}

// checkRateScope validates rate_limit.scope and rate_limit.on_error into eff, with redis the
// server.redis in force (nil: none).
func checkRateScope(rl *RateLimit, eff *RateLimit, hasRedis bool, bad func(key, format string, args ...any)) bool {
	const key = "rate_limit"
	ok := true
	switch rl.Scope {
	case "":
		eff.Scope = RateScopeLocal
	case RateScopeLocal:
	case RateScopeGlobal:
		if !hasRedis {
			bad(key, "scope: global needs server.redis (the addrs of the Redis the replicas share) in the config file; write scope: local for a per-instance limit")
			ok = false
		}
	default:
		bad(key, "scope: must be %s or %s, not %q", RateScopeLocal, RateScopeGlobal, rl.Scope)
		ok = false
	}
	switch rl.OnError {
	case "":
		eff.OnError = RateOnErrorLocal
	case RateOnErrorLocal, RateOnErrorAllow, RateOnErrorDeny:
		if rl.Scope != RateScopeGlobal {
			bad(key, "on_error: only applies to scope: global (what to do when Redis gives no decision in time); remove it or add scope: global")
			ok = false
		}
	default:
		bad(key, "on_error: must be %s, %s or %s, not %q", RateOnErrorLocal, RateOnErrorAllow, RateOnErrorDeny, rl.OnError)
		ok = false
	}
	return ok
}
