// Package upstream is the other side of the request path (STYLE 1): a route's targets, the
// balancer that picks one per request, passive and active health, and dial-time DNS. It knows
// nothing of conf or gateway: the gateway turns a validated conf.Route into a Config, and keeps
// one *Set per route name.
//
// # Wiring a request (SPEC 3 step 9, SPEC 13)
//
// One request, with retries on another target for failures that sent nothing:
//
//	var tried [MaxRetries + 1]*upstream.Target // on the stack: Pick does not allocate
//	n := 0
//	for {
//		t := set.Pick(clientIP, tried[:n]...) // in-flight +1 on t; nil: no other target left
//		if t == nil {
//			break // answer with the last attempt's error (502)
//		}
//		tried[n] = t
//		n++
//		resp, err := exchange(t.Addr(), ...) // the connection pool of t (t.Attached())
//		switch {
//		case dial refused or timed out, or nothing written on a reused connection found closed:
//			t.Done(upstream.Failure, 502)
//			if n <= set.Retries() { set.CountRetry(); continue }
//		case reset or closed before the response headers:
//			t.Done(upstream.Failure, 502) // never retried: bytes of the request may have left
//		case response header timeout:
//			t.Done(upstream.Failure, 504)
//		case the client left (499), or the request failed on the client's side (413, 400):
//			t.Done(upstream.Neutral, 499) // nobody's failure
//		default: // a response head arrived
//			t.Done(upstream.OutcomeOf(resp.StatusCode()), resp.StatusCode())
//		}
//		break
//	}
//
// Done must be called exactly once for every Target that Pick returned, on every path (it takes
// the in-flight count back down): in the handler's defer, or in the response stream's Close when
// the body is copied after the handler returns, with the outcome its response head decided (an
// upstream that aborts mid-body after a 200 head is a Success: SPEC 13 judges the head). A
// reused keep-alive connection found closed before the first byte was written is retried once on
// a new connection to the same target without a Done in between and without CountRetry (SPEC 13:
// it does not count against retries).
//
// # Reload
//
// On a reload the gateway builds the route's new Set from the old one of the same route name:
//
//	next, err := upstream.NewSet(cfg, prev) // prev: the serving Set of that route name, or nil
//
// Targets that stay (same host:port) keep their state: in-flight count, passive counters and
// ejection, active-check state and running checker, metrics and the attached value (the
// target's connection pool). Targets that go have their checker stopped, their metrics
// unregistered and their attached value closed (io.Closer). After the call prev belongs to next:
// requests in flight on prev still call Done on their targets, but prev.Close is a no-op. A route
// that disappears from the table is ended with Close. NewSet only fails on a Config that conf
// would have refused, and then leaves prev untouched.
package upstream
