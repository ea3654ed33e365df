package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Limits of a route's configuration (SPEC 13); conf enforces the same ones.
const (
	// MinWeight and MaxWeight bound a target's weight.
	MinWeight, MaxWeight = 1, 100
	// MaxRetries bounds Config.Retries: a request tries at most MaxRetries+1 targets.
	MaxRetries = 3
)

// Balance is a route's balancing algorithm (SPEC 13 balance).
type Balance uint8

// The algorithms of SPEC 13.
const (
	// P2C is latency-aware power of two choices (peak EWMA, ewma.go): it draws two different
	// eligible targets at random, weighted, and picks the one of lower cost, est·(inflight+1)
	// / weight; an exact tie goes to either at random.
	P2C Balance = iota
	// RoundRobin is smooth weighted round robin (nginx's): over any sum-of-weights consecutive
	// picks each target is picked exactly its weight times, interleaved.
	RoundRobin
	// ClientIPHash is weighted rendezvous (highest random weight) hashing of the client IP over
	// the eligible targets: a client sticks to its target, and a target that leaves or comes
	// back moves only its own clients.
	ClientIPHash
	// LeastRequest draws two different eligible targets at random, weighted, and picks the one
	// with fewer requests in flight; a tie goes to either at random. For routes whose requests
	// are long uploads or downloads, where time measures size, not health.
	LeastRequest
)

// balanceNames are the config spellings, indexed by Balance.
var balanceNames = [...]string{P2C: "p2c", RoundRobin: "round_robin", ClientIPHash: "client_ip_hash", LeastRequest: "least_request"}

// String returns the config spelling: "p2c", "least_request", "round_robin" or
// "client_ip_hash".
func (b Balance) String() string {
	if int(b) < len(balanceNames) {
		return balanceNames[b]
	}
	return fmt.Sprintf("Balance(%d)", b)
}

// ParseBalance maps a config spelling to its Balance.
func ParseBalance(s string) (Balance, error) {
	for i, n := range balanceNames {
		if n == s {
			return Balance(i), nil
		}
	}
	return 0, fmt.Errorf("upstream: unknown balance %q: must be p2c, least_request, round_robin or client_ip_hash", s)
}

// Outcome is what one attempt on a target tells about the target's health (SPEC 13).
type Outcome uint8

const (
	// Neutral: the attempt says nothing about the target, e.g. the client left, or the request
	// failed on the client's side. It only takes the in-flight count back down.
	Neutral Outcome = iota
	// Success: a response head other than 502, 503 or 504. Resets the target's failure count
	// and the doubling of its ejection time.
	Success
	// Failure: a refused or timed-out dial, a connection reset or closed before the response
	// headers, a response header timeout, or a response with status 502, 503 or 504.
	Failure
)

