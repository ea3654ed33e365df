package conf

import (
	"fmt"
	"strings"
)

// ElevatedBudget is the number of workers all elevated routes together may hold (SPEC 4):
// max(1, floor(worker_pool_size × elevated_share)), 32 by default, computed exactly on the
// decimal elevated_share was written as (100 × 0.29 is 29; in float64 it was 28.999...).
func (c *Config) ElevatedBudget() int {
	return max(1, elevatedBudget(c.Server.WorkerPoolSize, c.Server.ElevatedShare))
}

// GuardrailConcurrency is the bulkhead the guardrail gives an elevated route without
// max_concurrency: min(32, worker_pool_size/4), at least 1 (SPEC 2).
func (c *Config) GuardrailConcurrency() int {
	return max(1, min(GuardrailMaxConcurrency, c.Server.WorkerPoolSize/4))
}

// resolve fills every route's Effective: overrides, else the server's values, then the
// guardrail (SPEC 2).
func (c *Config) resolve() {
	s := &c.Server
	for i := range c.Routes {
		r := &c.Routes[i]
		e := Effective{
			MaxBodyBytes:          deref(r.MaxBodyBytes, s.MaxBodyBytes),
			ReadTimeout:           deref(r.ReadTimeout, s.ReadTimeout),
			WriteTimeout:          deref(r.WriteTimeout, s.WriteTimeout),
			ResponseHeaderTimeout: deref(r.ResponseHeaderTimeout, s.ResponseHeaderTimeout),
			ConnectTimeout:        deref(r.ConnectTimeout, s.ConnectTimeout),
			MinProgressBytes:      deref(r.MinProgressBytes, s.MinProgressBytes),
			InboundChunkedMode:    deref(r.InboundChunkedMode, s.InboundChunkedMode),
		}

		// Elevated: a limit looser than the perimeter's lets one request hold a worker longer
		// or move more bytes than a fast route's request could, so such routes share a budget.
		// connect_timeout is not a reason (SPEC 2 does not list it): a longer dial only delays
		// the 502 of an unreachable upstream; it lets no client hold a worker longer.
		if e.MaxBodyBytes > s.MaxBodyBytes {
			e.ElevatedReasons = append(e.ElevatedReasons, fmt.Sprintf("max_body_bytes %d > server %d", e.MaxBodyBytes, s.MaxBodyBytes))
		}
		if e.ReadTimeout > s.ReadTimeout {
			e.ElevatedReasons = append(e.ElevatedReasons, fmt.Sprintf("read_timeout %s > server %s", formatDuration(e.ReadTimeout), formatDuration(s.ReadTimeout)))
		}
		if e.WriteTimeout > s.WriteTimeout {
			e.ElevatedReasons = append(e.ElevatedReasons, fmt.Sprintf("write_timeout %s > server %s", formatDuration(e.WriteTimeout), formatDuration(s.WriteTimeout)))
		}
		if e.ResponseHeaderTimeout > s.ResponseHeaderTimeout {
			e.ElevatedReasons = append(e.ElevatedReasons, fmt.Sprintf("response_header_timeout %s > server %s", formatDuration(e.ResponseHeaderTimeout), formatDuration(s.ResponseHeaderTimeout)))
		}
		if e.MinProgressBytes < s.MinProgressBytes {
			e.ElevatedReasons = append(e.ElevatedReasons, fmt.Sprintf("min_progress_bytes %d < server %d", e.MinProgressBytes, s.MinProgressBytes))
		}
		e.Elevated = len(e.ElevatedReasons) > 0

		switch {
		case r.MaxConcurrency != nil:
			e.MaxConcurrency, e.MaxConcurrencySource = *r.MaxConcurrency, SourceExplicit
		case e.Elevated:
			e.MaxConcurrency, e.MaxConcurrencySource = c.GuardrailConcurrency(), SourceGuardrail
		default:
			e.MaxConcurrency, e.MaxConcurrencySource = 0, SourceUnlimited
		}

		switch {
		case r.MaxUpstreamConns != nil:
			e.MaxUpstreamConns = *r.MaxUpstreamConns
		case e.MaxConcurrency > 0:
			// More upstream connections than requests in flight would never be used.
			e.MaxUpstreamConns = e.MaxConcurrency
		default:
			e.MaxUpstreamConns = DefaultMaxUpstreamConns
		}

		switch {
		case r.StreamRequestBody == nil:
			e.StreamRequestBody = StreamAuto
		case *r.StreamRequestBody:
			e.StreamRequestBody = StreamAlways
		default:
			e.StreamRequestBody = StreamNever
		}
		resolveUpstream(r, &e)
		resolveTunnel(r, &e)
		resolveTraffic(r, &e)
		r.Effective = e
	}
}

// deref returns *p, or def when p is nil (the key is not set on the route).
func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// warnings returns the non-fatal findings (printed by -check, logged at start and reload):
//   - an empty route table;
//   - routes that buffer bodies larger than 8 MiB because stream_threshold_bytes is above it
//     (legal: SPEC 2 bounds only stream_request_body false, but every worker may hold one);
//   - max_header_bytes above 64 KiB, the read buffer of every open connection;
//   - the elevated routes' bulkheads adding up to more than the elevated budget (SPEC 2),
//     which is allowed (they share it) but means they cannot all be full at once.
func (c *Config) warnings() []string {
	var out []string
	if len(c.Routes) == 0 {
		out = append(out, fmt.Sprintf("no routes: every request other than %s and %s is answered 404", c.Server.HealthPath, c.Server.MetricsPath))
	}
	if t := c.Server.StreamThresholdBytes; t > MaxBufferedBodyBytes {
		var big []string
		for _, r := range c.Routes {
			// Buffered below the threshold: declared lengths in automatic mode, and the decoded
			// prefix of a chunked body in normalize mode; the route's ceiling bounds both.
			e := &r.Effective
			if e.StreamRequestBody == StreamNever || (e.StreamRequestBody != StreamAuto && e.InboundChunkedMode != ChunkedNormalize) {
				continue
			}
			if n := min(t, e.MaxBodyBytes); n > MaxBufferedBodyBytes {
				big = append(big, fmt.Sprintf("%s (%d)", r.Name, n))
			}
		}
		if len(big) > 0 {
			out = append(out, fmt.Sprintf("stream_threshold_bytes %d is above 8 MiB: routes %s buffer bodies of up to that many bytes whole in memory, one per busy worker (worker_pool_size %d)",
				t, strings.Join(big, ", "), c.Server.WorkerPoolSize))
		}
	}
	if h := c.Server.MaxHeaderBytes; h > MaxSensibleHeaderBytes {
		out = append(out, fmt.Sprintf("max_header_bytes %d is above 64 KiB: it is the read buffer of every open connection, up to %d of them (max_connections)",
			h, c.Server.MaxConnections))
	}
	out = append(out, c.tlsWarnings()...)
	out = append(out, c.tracingWarnings()...)
	var parts []string
	total := 0
	for _, r := range c.Routes {
		if r.Effective.Elevated {
			parts = append(parts, fmt.Sprintf("%s (%d)", r.Name, r.Effective.MaxConcurrency))
			total += r.Effective.MaxConcurrency
		}
	}
	if budget := c.ElevatedBudget(); total > budget {
		out = append(out, fmt.Sprintf("elevated routes %s may hold %d workers together but share an elevated budget of %d: they cannot all be full at once",
			strings.Join(parts, ", "), total, budget))
	}
	out = append(out, tunnelWarnings(c)...)
	out = append(out, proxyProtocolWarnings(c)...)
	return out
}
