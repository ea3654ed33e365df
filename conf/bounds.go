package conf

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// durationBound is the range a duration key accepts once it is positive (zero and negative
// values are judged by checkServer and checkRoute). A value outside it validates nowhere else
// and then breaks at run time: upstream_idle_timeout: 1ns made the gateway spin on its idle
// connections (34-101% of a core with one request waiting upstream, issue 14), a read_timeout
// of a microsecond cuts every client, a week-long one is a typo that lets a client hold a
// worker for a week.
type durationBound struct {
	min, max time.Duration
	why      string // why the floor: shown with a value below it
}

// Duration bounds (README, configuration tables). The same bound applies to a route's override
// of the key.
const (
	// MinClientTimeout is the floor of read_timeout, write_timeout and idle_timeout: below it a
	// client across any real network is cut before its bytes can arrive.
	MinClientTimeout = 100 * time.Millisecond
	// MinResponseHeaderTimeout is the floor of response_header_timeout: an upstream cannot
	// answer in less, even on loopback under load.
	MinResponseHeaderTimeout = 100 * time.Millisecond
	// MinConnectTimeout is the floor of connect_timeout: a dial across a data centre takes a
	// millisecond or more.
	MinConnectTimeout = 10 * time.Millisecond
	// MinUpstreamIdleTimeout is the floor of upstream_idle_timeout: below it no connection is
	// reused in practice, and the pool's idle cleanup spins.
	MinUpstreamIdleTimeout = time.Second
	// MaxTimeout is the ceiling of read_timeout, write_timeout, idle_timeout,
	// response_header_timeout, upstream_idle_timeout and shutdown_timeout: an hour is far
	// beyond any legitimate wait of one HTTP exchange; more is a typo (7d for 7s).
	MaxTimeout = time.Hour
	// MaxConnectTimeout is the ceiling of connect_timeout: the kernel gives up a dial after
	// about two minutes anyway, and a request waits this long for a free upstream connection.
	MaxConnectTimeout = time.Minute
	// MaxWorkerQueueTimeout is the ceiling of worker_queue_timeout: a request that waited this
	// long for a worker is better answered 503 (the client retries elsewhere).
	MaxWorkerQueueTimeout = 30 * time.Second
	// MaxDrainDelay is the ceiling of drain_delay: load balancers notice a draining /health
	// within seconds.
	MaxDrainDelay = 10 * time.Minute
	// MinHealthCheckInterval is the floor of health_check.interval: health_check.interval: 1ns
	// validated and made every target's checker a dial loop; ten checks a second per target
	// notice a failure as fast as any balancer does, and more is load, not news.
	MinHealthCheckInterval = 100 * time.Millisecond
	// MaxHealthCheckInterval is the ceiling of health_check.interval: a target checked less
	// often than hourly is not checked.
	MaxHealthCheckInterval = time.Hour
	// MaxHealthCheckTimeout is the ceiling of health_check.timeout (its floor is
	// MinConnectTimeout: the check dials): a target that takes a minute to answer its health
	// path is not healthy.
	MaxHealthCheckTimeout = time.Minute
	// MaxEjectTime is the ceiling of passive_health.eject_time and max_eject_time: a doubling
	// up to a max_eject_time near the int64 limit overflowed into a negative ejection (the
	// target was never ejected again); a day is beyond any outage a retry an hour later would
	// not notice.
	MaxEjectTime = 24 * time.Hour
	// MinTunnelIdleTimeout is the floor of tunnel_idle_timeout: WebSocket pings come every few
	// seconds at most; a tunnel cut faster than a second is cut between two messages.
	MinTunnelIdleTimeout = time.Second
	// MaxTunnelIdleTimeout is the ceiling of tunnel_idle_timeout: a silent tunnel held for more
	// than a day is a dead peer holding a max_tunnels slot and a connection.
	MaxTunnelIdleTimeout = 24 * time.Hour
	// MaxHandshakeTimeout is the ceiling of an explicit tls.handshake_timeout and
	// proxy_protocol.timeout (their floor is MinClientTimeout; left out, they are read_timeout,
	// as SPEC 14 and 16 say): a client that has not
	// finished its handshake, or a balancer its PROXY header, within a minute holds a connection
	// for nothing (slowloris below HTTP).
	MaxHandshakeTimeout = time.Minute
)

