package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
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
	// P2C draws two different eligible targets at random, weighted, and picks the one with fewer
	// requests in flight; a tie goes to either at random.
	P2C Balance = iota
	// RoundRobin is smooth weighted round robin (nginx's): over any sum-of-weights consecutive
	// picks each target is picked exactly its weight times, interleaved.
	RoundRobin
	// ClientIPHash is weighted rendezvous (highest random weight) hashing of the client IP over
	// the eligible targets: a client sticks to its target, and a target that leaves or comes
	// back moves only its own clients.
	ClientIPHash
)

// balanceNames are the config spellings, indexed by Balance.
var balanceNames = [...]string{P2C: "p2c", RoundRobin: "round_robin", ClientIPHash: "client_ip_hash"}

// String returns the config spelling: "p2c", "round_robin" or "client_ip_hash".
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
	return 0, fmt.Errorf("upstream: unknown balance %q: must be p2c, round_robin or client_ip_hash", s)
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
	// Weight is the target's share of the traffic, MinWeight..MaxWeight; 0 means 1.
	Weight int
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
}

// Set is one route's targets and balancer. Pick and Target.Done are safe for concurrent use
// and do not allocate; NewSet (reload) and Close are called by one goroutine at a time.
type Set struct {
	route   string
	balance Balance
	passive PassiveConfig
	retries int
	targets []*Target
	metrics *metrics.Set
	clock   func() time.Time
	onEvent func(Event)
	// maxEjected is floor(len(targets) × MaxEjectedPercent / 100), at most len(targets)-1.
	maxEjected int

	// rrMu guards the round-robin weights (Target.current).
	rrMu sync.Mutex
	// ejectMu serializes ejection decisions, so max_ejected_percent holds under concurrent
	// failures.
	ejectMu sync.Mutex
	// panicking is true during a panic episode (no target eligible).
	panicking atomic.Bool

	retriesTotal *metrics.Counter
	retriesName  string

	// closed is set by Close or when a newer Set took this one's targets over.
	closed bool
}

// epoch anchors the int64 times of passive health; Sub keeps the monotonic clock of time.Now.
var epoch = time.Now()

// errNoTargets is a Config without targets (conf refuses it first).
var errNoTargets = errors.New("upstream: a route needs at least one target")

// NewSet builds a route's Set. When prev is the serving Set of the same route name (a reload),
// the targets that stay (same host:port) keep their state (in-flight count, passive counters
// and ejection, active-check state and checker, metrics, attached value), the targets that go
// are stopped (checker ended, metrics unregistered, attached value closed), and prev is handed
// over: its Close becomes a no-op. A prev of another route name is ignored (Close it yourself).
// On an error prev is untouched.
func NewSet(cfg Config, prev *Set) (*Set, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Set{
		route:   cfg.Route,
		balance: cfg.Balance,
		passive: cfg.Passive,
		retries: min(cfg.Retries, len(cfg.Targets)-1),
		metrics: cfg.Metrics,
		clock:   cfg.Clock,
		onEvent: cfg.OnEvent,
	}
	if s.metrics == nil {
		s.metrics = metrics.NewSet()
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	if s.passive.MaxEjectTime < s.passive.EjectTime {
		s.passive.MaxEjectTime = s.passive.EjectTime
	}
	n := len(cfg.Targets)
	s.maxEjected = min(n*max(cfg.Passive.MaxEjectedPercent, 0)/100, n-1)

	var kept map[string]*state
	if prev != nil && !prev.closed && prev.route == cfg.Route {
		kept = make(map[string]*state, len(prev.targets))
		for _, t := range prev.targets {
			kept[t.st.addr] = t.st
		}
	}
	s.retriesName = metricRetries + `{route=` + quoteLabel(cfg.Route) + `}`
	s.retriesTotal = s.metrics.GetOrCreateCounter(s.retriesName)

	s.targets = make([]*Target, n)
	for i, tc := range cfg.Targets {
		st := kept[tc.Addr]
		if st != nil {
			delete(kept, tc.Addr)
		} else {
			st = newState(tc.Addr, cfg.Route, s.metrics)
		}
		s.targets[i] = &Target{st: st, set: s, weight: max(tc.Weight, 1), seed: mix64(hashString(tc.Addr))}
	}
	for _, t := range s.targets {
		t.st.owner.Store(s)
	}
	if prev != nil && kept != nil {
		// Targets that went away: nothing picks them any more.
		for _, st := range kept {
			st.retire()
		}
		prev.closed = true
	}
	for _, t := range s.targets {
		if cfg.Check != nil {
			t.st.startOrUpdateChecker(cfg.Check)
		} else {
			t.st.stopChecker()
		}
	}
	return s, nil
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

// Close ends the Set of a route that left the route table: it stops the checkers, unregisters
// the metrics and closes the attached values of its targets. In-flight requests may still call
// Done. Close is a no-op on a Set a newer one took over (NewSet with prev), and when called twice.
func (s *Set) Close() {
	if s.closed {
		return
	}
	s.closed = true
	for _, t := range s.targets {
		t.st.retire()
	}
	s.metrics.UnregisterMetric(s.retriesName)
}

// Route returns the route name the Set was built for.
func (s *Set) Route() string { return s.route }

// Balance returns the Set's algorithm.
func (s *Set) Balance() Balance { return s.balance }

// Targets returns the Set's targets in configuration order (for building their pools). The
// slice is the Set's own: do not modify it.
func (s *Set) Targets() []*Target { return s.targets }

// Retries is how many other targets a request may try after a failure that sent nothing:
// Config.Retries, but never more than the route's other targets.
func (s *Set) Retries() int { return s.retries }

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
// when every candidate is excluded: there is no other target to retry on.
func (s *Set) Pick(clientIP []byte, exclude ...*Target) *Target {
	now := s.now()
	t := s.pickAmong(now, clientIP, exclude, false)
	if t == nil {
		if s.anyEligible(now) {
			return nil // eligible targets exist, all already tried
		}
		if s.panicking.CompareAndSwap(false, true) {
			s.event(Event{Kind: EventPanic})
		}
		if t = s.pickAmong(now, clientIP, exclude, true); t == nil {
			return nil
		}
	} else if s.panicking.Load() && s.panicking.CompareAndSwap(true, false) {
		s.event(Event{Kind: EventPanicOver})
	}
	t.st.inflight.Add(1)
	return t
}

// anyEligible reports whether some target is eligible, ignoring exclusions.
func (s *Set) anyEligible(now int64) bool {
	for _, t := range s.targets {
		if t.st.eligible(now) {
			return true
		}
	}
	return false
}

// pickAmong runs the balancer over the candidates: targets not excluded and, unless all is
// set (panic mode), eligible.
func (s *Set) pickAmong(now int64, clientIP []byte, exclude []*Target, all bool) *Target {
	if len(s.targets) == 1 {
		t := s.targets[0]
		if t.candidate(now, exclude, all) {
			return t
		}
		return nil
	}
	switch s.balance {
	case RoundRobin:
		return s.pickRoundRobin(now, exclude, all)
	case ClientIPHash:
		return s.pickHash(now, clientIP, exclude, all)
	default:
		return s.pickP2C(now, exclude, all)
	}
}

// neverEjected is the ejectedUntil of a target that is not ejected.
const neverEjected = math.MinInt64
