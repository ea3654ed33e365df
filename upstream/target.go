package upstream

import (
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Metric names, literally as SPEC 13 lists them.
const (
	metricRequests  = "toron_upstream_requests_total"
	metricInflight  = "toron_upstream_inflight"
	metricHealthy   = "toron_upstream_healthy"
	metricEjections = "toron_upstream_ejections_total"
	metricRetries   = "toron_upstream_retries_total"
	// metricTargets and metricDiscoveryErrors are per route (SPEC 13 DNS discovery).
	metricTargets         = "toron_upstream_targets"
	metricDiscoveryErrors = "toron_upstream_discovery_errors_total"
)

// quoteLabel quotes a Prometheus label value.
func quoteLabel(v string) string { return strconv.Quote(v) }

// Target is one upstream of a route, as one Set sees it: its weight and balancer state, and a
// pointer to the state that outlives reloads while the target stays in the route.
type Target struct {
	st     *state
	set    *Set
	weight int
	// seed is the target's rendezvous hash key, from its host:port.
	seed uint64
	// current is the smooth round-robin weight, guarded by set.rrMu.
	current int
}

// Addr returns the target's host:port.
func (t *Target) Addr() string { return t.st.addr }

// ServerName returns the name to verify the target's TLS certificate against, and to send as
// SNI, when the route sets no tls_server_name: the host of the entry a discovered address came
// from (SPEC 13), else the host of Addr.
func (t *Target) ServerName() string {
	if t.st.serverName != "" {
		return t.st.serverName
	}
	host, _, _ := net.SplitHostPort(t.st.addr)
	return host
}

// Weight returns the target's weight (1..100).
func (t *Target) Weight() int { return t.weight }

// InFlight returns the requests in flight to the target, over every Set that shares it.
func (t *Target) InFlight() int64 { return t.st.inflight.Load() }

// Eligible reports whether the target is neither ejected nor down.
func (t *Target) Eligible() bool { return t.st.eligible(t.set.now()) }

// Ejected reports whether passive health has the target ejected.
func (t *Target) Ejected() bool { return t.set.now() < t.st.ejectedUntil.Load() }

// Down reports whether active checks have the target down.
func (t *Target) Down() bool { return t.st.down.Load() }

// Attach keeps v with the target's state, typically its connection pool: a reload that keeps
// the target keeps v, and v is closed (when it is an io.Closer) once the target leaves the
// route (a reload without it, or Set.Close), possibly while requests are still in flight on
// it. Attach is not for the hot path (it allocates); Attached is one atomic load.
func (t *Target) Attach(v any) { t.st.attached.Store(&v) }

// Attached returns the value given to Attach, nil if none.
func (t *Target) Attached() any {
	if p := t.st.attached.Load(); p != nil {
		return *p
	}
	return nil
}

// Done ends one attempt that Pick returned this target for: the in-flight count goes back
// down, toron_upstream_requests_total{route,target,code} counts code (the upstream's status,
// or what Toron answered for this attempt when no head arrived: 502 for a failed dial or a
// reset, 504 for the header timeout, 499 for a client that left), and the outcome feeds
// passive health. Call it exactly once per Pick.
func (t *Target) Done(o Outcome, code int) {
	st := t.st
	st.inflight.Add(-1)
	st.codeCounter(code).Inc()
	switch o {
	case Success:
		// Two atomic loads on the healthy path; stores only when there is something to reset.
		if st.failures.Load() != 0 {
			st.failures.Store(0)
		}
		if st.inRow.Load() != 0 {
			st.inRow.Store(0)
		}
	case Failure:
		t.set.failure(t)
	}
}

// failure counts a failure of t, and ejects it once it has ConsecutiveFailures in a row (SPEC
// 13): for EjectTime doubled per ejection in a row, up to MaxEjectTime, unless maxEjected
// targets are ejected already. The count is not reset by an ejection, so the first failure
// after an ejection ended ejects the target again, for twice as long; a success resets both.
func (s *Set) failure(t *Target) {
	st := t.st
	p := &s.passive
	if p.ConsecutiveFailures <= 0 {
		return
	}
	n := st.failures.Add(1)
	if int(n) < p.ConsecutiveFailures {
		return
	}
	if int(n) > p.ConsecutiveFailures {
		// Saturate: a target failing while ejection is refused (max_ejected_percent) must not
		// count towards an overflow.
		st.failures.Store(int32(p.ConsecutiveFailures))
	}
	s.ejectMu.Lock()
	now := s.now()
	if now < st.ejectedUntil.Load() {
		s.ejectMu.Unlock()
		return // already ejected: a failure of a request that was in flight, or of panic mode
	}
	v := s.cur.Load()
	ejected := 0
	for _, o := range v.targets {
		if now < o.st.ejectedUntil.Load() {
			ejected++
		}
	}
	if ejected >= v.maxEjected {
		s.ejectMu.Unlock()
		return // the next failure tries again
	}
	d := p.ejectionFor(int(st.inRow.Load()))
	st.ejectedUntil.Store(now + int64(d))
	st.inRow.Add(1)
	s.ejectMu.Unlock()
	st.ejections.Inc()
	s.event(Event{Kind: EventEjected, Target: st.addr, For: d})
}

// candidate reports whether t may be picked: not excluded, and eligible unless all is set.
func (t *Target) candidate(now int64, exclude []*Target, all bool) bool {
	for _, x := range exclude {
		if x != nil && x.st == t.st {
			return false
		}
	}
	return all || t.st.eligible(now)
}

// state is what a target keeps across reloads while it stays in its route.
type state struct {
	addr, route string
	// serverName is the discovered entry's host, "" for a configured host:port.
	serverName string
	ewma       peakEWMA
	inflight   atomic.Int64
	// failures counts failures in a row; inRow the ejections in a row (the doubling).
	failures atomic.Int32
	inRow    atomic.Int32
	// ejectedUntil is the end of the current ejection in Set.now time, neverEjected if none.
	ejectedUntil atomic.Int64
	// down is the active checks' verdict.
	down atomic.Bool
	// owner is the Set currently serving the target: its clock and its event hook.
	owner    atomic.Pointer[Set]
	attached atomic.Pointer[any]

	metrics   *metrics.Set
	label     string // {route="...",target="..."
	codes     [600]atomic.Pointer[metrics.Counter]
	ejections *metrics.Counter

	mu      sync.Mutex // guards names, retired and checker
	names   []string   // registered metric names, for retire
	retired bool       // the target left its route: no metric may be registered any more
	checker *checker
}

// discardCounter counts the codes of a target that left its route: a request in flight on it
// when it left must not register its metrics again.
var discardCounter metrics.Counter

// newState registers a new target's metrics.
func newState(addr, route string, set *metrics.Set) *state {
	st := &state{addr: addr, route: route, metrics: set}
	st.ejectedUntil.Store(neverEjected)
	st.label = `{route=` + quoteLabel(route) + `,target=` + quoteLabel(addr)
	name := metricEjections + st.label + `}`
	st.ejections = set.GetOrCreateCounter(name)
	st.names = append(st.names, name)
	name = metricInflight + st.label + `}`
	set.GetOrCreateGauge(name, func() float64 { return float64(st.inflight.Load()) })
	st.names = append(st.names, name)
	name = metricHealthy + st.label + `}`
	set.GetOrCreateGauge(name, func() float64 {
		if o := st.owner.Load(); o != nil && st.eligible(o.now()) {
			return 1
		}
		return 0
	})
	st.names = append(st.names, name)
	// The codes of ordinary traffic exist from the start, so a scrape shows them at 0 and the
	// hot path finds them with one atomic load.
	for _, c := range [...]int{200, 502, 503, 504} {
		st.codeCounter(c)
	}
	return st
}

// eligible reports whether the target is neither ejected nor down at now.
func (st *state) eligible(now int64) bool {
	return now >= st.ejectedUntil.Load() && !st.down.Load()
}

// codeCounter returns toron_upstream_requests_total{route,target,code}, created on the first
// use of a code: the label set is open-ended, the lookup after that is one atomic load.
func (st *state) codeCounter(code int) *metrics.Counter {
	if code < 100 || code >= len(st.codes) {
		code = 599
	}
	if c := st.codes[code].Load(); c != nil {
		return c
	}
	name := metricRequests + st.label + `,code="` + strconv.Itoa(code) + `"}`
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.retired {
		return &discardCounter
	}
	if c := st.codes[code].Load(); c != nil {
		return c
	}
	c := st.metrics.GetOrCreateCounter(name)
	st.codes[code].Store(c)
	st.names = append(st.names, name)
	return c
}

// retire ends a target that left its route: checker stopped, metrics unregistered, attached
// value closed. Requests still in flight may call Done: their counters are then unregistered
// ones, which is harmless.
func (st *state) retire() {
	st.stopChecker()
	st.mu.Lock()
	names := st.names
	st.names = nil
	st.retired = true
	st.mu.Unlock()
	for _, n := range names {
		st.metrics.UnregisterMetric(n)
	}
	if p := st.attached.Swap(nil); p != nil {
		if c, ok := (*p).(io.Closer); ok {
			_ = c.Close()
		}
	}
}

// hashString is FNV-1a of s.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is the SplitMix64 finalizer: it spreads every input bit over the output, so hashes of
// similar inputs (10.0.0.1, 10.0.0.2) are unrelated.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// ejectionFor is the length of an ejection after inRow ejections in a row: EjectTime doubled
// inRow times, capped at MaxEjectTime.
func (p PassiveConfig) ejectionFor(inRow int) time.Duration {
	d := p.EjectTime
	for i := 0; i < inRow && d < p.MaxEjectTime; i++ {
		if d > p.MaxEjectTime/2 {
			d = p.MaxEjectTime // doubling would pass the cap, or overflow near the int64 limit
			break
		}
		d *= 2
	}
	return min(d, max(p.MaxEjectTime, p.EjectTime))
}