var durationBounds = map[string]durationBound{
	"worker_queue_timeout":    {0, MaxWorkerQueueTimeout, ""},
	"read_timeout":            {MinClientTimeout, MaxTimeout, "every client would be cut before its request arrives"},
	"write_timeout":           {MinClientTimeout, MaxTimeout, "every client would be cut before it can read the answer"},
	"idle_timeout":            {MinClientTimeout, MaxTimeout, "keep-alive connections would close before a client can reuse them"},
	"response_header_timeout": {MinResponseHeaderTimeout, MaxTimeout, "no upstream can answer that fast"},
	"connect_timeout":         {MinConnectTimeout, MaxConnectTimeout, "dials would fail before they can complete"},
	"upstream_idle_timeout":   {MinUpstreamIdleTimeout, MaxTimeout, "no upstream connection would be reused and the idle cleanup would spin"},
	"shutdown_timeout":        {0, MaxTimeout, ""},
	"drain_delay":             {0, MaxDrainDelay, ""},
	"health_check.interval":   {MinHealthCheckInterval, MaxHealthCheckInterval, "every target would be checked in a loop"},
	"health_check.timeout":    {MinConnectTimeout, MaxHealthCheckTimeout, "the check's dial would fail before it can complete"},
	// The floors of eject_time and max_eject_time are just > 0 (and max_eject_time >=
	// eject_time, checkPool).
	"passive_health.eject_time":     {0, MaxEjectTime, ""},
	"passive_health.max_eject_time": {0, MaxEjectTime, ""},
	"tunnel_idle_timeout":           {MinTunnelIdleTimeout, MaxTunnelIdleTimeout, "a tunnel would be cut between two messages"},
	"tls.handshake_timeout":         {MinClientTimeout, MaxHandshakeTimeout, "a client across any real network could not finish its handshake"},
	"proxy_protocol.timeout":        {MinClientTimeout, MaxHandshakeTimeout, "a balancer's PROXY header could not arrive"},
}

// checkDurationBound returns what is wrong with a positive duration d of key, or "".
func checkDurationBound(key string, d time.Duration) string {
	b, ok := durationBounds[key]
	switch {
	case !ok || d <= 0:
		return ""
	case b.min > 0 && d < b.min:
		return fmt.Sprintf("must be at least %s, not %s: %s", formatDuration(b.min), formatDuration(d), b.why)
	case d > b.max:
		return fmt.Sprintf("must be at most %s, not %s", formatDuration(b.max), formatDuration(d))
	}
	return ""
}

// Size bounds.
const (
	// MinHeaderBytes is the floor of max_header_bytes: a request line and the headers every
	// client sends (Host, User-Agent, Accept) need about that much.
	MinHeaderBytes = 1 << 10
	// MaxHeaderBytes is the ceiling of max_header_bytes: fasthttp allocates a read buffer of
	// that size for every open connection, and max_header_bytes: 1TiB killed the process at
	// the first connection (out of memory). 1 MiB is 16 times the largest header limit of common
	// servers (Apache, nginx with large_client_header_buffers).
	MaxHeaderBytes = 1 << 20
	// MaxStreamThresholdBytes is the ceiling of stream_threshold_bytes: a body at or below the
	// threshold is buffered whole, and a threshold near the int64 limit overflowed the
	// buffering arithmetic (every chunked POST on a normalize route was a 500). Above 8 MiB is
	// still warned about (routes that buffer that much).
	MaxStreamThresholdBytes = 1 << 30
)

// elevatedBudget is floor(workers × share), computed on the decimal the share was written as
// (0.29 is 29/100, not the float64 0.28999...), so that worker_pool_size 100 and elevated_share
// 0.29 give 29, as SPEC 4 says, not 28.
func elevatedBudget(workers int, share float64) int {
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(share, 'g', -1, 64))
	if !ok {
		return int(float64(workers) * share)
	}
	r.Mul(r, new(big.Rat).SetInt64(int64(workers)))
	return int(new(big.Int).Quo(r.Num(), r.Denom()).Int64())
}

// checkPercentEncoding refuses percent-encoding in a configured path that request paths never
// keep once normalized: an encoded unreserved character (request paths are matched after
// "%2D" became "-", so prefix /api%2Dv1 could never match; write /api-v1), and a '%' not
// followed by two hex digits (such request paths are refused with 400).
func checkPercentEncoding(p string) string {
	for i := 0; i < len(p); i++ {
		if p[i] != '%' {
			continue
		}
		if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			return fmt.Sprintf("%q has a %% not followed by two hex digits: such request paths are refused", p)
		}
		v, _ := strconv.ParseUint(p[i+1:i+3], 16, 8)
		if c := byte(v); isUnreservedByte(c) {
			return fmt.Sprintf("%q must not percent-encode %q (%s): request paths are matched after it is decoded; write %q", p, string(c), p[i:i+3], strings.ReplaceAll(p, p[i:i+3], string(c)))
		}
	}
	return ""
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// isUnreservedByte reports an RFC 3986 unreserved character.
func isUnreservedByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}