// String names the outcome for logs: "neutral", "success" or "failure".
func (o Outcome) String() string {
	switch o {
	case Neutral:
		return "neutral"
	case Success:
		return "success"
	case Failure:
		return "failure"
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// OutcomeOf classifies a response head by its status: 502, 503 and 504 are a Failure, any
// other status a Success.
func OutcomeOf(status int) Outcome {
	if status == 502 || status == 503 || status == 504 {
		return Failure
	}
	return Success
}

// TargetConfig is one entry of a route's targets.
type TargetConfig struct {
	// Addr is the target's host:port, as dialed and as its metrics label. A host name is
	// resolved at dial time (see Resolver).
	Addr string
	// Weight is the target's share of the traffic, MinWeight..MaxWeight; 0 means 1. A
	// discovered entry gives it to each of its addresses.
	Weight int
	// Discover makes the entry a DNS name standing for one target per address (SPEC 13 DNS
	// discovery): Addr's host is resolved through Config.Lookup at NewSet and every
	// Config.DiscoveryRefresh, and each address ip:port is a target of its own (pool, health,
	// peak-EWMA state, metrics), whose ServerName is Addr's host.
	Discover bool
}

// PassiveConfig is passive health (SPEC 13 passive_health). The zero value turns it off.
type PassiveConfig struct {
	// ConsecutiveFailures is the number of failures in a row that eject a target; 0 turns
	// passive health off.
	ConsecutiveFailures int
	// EjectTime is the first ejection's length; each further ejection in a row doubles it.
	EjectTime time.Duration
	// MaxEjectTime caps the doubling; 0 means EjectTime.
	MaxEjectTime time.Duration
	// MaxEjectedPercent is the share of the route's targets (rounded down) that may be ejected
	// at once; never all of them, whatever the value.
	MaxEjectedPercent int
}

// CheckConfig is active health checking (SPEC 13 health_check).
type CheckConfig struct {
	// Path is the request target of the check, "GET Path HTTP/1.1". Required.
	Path string
	// Interval is the time between two checks of a target, plus up to 10% of jitter. > 0.
	Interval time.Duration
	// Timeout bounds one check, dial and (TLS) handshake included. > 0.
	Timeout time.Duration
	// HealthyThreshold is the passes in a row that bring a down target back up; 0 means 1.
	HealthyThreshold int
	// UnhealthyThreshold is the failed checks in a row that take an up target down; 0 means 1.
	UnhealthyThreshold int
	// Dial connects to a target's host:port; nil dials TCP directly (the gateway passes its
	// Resolver's Dial so that checks go where requests go).
	Dial DialFunc
	// TLS, when not nil, speaks TLS to the target over the dialed connection: the route's
	// upstream TLS settings. An empty ServerName is the target's host.
	TLS *tls.Config
}

// DialFunc connects to addr (host:port) before ctx is done.
type DialFunc func(ctx context.Context, addr string) (net.Conn, error)

// EventKind says what happened to a route's targets.
type EventKind uint8

const (
	// EventEjected: passive health ejected Event.Target for Event.For.
	EventEjected EventKind = iota + 1
	// EventDown: Event.Target failed UnhealthyThreshold active checks in a row.
	EventDown
	// EventUp: Event.Target passed HealthyThreshold active checks in a row.
	EventUp
	// EventPanic: no target of the route is eligible, so every target is (once per episode).
	EventPanic
	// EventPanicOver: a target is eligible again; the panic episode is over.
	EventPanicOver
)

// String names the kind for logs: "ejected", "down", "up", "panic", "panic_over".
func (k EventKind) String() string {
	switch k {
	case EventEjected:
		return "ejected"
	case EventDown:
		return "down"
	case EventUp:
		return "up"
	case EventPanic:
		return "panic"
	case EventPanicOver:
		return "panic_over"
	}
	return fmt.Sprintf("EventKind(%d)", k)
}

// Event is a change of a route's health, for the gateway's log. Target is "" for the
// route-wide EventPanic and EventPanicOver.
type Event struct {
	Kind   EventKind
	Route  string
	Target string
	// For is the ejection's length (EventEjected only).
	For time.Duration
}

// Config is everything a Set needs, resolved by the gateway from a validated route.
type Config struct {
	// Route is the route's name: the metrics label, and what a reload matches on.
	Route string
	// Targets are the route's targets, at least one, host:port unique.
	Targets []TargetConfig
	// Balance is the algorithm; the zero value is P2C.
	Balance Balance
	// Passive is passive health; the zero value is off.
	Passive PassiveConfig
	// Check turns active health checks on when not nil.
	Check *CheckConfig
	// Retries is how many other targets a request may try after a failure that sent nothing,
	// 0..MaxRetries; Set.Retries caps it at the number of other targets.
	Retries int
	// Metrics receives the toron_upstream_* metrics; nil keeps them in a private set.
	Metrics *metrics.Set
	// Clock is the time source of passive health (tests use a fake one); nil is time.Now.
	Clock func() time.Time
	// OnEvent, when not nil, is told about ejections, active up/down changes and panic
	// episodes. It runs on the request path or a checker goroutine: it must not block (log and
	// return).
	OnEvent func(Event)
	// LatencyDecay is peak EWMA's time constant (SPEC 13 latency_decay); 0 means
	// DefaultLatencyDecay.
	LatencyDecay time.Duration
	// DiscoveryRefresh is the time between two lookups of a discovered entry (SPEC 13
	// discovery_refresh); 0 means DefaultDiscoveryRefresh.
	DiscoveryRefresh time.Duration
	// Lookup resolves the names of Discover entries; nil is the system's resolver (see
	// NewDNSLookup for server.resolver).
	Lookup LookupFunc
	// OnTarget, when not nil, is called for every target the Set adds that has no attached
	// value yet (a new target at NewSet, an address discovery found), before Pick can return
	// it: the place to Attach its connection pool. It runs under the Set's discovery lock, on
	// NewSet's goroutine or a discovery goroutine: it must not call the Set.
	OnTarget func(*Target)
}

// Set is one route's targets and balancer. Pick, Target.Observe and Target.Done are safe for
// concurrent use and do not allocate; NewSet (reload) and Close are called by one goroutine at
// a time. The targets are an immutable view swapped whole when DNS discovery changes them, so
// a Pick reads one consistent list with one atomic load.
type Set struct {
	route   string
	balance Balance
	passive PassiveConfig
	retries int
	metrics *metrics.Set
	clock   func() time.Time
	onEvent func(Event)
	// decay is latency_decay in nanoseconds.
	decay float64

	// cur is the targets Pick chooses among.
	cur atomic.Pointer[view]

	// rrMu guards the round-robin weights (Target.current).
	rrMu sync.Mutex
	// ejectMu serializes ejection decisions, so max_ejected_percent holds under concurrent
	// failures.
	ejectMu sync.Mutex
	// panicking is true during a panic episode (no target eligible).
	panicking atomic.Bool

	// viewMu serializes changes of cur (NewSet, discovery, Close) and guards the discoverers'
	// answers; the Pick path never takes it.
	viewMu sync.Mutex
	// entries are the configured targets, static and discovered, in order.
	entries []*entry
	check   *CheckConfig
	// onTarget is Config.OnTarget.
	onTarget func(*Target)

	retriesTotal *metrics.Counter
	retriesName  string
	// discoveryErrors is toron_upstream_discovery_errors_total{route}; shared is the route's
	// gauge state, handed from Set to Set across reloads.
	discoveryErrors *metrics.Counter
	shared          *routeShared

	// closed is set by Close or when a newer Set took this one's targets over.
	closed bool
}

// view is one immutable list of a Set's targets.
type view struct {
	targets []*Target
	// maxEjected is floor(len(targets) × MaxEjectedPercent / 100), at most len(targets)-1.
	maxEjected int
}

// targets returns the current targets.
func (s *Set) targetsNow() []*Target { return s.cur.Load().targets }

// epoch anchors the int64 times of passive health; Sub keeps the monotonic clock of time.Now.
var epoch = time.Now()

// errNoTargets is a Config without targets (conf refuses it first).
var errNoTargets = errors.New("upstream: a route needs at least one target")

// ErrNoTarget is a route that has no target at the moment: its discovered names resolved to
// no address (SPEC 13: 503 "No upstream target", reason no_target). Pick returns nil with
// nothing excluded only then.
var ErrNoTarget = errors.New("upstream: no upstream target")

// NewSet builds a route's Set. When prev is the serving Set of the same route name (a reload),
// the targets that stay (same host:port) keep their state (in-flight count, passive counters
// and ejection, active-check state and checker, peak-EWMA estimate, metrics, attached value),
// the targets that go are stopped (checker ended, metrics unregistered, attached value
// closed), and prev is handed over: its discovery stops and its Close becomes a no-op. A prev
// of another route name is ignored (Close it yourself). On an error prev is untouched.
//
// A discovered entry is resolved here (the lookups of all entries at once, for at most
// startLookupTimeout) unless prev had the same entry (same host:port): then its addresses are
// taken over and looked up again at once by the entry's discovery goroutine. A name that does
// not resolve is not an error: the entry has no address until it does.
func NewSet(cfg Config, prev *Set) (*Set, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Set{
		route:    cfg.Route,
		balance:  cfg.Balance,
		passive:  cfg.Passive,
		retries:  min(cfg.Retries, MaxRetries),
		metrics:  cfg.Metrics,
		clock:    cfg.Clock,
		onEvent:  cfg.OnEvent,
		decay:    float64(cfg.LatencyDecay),
		check:    cfg.Check,
		onTarget: cfg.OnTarget,
	}
	if s.metrics == nil {
		s.metrics = metrics.NewSet()
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	if s.decay <= 0 {
		s.decay = float64(DefaultLatencyDecay)
	}
	if s.passive.MaxEjectTime < s.passive.EjectTime {
		s.passive.MaxEjectTime = s.passive.EjectTime
	}
	s.cur.Store(&view{})

	handover := prev != nil && !prev.closed && prev.route == cfg.Route
	var kept map[string]*state
	prevEntries := map[string]*entry{}
	if handover {
		// Stop prev's discovery first, so that its targets stay as they are while they are
		// taken over.
		prev.stopDiscovery()
		kept = make(map[string]*state)
		for _, t := range prev.targetsNow() {
			kept[t.st.addr] = t.st
		}
		for _, e := range prev.entries {
			if e.disc != nil {
				prevEntries[e.addr] = e
			}
		}
		s.shared = prev.shared
	} else {
		s.shared = newRouteShared(cfg.Route, s.metrics)
	}
	s.retriesName = metricRetries + `{route=` + quoteLabel(cfg.Route) + `}`
	s.retriesTotal = s.metrics.GetOrCreateCounter(s.retriesName)
	s.discoveryErrors = s.metrics.GetOrCreateCounter(s.shared.errorsName)

	refresh := cfg.DiscoveryRefresh
	if refresh <= 0 {
		refresh = DefaultDiscoveryRefresh
	}
	lookup := cfg.Lookup
	if lookup == nil {
		lookup = NewDNSLookup("")
	}
	var fresh []*entry
	for _, tc := range cfg.Targets {
		e := &entry{addr: tc.Addr, weight: max(tc.Weight, 1)}
		if tc.Discover {
			e.disc = newDiscoverer(s, tc.Addr, lookup, refresh)
			if p := prevEntries[tc.Addr]; p != nil {
				e.disc.addrs, e.disc.emptyOnce = p.disc.addrs, p.disc.emptyOnce
				e.disc.again = true
			} else {
				fresh = append(fresh, e)
			}
		}
		s.entries = append(s.entries, e)
	}
	s.initialLookups(fresh)

	s.viewMu.Lock()
	s.rebuildLocked(kept, false)
	s.viewMu.Unlock()
	s.shared.serving.Store(s)
	if handover {
		// Targets that went away: nothing picks them any more.
		for _, st := range kept {
			st.retire()
		}
		prev.closed = true
	}
	for _, t := range s.targetsNow() {
		if cfg.Check != nil {
			t.st.startOrUpdateChecker(cfg.Check)
		} else {
			t.st.stopChecker()
		}
	}
	for _, e := range s.entries {
		if e.disc != nil {
			e.disc.start()
		}
	}
	return s, nil
}

// entry is one configured target: a host:port, or a discovered name standing for the
// addresses its discoverer last applied.
type entry struct {
	addr   string
	weight int
	disc   *discoverer
}

// rebuildLocked makes the view of the entries' current addresses: a target already in the
// view stays as it is, one whose state is in kept (the previous Set's, on a reload) takes it
// over (and leaves kept), others are new. An address given by two entries is the first one's.
// Targets of the view that are no longer wanted are retired once the new view is published,
// so nothing picks them while their pools close. Called with viewMu held.
func (s *Set) rebuildLocked(kept map[string]*state, startChecks bool) {
	old := s.cur.Load().targets
	inView := make(map[string]*Target, len(old))
	for _, t := range old {
		inView[t.st.addr] = t
	}
	next := make([]*Target, 0, len(old)+1)
	wanted := make(map[string]bool, len(old)+1)
	add := func(addr, serverName string, weight int) {
		if wanted[addr] {
			return
		}
		wanted[addr] = true
		if t := inView[addr]; t != nil {
			next = append(next, t)
			return
		}
		st := kept[addr]
		if st != nil {
			delete(kept, addr)
		} else {
			st = newState(addr, s.route, s.metrics)
			st.serverName = serverName
		}
		t := &Target{st: st, set: s, weight: weight, seed: mix64(hashString(addr))}
		st.owner.Store(s)
		if s.onTarget != nil && t.Attached() == nil {
			s.onTarget(t)
		}
		if s.check != nil && startChecks {
			// A target discovery added to a serving Set (NewSet starts the others' checks).
			st.startOrUpdateChecker(s.check)
		}
		next = append(next, t)
	}
	for _, e := range s.entries {
		if e.disc == nil {
			add(e.addr, "", e.weight)
			continue
		}
		for _, a := range e.disc.addrs {
			add(netip.AddrPortFrom(a, e.disc.port).String(), e.disc.host, e.weight)
		}
	}
	n := len(next)
	pct := max(s.passive.MaxEjectedPercent, 0)
	s.cur.Store(&view{targets: next, maxEjected: max(min(n*pct/100, n-1), 0)})
	for _, t := range old {
		if !wanted[t.st.addr] {
			t.st.retire()
		}
	}
}

// routeShared is what the Sets of one route name share across reloads: the gauge of its
// target count reads the serving Set.
type routeShared struct {
	serving     atomic.Pointer[Set]
	targetsName string
	errorsName  string
}

// newRouteShared registers toron_upstream_targets{route}.
func newRouteShared(route string, ms *metrics.Set) *routeShared {
	r := &routeShared{
		targetsName: metricTargets + `{route=` + quoteLabel(route) + `}`,
		errorsName:  metricDiscoveryErrors + `{route=` + quoteLabel(route) + `}`,
	}
	ms.GetOrCreateGauge(r.targetsName, func() float64 {
		if s := r.serving.Load(); s != nil {
			return float64(len(s.targetsNow()))
		}
		return 0
	})
	return r
}

// validate refuses what conf refuses first: NewSet's callers pass validated values.
// Validate reports what NewSet would refuse in c, without building anything: a reload checks
// every route's Set before it builds any, since building one takes over the serving Set's
// targets (SPEC 18).
func (c *Config) Validate() error { return c.validate() }

func (c *Config) validate() error {
	if len(c.Targets) == 0 {
		return errNoTargets
	}
	seen := make(map[string]bool, len(c.Targets))
	for _, t := range c.Targets {
		if _, _, err := net.SplitHostPort(t.Addr); err != nil {
			return fmt.Errorf("upstream: target %q is not host:port: %w", t.Addr, err)
		}
		if seen[t.Addr] {
			return fmt.Errorf("upstream: target %s is listed twice", t.Addr)
		}
		seen[t.Addr] = true
		if t.Weight < 0 || t.Weight > MaxWeight {
			return fmt.Errorf("upstream: target %s: weight must be between %d and %d, not %d", t.Addr, MinWeight, MaxWeight, t.Weight)
		}
	}
	if c.LatencyDecay < 0 || c.DiscoveryRefresh < 0 {
		return errors.New("upstream: latency decay and discovery refresh must not be negative")
	}
	if int(c.Balance) >= len(balanceNames) {
		return fmt.Errorf("upstream: unknown balance %d", c.Balance)
	}
	if c.Retries < 0 || c.Retries > MaxRetries {
		return fmt.Errorf("upstream: retries must be between 0 and %d, not %d", MaxRetries, c.Retries)
	}
	p := c.Passive
	if p.ConsecutiveFailures < 0 || p.EjectTime < 0 || p.MaxEjectTime < 0 || p.MaxEjectedPercent < 0 || p.MaxEjectedPercent > 100 {
		return errors.New("upstream: passive health values must not be negative, max_ejected_percent at most 100")
	}
	if p.ConsecutiveFailures > 0 && p.EjectTime <= 0 {
		return errors.New("upstream: passive health needs an eject time greater than 0")
	}
	if ch := c.Check; ch != nil {
		if ch.Path == "" || ch.Path[0] != '/' {
			return fmt.Errorf("upstream: health check path %q must start with /", ch.Path)
		}
		if ch.Interval <= 0 || ch.Timeout <= 0 {
			return errors.New("upstream: health check interval and timeout must be greater than 0")
		}
		if ch.HealthyThreshold < 0 || ch.UnhealthyThreshold < 0 {
			return errors.New("upstream: health check thresholds must not be negative")
		}
	}
	return nil
}

// Close ends the Set of a route that left the route table: it stops its discovery and the
// checkers, unregisters the metrics and closes the attached values of its targets. In-flight
// requests may still call Done. Close is a no-op on a Set a newer one took over (NewSet with
// prev), and when called twice.
func (s *Set) Close() {
	if s.closed {
		return
	}
	s.closed = true
	s.stopDiscovery()
	s.viewMu.Lock()
	old := s.cur.Load().targets
	s.cur.Store(&view{})
	s.viewMu.Unlock()
	for _, t := range old {
		t.st.retire()
	}
	s.metrics.UnregisterMetric(s.retriesName)
	s.metrics.UnregisterMetric(s.shared.targetsName)
	s.metrics.UnregisterMetric(s.shared.errorsName)
}

// Route returns the route name the Set was built for.
func (s *Set) Route() string { return s.route }

// Balance returns the Set's algorithm.
func (s *Set) Balance() Balance { return s.balance }

// Targets returns the Set's current targets: the static ones in configuration order, then
// each discovered entry's addresses. The slice is the Set's own: do not modify it. With DNS
// discovery it may be empty, and a later call may return another list.
func (s *Set) Targets() []*Target { return s.targetsNow() }

// Retries is how many other targets a request may try after a failure that sent nothing:
// Config.Retries, but never more than the route's other targets.
func (s *Set) Retries() int { return max(min(s.retries, len(s.targetsNow())-1), 0) }

// CountRetry counts one retry on another target in toron_upstream_retries_total{route}. Call
// it before the Pick of each retry (not for the same-target retry of a stale connection).
func (s *Set) CountRetry() { s.retriesTotal.Inc() }

// Panicking reports whether the route is in a panic episode: no target was eligible at the
// last Pick, so every target is.
func (s *Set) Panicking() bool { return s.panicking.Load() }

// now is the passive-health time: nanoseconds since epoch on the Set's clock.
func (s *Set) now() int64 { return int64(s.clock().Sub(epoch)) }

// event reports e to the OnEvent hook, if any.
func (s *Set) event(e Event) {
	if s.onEvent != nil {
		e.Route = s.route
		s.onEvent(e)
	}
}

// Pick returns the target for one attempt and counts it in flight (Target.Done takes it back).
// clientIP is the client's address bytes (4 or 16; a v4-mapped 16-byte address counts as its 4
// bytes), used by ClientIPHash only. exclude are the targets this request already tried: Pick
// chooses among the eligible targets not in it. When no target at all is eligible (every one
// ejected or down) every target is (panic mode, EventPanic once per episode). Pick returns nil
// when every candidate is excluded: there is no other target to retry on; and, with nothing
// excluded, when the route has no target at all (ErrNoTarget: discovery found no address).
func (s *Set) Pick(clientIP []byte, exclude ...*Target) *Target {
	v := s.cur.Load()
	if len(v.targets) == 0 {
		return nil
	}
	now := s.now()
	t := s.pickAmong(v.targets, now, clientIP, exclude, false)
	if t == nil {
		if anyEligible(v.targets, now) {
			return nil // eligible targets exist, all already tried
		}
		if s.panicking.CompareAndSwap(false, true) {
			s.event(Event{Kind: EventPanic})
		}
		if t = s.pickAmong(v.targets, now, clientIP, exclude, true); t == nil {
			return nil
		}
	} else if s.panicking.Load() && s.panicking.CompareAndSwap(true, false) {
		s.event(Event{Kind: EventPanicOver})
	}
	t.st.inflight.Add(1)
	return t
}

// anyEligible reports whether some target is eligible, ignoring exclusions.
func anyEligible(ts []*Target, now int64) bool {
	for _, t := range ts {
		if t.st.eligible(now) {
			return true
		}
	}
	return false
}

// pickAmong runs the balancer over the candidates of ts: targets not excluded and, unless all
// is set (panic mode), eligible.
func (s *Set) pickAmong(ts []*Target, now int64, clientIP []byte, exclude []*Target, all bool) *Target {
	if len(ts) == 1 {
		t := ts[0]
		if t.candidate(now, exclude, all) {
			return t
		}
		return nil
	}
	switch s.balance {
	case RoundRobin:
		return s.pickRoundRobin(ts, now, exclude, all)
	case ClientIPHash:
		return s.pickHash(ts, now, clientIP, exclude, all)
	case LeastRequest:
		return s.pickTwo(ts, now, exclude, all, false)
	default:
		return s.pickTwo(ts, now, exclude, all, true)
	}
}

// neverEjected is the ejectedUntil of a target that is not ejected.
const neverEjected = math.MinInt64
