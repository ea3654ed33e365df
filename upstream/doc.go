// Package upstream is the other side of the request path (STYLE 1): a route's targets, the
// balancer that picks one per request, passive and active health, dial-time DNS, and the
// exchange itself: each target's connection pool (pool.go), the upstream connection with its
// deadlines (conn.go), upstream TLS (tls.go), the request head out and the response head in
// with the retry rule (exchange.go), the hop-by-hop rules of a message head (connnames.go), and
// the client watch that aborts an upstream connection whose client left (watch.go). It knows
// nothing of conf or gateway: the gateway turns a validated conf.Route into a Config and
// PoolParams, and keeps one *Set per route name. The socket calls it shares with the client
// side are in package socket.
//
// The API the gateway calls: Set.Forward (pick a target, get a slot and a connection, write the
// request, read the response head, give the target its latency sample, retry what sent
// nothing; ErrNoTarget when the route has no target), then Pool.Put (give the connection back,
// reusable or not), Pool.Release (the slot) and Target.Done (the outcome).
//
// # Wiring a request (SPEC 3 step 9, SPEC 13)
//
// Set.Forward implements this loop; for a caller that drives the targets itself:
// one request, with retries on another target for failures that sent nothing. clientIP is the
// client's address bytes (the client IP of SPEC 16: the peer, or what trusted proxies vouch for), read by
// client_ip_hash only:
//
//	var tried [upstream.MaxRetries + 1]*upstream.Target // on the stack: Pick does not allocate
//	n := 0
//	for {
//		t := set.Pick(clientIP, tried[:n]...) // in-flight +1 on t; nil: no other target left
//		if t == nil {
//			if n == 0 {
//				// no target at all (DNS discovery found none): ErrNoTarget, the 503 no_target
//			}
//			break // answer with the last attempt's error (502)
//		}
//		tried[n] = t
//		n++
//		resp, err := exchange(t.Addr(), ...) // through t's connection pool (t.Attached())
//		// The peak-EWMA sample (ewma.go), before Done: d from the last request byte written
//		// to the response head (or to the failure; 0 if nothing was written).
//		t.Observe(d, outcome)
//		switch {
//		case a refused or timed-out dial: // nothing was written: another target may take it
//			t.Done(upstream.Failure, 502)
//			if n <= set.Retries() {
//				set.CountRetry()
//				continue
//			}
//		case reset or closed before the response headers: // bytes may have left: never retried
//			t.Done(upstream.Failure, 502)
//		case the response header timeout:
//			t.Done(upstream.Failure, 504)
//		case the client left, or its request failed on its side (413, 400, body timeout):
//			t.Done(upstream.Neutral, 499) // nobody's failure; 499 or the status Toron answered
//		default: // a response head arrived; Done once its body is copied (or aborted)
//			t.Done(upstream.OutcomeOf(resp.StatusCode()), resp.StatusCode())
//		}
//		break
//	}
//
// A reused keep-alive connection found closed before the first byte was written is not an
// attempt of its own: the exchange retries it once on a new connection to the same target,
// under the same Pick, without a Done in between and without CountRetry (SPEC 13: it does not
// count against retries); only the outcome of that second connection is reported.
//
// Done must be called exactly once for every Target that Pick returned, on every path (it takes
// the in-flight count back down): in the handler's defer, or in the response stream's Close when
// the body is copied after the handler returns, with the outcome its response head decided (an
// upstream that aborts mid-body after a 200 head is a Success: SPEC 13 judges the head).
// In-flight thus counts an attempt from Pick until its response body is done, which is what
// least_request compares and p2c multiplies its latency estimate by. A WebSocket tunnel picks
// and calls Done but never Observe: its handshake says nothing of request latency.
//
// Per-target state the request path owns (the target's connection pool, bounded by
// max_upstream_conns per target) is kept with Target.Attach: it survives a reload that keeps
// the target and is closed (io.Closer) when the target leaves, possibly while requests are
// still in flight on it (its Close must let them finish). Config.OnTarget attaches the pool of
// each target the Set adds before it can be picked: at NewSet, and when DNS discovery finds an
// address (discover.go: one goroutine per discovered entry, owned by the Set, stopped by Close
// or by the NewSet that takes the Set over). After every NewSet the gateway also replaces the
// pool of a target whose settings changed. Targets are dialed through a
// shared *Resolver (Dial, or DialTimeout in fasthttp's shape), which resolves DNS names at
// dial time.
//
// Health changes (ejection, active down/up, a panic episode's start and end) are reported to
// Config.OnEvent for the log, once per change.
//
// # Reload
//
// On a reload the gateway builds the route's new Set from the old one of the same route name:
//
//	next, err := upstream.NewSet(cfg, prev) // prev: the serving Set of that route name, or nil
//
// Targets that stay (same host:port, a discovered address included) keep their state: in-flight
// count, peak-EWMA estimate, passive counters and ejection, active-check state and running
// checker, metrics and the attached value (the target's connection pool). A discovered entry
// that stays takes its addresses over and is looked up again at once. Targets that go have their checker stopped, their metrics
// unregistered and their attached value closed (io.Closer). After the call prev belongs to next:
// requests in flight on prev still call Done on their targets, but prev.Close is a no-op. A route
// that disappears from the table is ended with Close. NewSet only fails on a Config that conf
// would have refused, and then leaves prev untouched.
package upstream
