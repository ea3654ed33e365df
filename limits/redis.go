package limits

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// The Redis behind the global rate limits (SPEC 17, scope: global): one client shared by every
// route of the process, built from server.redis.
//
// The client is rueidis, chosen by measurement (docs/rate-limits.md, "The Redis client"): it
// pipelines the commands of concurrent callers on a few connections by itself, so 64 requests
// deciding at once cost Redis a handful of round trips and Toron a handful of syscalls, where
// go-redis/v9 takes a pooled connection per command and pays a round trip and two syscalls per
// decision. A caller waits for its reply in its own goroutine (the connection's, in fasthttp),
// bounded by the decision timeout, and never for a dial (redisdial.go: connections are made in
// the background and handed over ready); no goroutine is started per request.
//
// Health is a small breaker: after redisBreakerFailures failed calls in a row Redis is skipped
// for redisBreakerPause, then one call is let through; its success closes the breaker, its
// failure opens it for another pause. So a Redis that is down or hangs costs each request at
// most one timeout until the breaker opens, then nothing. A call that found no connection ready
// (ErrRedisReconnecting, ErrRedisNotConnected) was not sent and cost nothing: it is a failed
// decision (counted, on_error decides, toron_redis_up 0) but not one of the breaker's failures.

// DefaultRedisTimeout bounds one decision by Redis (server.redis.timeout): a few loopback or
// same-zone round trips, small beside an upstream's latency, so a slow Redis adds little.
const DefaultRedisTimeout = 10 * time.Millisecond

// Breaker constants of SPEC 17: after 5 failed calls in a row, skip Redis for 1 s, then try one.
const (
	redisBreakerFailures = 5
	redisBreakerPause    = time.Second
)

// redisConnectRetry is how often a client that could not reach any address at start retries in
// the background (a Toron that starts before its Redis must not need a restart).
const redisConnectRetry = time.Second

// redisReplyTimeout is how long a connection waits for the reply of a command that has no
// deadline of its own (the client's keep-alive PING) before it is closed and dialed anew.
const redisReplyTimeout = 2 * time.Second

// redisMaxFlushDelay is how long the connection's writer waits after a flush, only while
// several callers are waiting, to send more decisions in one write: measured under 64
// concurrent callers (BenchmarkGlobalLimiter), 20µs cut Toron's CPU per decision from about
// 7.0µs to 5.4µs; 100µs saved no more and batched worse. A lone caller is never delayed.
const redisMaxFlushDelay = 20 * time.Microsecond

// redisConnBuffer is the read and write buffer of one connection; decisions are a few dozen
// bytes each, so rueidis's 512 KiB default would only cost memory.
const redisConnBuffer = 64 << 10

// ErrRedisSkipped is the error of a call not sent because the breaker is open.
var ErrRedisSkipped = errors.New("limits: redis skipped after repeated failures")

// ErrRedisNotConnected is the error of a call made before any address of server.redis answered.
var ErrRedisNotConnected = errors.New("limits: redis not connected yet")

// RedisOptions configures the client of server.redis.
type RedisOptions struct {
	// Addrs are host:port addresses: one is a standalone server or a cluster found from it,
	// several are Redis Cluster seeds. At least one.
	Addrs []string
	// Username and Password authenticate (AUTH, or HELLO with ACL users); empty: none.
	Username string
	Password string
	// DB is the database number of a standalone server (SELECT); 0 by default. A cluster has
	// only database 0.
	DB int
	// TLS, when not nil, is the client TLS configuration; nil speaks plain TCP.
	TLS *tls.Config
	// Timeout bounds one decision; zero means DefaultRedisTimeout.
	Timeout time.Duration
}

// Redis is the client of server.redis, shared by the global rate limits of every route. It is
// safe for concurrent use; Close releases it.
type Redis struct {
	opts    RedisOptions
	timeout time.Duration
	client  atomic.Pointer[redisConn]

	deadline atomic.Pointer[sharedDeadline] // the context of the calls starting now

	fails       atomic.Int64 // failed calls in a row
	pausedUntil atomic.Int64 // unix nanoseconds; while now is before it Redis is skipped
	probing     atomic.Bool  // one call is testing Redis after a pause
	up          atomic.Bool

	dialer   *redisDialer
	stop     chan struct{}
	done     chan struct{}
	closeOne sync.Once
}

// redisConn holds the rueidis client (an interface) behind an atomic pointer.
type redisConn struct{ c rueidis.Client }

// NewRedis returns a client of o. It never waits for Redis: the connection is made in the
// background, retried every second until an address answers, so Toron starts (and -check
// passes) while Redis is down; calls made meanwhile fail and follow on_error.
func NewRedis(o RedisOptions) (*Redis, error) {
	if len(o.Addrs) == 0 {
		return nil, errors.New("limits: redis needs at least one address")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultRedisTimeout
	}
	r := &Redis{opts: o, timeout: o.Timeout, stop: make(chan struct{}), done: make(chan struct{})}
	r.dialer = newRedisDialer(o.TLS, r.Connected)
	go r.connect()
	return r, nil
}

