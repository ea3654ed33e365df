package limits

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The Redis behind the global rate limits (SPEC 17, scope: global): one client shared by every
// route of the process, built from server.redis.
//
// The client is Toron's own (resppipe.go, respwire.go, redisnode.go, rediscluster.go), chosen
// by measurement over rueidis and go-redis/v9 (docs/rate-limits.md, "The Redis client"): one
// connection per Redis node, on which the commands of concurrent callers are pipelined, driven
// by the callers themselves, so that a decision made alone is one write and one read in the
// request's own goroutine (the connection's, in fasthttp), bounded by the decision timeout, and
// never waits for a dial (redisnode.go: connections are made in the background and installed
// ready); no goroutine is started per request.
//
// Health is a small breaker: after redisBreakerFailures failed calls in a row Redis is skipped
// for redisBreakerPause, then one call is let through; its success closes the breaker, its
// failure opens it for another pause. So a Redis that is down or hangs costs each request at
// most one timeout until the breaker opens, then nothing. A call that found no connection ready
// (ErrRedisReconnecting, ErrRedisNotConnected), or whose connection Redis closed under it, cost
// no time: it is a failed decision (counted, on_error decides, toron_redis_up 0) but not one of
// the breaker's failures.

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

// redisReplyTimeout is how long a connection's oldest command may wait for its reply, past its
// caller's deadline, before the connection is taken for hung, closed and dialed anew.
const redisReplyTimeout = 2 * time.Second

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
	topo    atomic.Pointer[redisTopology] // nil until an address answered

	deadline atomic.Pointer[sharedDeadline] // the context of the calls starting now

	fails       atomic.Int64 // failed calls in a row
	pausedUntil atomic.Int64 // unix nanoseconds; while now is before it Redis is skipped
	probing     atomic.Bool  // one call is testing Redis after a pause
	up          atomic.Bool

	ctx      context.Context // cancelled by Close: the background dials stop
	cancel   context.CancelFunc
	mu       sync.Mutex // guards nodes and closed
	nodes    map[string]*redisNode
	closed   bool
	wg       sync.WaitGroup // the connector, the background dials, the cluster's refreshes
	closeOne sync.Once
}

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
	r := &Redis{opts: o, timeout: o.Timeout, nodes: make(map[string]*redisNode)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(1)
	go r.connect()
	return r, nil
}

// connect finds the topology from the first address that answers (a standalone server, or a
// cluster's map of slots), retrying until one does or the client is closed.
func (r *Redis) connect() {
	defer r.wg.Done()
	for {
		for _, addr := range r.opts.Addrs {
			if t := r.discover(addr); t != nil {
				r.topo.Store(t)
				return
			}
			if r.ctx.Err() != nil {
				return
			}
		}
		t := time.NewTimer(redisConnectRetry)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Close stops the background work and closes every connection. Calls made after it fail.
func (r *Redis) Close() {
	r.closeOne.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.cancel()
		r.wg.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, n := range r.nodes {
			if c := n.conn.Swap(nil); c != nil {
				c.Close()
			}
		}
		r.up.Store(false)
	})
}

// Up reports whether the last call succeeded (toron_redis_up).
func (r *Redis) Up() bool { return r.up.Load() }

// Connected reports whether the background connector has reached Redis once.
func (r *Redis) Connected() bool { return r.topo.Load() != nil }

// Closed reports whether Close was called.
func (r *Redis) Closed() bool {
	return r.ctx.Err() != nil
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
	if errors.Is(err, ErrRedisReconnecting) || errors.Is(err, ErrRedisNotConnected) || errors.Is(err, errRedisConnLost) {
		// Nothing was sent (no connection was ready, and none is waited for), or the
		// connection was closed under the call (a Redis killed or restarted): a failed
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

// decide runs the decision script on the key keyPrefix+keySuffix with args under the decision
// timeout, through the breaker.
func (r *Redis) decide(keyPrefix string, keySuffix []byte, args []string) (verdictReply, error) {
	t := time.Now()
	now := t.UnixNano()
	if !r.admit(now) {
		return verdictReply{}, ErrRedisSkipped
	}
	topo := r.topo.Load()
	if topo == nil {
		r.record(ErrRedisNotConnected, now)
		return verdictReply{}, ErrRedisNotConnected
	}
	ctx := r.callContext(t)
	deadline, _ := ctx.Deadline()
	res := r.run(topo, ctx, deadline, now, keyPrefix, keySuffix, args)
	err := res.err
	if err != nil {
		err = fmt.Errorf("limits: redis decision: %w", err)
	}
	r.record(err, time.Now().UnixNano())
	return res, err
}