// clientOption is the rueidis configuration of o, dialing through d (redisdial.go).
func (o *RedisOptions) clientOption(d *redisDialer) rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress: o.Addrs,
		Username:    o.Username,
		Password:    o.Password,
		SelectDB:    o.DB,
		TLSConfig:   o.TLS,
		// Connections come ready from d, never dialed while a decision waits. Dialer.Timeout
		// bounds what rueidis still does on one, HELLO, when no caller's deadline does.
		DialCtxFn: d.dial,
		Dialer:    net.Dialer{Timeout: o.Timeout, KeepAlive: rueidis.DefaultTCPKeepAlive},
		// No client-side caching (nothing is read twice), no retries (a decision has one
		// timeout to keep, and the script is not idempotent).
		DisableCache:     true,
		DisableRetry:     true,
		ConnWriteTimeout: redisReplyTimeout,
		// One connection per node: every decision of the process is pipelined on it, the most
		// decisions per round trip (rueidis would open up to 4 on a standalone server).
		PipelineMultiplex:   -1,
		MaxFlushDelay:       redisMaxFlushDelay,
		ReadBufferEachConn:  redisConnBuffer,
		WriteBufferEachConn: redisConnBuffer,
		ClientName:          "toron",
		ClientSetInfo:       rueidis.DisableClientSetInfo,
	}
}

// connect builds the rueidis client, retrying until it succeeds or the client is closed.
func (r *Redis) connect() {
	defer close(r.done)
	opt := r.opts.clientOption(r.dialer)
	for {
		c, err := rueidis.NewClient(opt)
		if err == nil {
			warm(c)
			r.client.Store(&redisConn{c: c})
			return
		}
		select {
		case <-r.stop:
			return
		case <-time.After(redisConnectRetry):
		}
	}
}

// warm connects c to every node it knows (a cluster's masters beside the seed it was found
// from) and loads the decision script there, before any decision uses it: a connection made
// later is made in the background, and the decisions that need it meanwhile fail at once; a
// script not loaded costs the first decision a second round trip (NOSCRIPT, then EVAL).
func warm(c rueidis.Client) {
	for _, n := range c.Nodes() {
		ctx, cancel := context.WithTimeout(context.Background(), redisDialTimeout)
		_ = n.Do(ctx, n.B().ScriptLoad().Script(gcraScript).Build()).Error()
		cancel()
	}
}

// Close stops the background connector and closes every connection. Calls made after it fail.
func (r *Redis) Close() {
	r.closeOne.Do(func() {
		close(r.stop)
		<-r.done
		if c := r.client.Load(); c != nil {
			c.c.Close()
		}
		r.dialer.close()
		r.up.Store(false)
	})
}

// Up reports whether the last call succeeded (toron_redis_up).
func (r *Redis) Up() bool { return r.up.Load() }

// Connected reports whether the background connector has reached Redis once.
func (r *Redis) Connected() bool { return r.client.Load() != nil }

// Closed reports whether Close was called.
func (r *Redis) Closed() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// Timeout returns the bound of one decision.
func (r *Redis) Timeout() time.Duration { return r.timeout }

// admit reports whether a call may be sent now: always while fewer than
// redisBreakerFailures calls in a row failed; after that, one call once the pause is over.
func (r *Redis) admit(now int64) bool {
	if r.fails.Load() < redisBreakerFailures {
		return true
	}
	if now < r.pausedUntil.Load() {
		return false
	}
	return r.probing.CompareAndSwap(false, true)
}

// record records the outcome of a call admitted by admit.
func (r *Redis) record(err error, now int64) {
	if err == nil {
		if r.fails.Load() != 0 {
			r.fails.Store(0)
		}
		if !r.up.Load() {
			r.up.Store(true)
		}
		r.probing.Store(false)
		return
	}
	r.up.Store(false)
	if errors.Is(err, ErrRedisReconnecting) || errors.Is(err, ErrRedisNotConnected) {
		// Nothing was sent (no connection was ready, and none is waited for): a failed
		// decision, which on_error decides, but not a failed call, since it cost no time. A
		// probe released so costs no pause either: decisions come from Redis again as soon as
		// the background dial has a connection.
		r.probing.Store(false)
		return
	}
	if r.fails.Add(1) >= redisBreakerFailures {
		r.pausedUntil.Store(now + int64(redisBreakerPause))
		r.probing.Store(false)
	}
}

// redisDeadlineShare is the fraction of the timeout during which calls share one deadline
// context: a call gets between 7/8 of the timeout and all of it.
const redisDeadlineShare = 8

// sharedDeadline is a context whose deadline serves the calls starting before reuseUntil. One
// per call cost a timer set and stopped per decision (a tenth of the limiter's CPU, profiled
// under 64 concurrent callers); shared, the timers are a few per timeout. Its timer fires at
// the deadline and releases it; cancel is kept only so that it is not lost.
type sharedDeadline struct {
	ctx        context.Context
	cancel     context.CancelFunc
	reuseUntil time.Time
}

// callContext returns a context whose deadline is at most the timeout after now, and at least
// 7/8 of it.
func (r *Redis) callContext(now time.Time) context.Context {
	if d := r.deadline.Load(); d != nil && now.Before(d.reuseUntil) {
		return d.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(r.timeout))
	r.deadline.Store(&sharedDeadline{ctx: ctx, cancel: cancel, reuseUntil: now.Add(r.timeout / redisDeadlineShare)})
	return ctx
}

// evalScript runs s on key with args under the decision timeout, through the breaker.
func (r *Redis) evalScript(s *rueidis.Lua, key string, args []string) (rueidis.RedisResult, error) {
	t := time.Now()
	now := t.UnixNano()
	if !r.admit(now) {
		return rueidis.RedisResult{}, ErrRedisSkipped
	}
	c := r.client.Load()
	if c == nil {
		r.record(ErrRedisNotConnected, now)
		return rueidis.RedisResult{}, ErrRedisNotConnected
	}
	res := s.Exec(r.callContext(t), c.c, []string{key}, args)
	err := res.Error()
	if err != nil {
		err = fmt.Errorf("limits: redis decision: %w", err)
	}
	r.record(err, time.Now().UnixNano())
	return res, err
}
