package conf

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Defaults of a route's upstream pool (SPEC 13), each with why it has its value.
const (
	// DefaultTargetWeight gives every target of a list the same share.
	DefaultTargetWeight = 1
	// MinTargetWeight and MaxTargetWeight bound a weight: 1..100 is enough to express any
	// share an operator means, and keeps smooth round robin's cycle short.
	MinTargetWeight, MaxTargetWeight = 1, 100
	// DefaultBalance is latency-aware power of two choices (peak EWMA): it steers away from a
	// slow target by its latency and in-flight count where round robin would keep feeding it
	// its share.
	DefaultBalance = BalanceP2C
	// DefaultLatencyDecay is latency_decay's default (SPEC 13): a slow target's estimate has
	// lost 63% of its excess after 10s idle, so it is tried again now and then.
	DefaultLatencyDecay = 10 * time.Second
	// MinLatencyDecay and MaxLatencyDecay bound latency_decay: below a second one slow answer
	// is forgotten before the next pick, beyond 5 minutes a target that recovered waits too
	// long for its share.
	MinLatencyDecay, MaxLatencyDecay = time.Second, 5 * time.Minute
	// DefaultDiscoveryRefresh is discovery_refresh's default: a new pod is served and a removed
	// one left within 5s, for one small query per name.
	DefaultDiscoveryRefresh = 5 * time.Second
	// MinDiscoveryRefresh and MaxDiscoveryRefresh bound discovery_refresh: more often than
	// every second is load on DNS for nothing, less often than 5 minutes keeps dead pods.
	MinDiscoveryRefresh, MaxDiscoveryRefresh = time.Second, 5 * time.Minute
	// DiscoverDNS is the one value of a targets entry's discover key.
	DiscoverDNS = "dns"
	// DefaultConsecutiveFailures ejects a target after 5 failures in a row: one or two failed
	// requests are noise, five in a row is a target that is down.
	DefaultConsecutiveFailures = 5
	// DefaultEjectTime is long enough for a restarting instance to come back, short enough
	// that a healthy one is not lost for long.
	DefaultEjectTime = 30 * time.Second
	// DefaultMaxEjectTime caps the doubling at 5 minutes (30s, 1m, 2m, 4m, 5m): a target that
	// keeps failing is tried again at least every 5 minutes.
	DefaultMaxEjectTime = 300 * time.Second
	// DefaultMaxEjectedPercent keeps at least half of the targets in use whatever passive
	// health concludes: a wrong verdict (a bad request pattern, not a bad target) cannot take a
	// route down.
	DefaultMaxEjectedPercent = 50
	// DefaultHealthCheckInterval and DefaultHealthCheckTimeout: a check every 10s costs the
	// upstream nothing, and 2s is far above a healthy answer.
	DefaultHealthCheckInterval = 10 * time.Second
	DefaultHealthCheckTimeout  = 2 * time.Second
	// DefaultHealthyThreshold and DefaultUnhealthyThreshold: two passes to come back, three
	// failures to go down (about 30s of a dead target, as Kubernetes' readiness probe does).
	DefaultHealthyThreshold   = 2
	DefaultUnhealthyThreshold = 3
	// DefaultRetries retries a failure that sent nothing once on another target: enough to
	// hide one dead target, and never a replay (SPEC 3 step 9).
	DefaultRetries = 1
	// MaxRetries bounds retries: beyond 3, a request waits for more dials than a client will.
	MaxRetries = 3
)

// Values of Route.Balance and Effective.Balance (SPEC 13).
const (
	BalanceP2C          = "p2c"
	BalanceLeastRequest = "least_request"
	BalanceRoundRobin   = "round_robin"
	BalanceClientIPHash = "client_ip_hash"
)

// TargetEntry is one entry of a route's targets list, as written.
type TargetEntry struct {
	// URL is "http://host:port" or "https://host:port", with target's rules.
	URL string `json:"url"`
	// Weight is the target's share, 1..100; DefaultTargetWeight when the entry does not set it.
	// A discovered entry gives it to each of its addresses.
	Weight int `json:"weight"`
	// Discover is DiscoverDNS when the entry's host is a name standing for one target per
	// address (SPEC 13 DNS discovery), "" otherwise.
	Discover string `json:"discover,omitempty"`
}

// PassiveHealth is a route's passive_health (SPEC 13), every field filled in.
type PassiveHealth struct {
	// ConsecutiveFailures ejects a target after that many failures in a row; 0 turns passive
	// health off. Default 5.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// EjectTime is the first ejection's length (> 0), doubled per ejection in a row; default 30s.
	EjectTime time.Duration `json:"eject_time"`
	// MaxEjectTime caps the doubling (>= EjectTime); default 300s.
	MaxEjectTime time.Duration `json:"max_eject_time"`
	// MaxEjectedPercent is the share of targets (rounded down, 0..100) that may be ejected at
	// once; never all of them. Default 50.
	MaxEjectedPercent int `json:"max_ejected_percent"`
}

// HealthCheck is a route's health_check (SPEC 13), every field filled in. Absent means no
// active checks.
type HealthCheck struct {
	// Path is what GET asks for, starting with /. Required.
	Path string `json:"path"`
	// Interval is the time between two checks of a target (> 0), plus up to 10% jitter;
	// default 10s.
	Interval time.Duration `json:"interval"`
	// Timeout bounds one check, dial included (> 0); default 2s.
	Timeout time.Duration `json:"timeout"`
	// HealthyThreshold is the passes in a row that bring a target back (>= 1); default 2.
	HealthyThreshold int `json:"healthy_threshold"`
	// UnhealthyThreshold is the failures in a row that take a target down (>= 1); default 3.
	UnhealthyThreshold int `json:"unhealthy_threshold"`
}

// EffectiveTarget is one upstream of a route once resolved: the targets list, or target as a
// list of one with weight 1.
type EffectiveTarget struct {
	// URL is the target as written.
	URL string `json:"url"`
	// Addr is its host:port (host lower-cased): what is dialed, and the metrics label.
	Addr string `json:"addr"`
	// Weight is the target's share, 1..100.
	Weight int `json:"weight"`
	// Discover is DiscoverDNS for an entry resolved into one target per address; Addr is then
	// the name and port, and the targets are its addresses (ip:port) at run time.
	Discover string `json:"discover,omitempty"`
	// Found is, for -check only, the addresses (ip:port) a lookup of a discovered entry found
	// (CheckDiscovered fills it); empty otherwise.
	Found []string `json:"found,omitempty"`
}

// MarshalJSON encodes durations as Go duration strings, as -check shows every duration.
func (p PassiveHealth) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(p)) }

// MarshalJSON encodes durations as Go duration strings.
func (h HealthCheck) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(h)) }

// defaultPassiveHealth is passive_health when the route does not set it: on (SPEC 13).
func defaultPassiveHealth() PassiveHealth {
	return PassiveHealth{
		ConsecutiveFailures: DefaultConsecutiveFailures,
		EjectTime:           DefaultEjectTime,
		MaxEjectTime:        DefaultMaxEjectTime,
		MaxEjectedPercent:   DefaultMaxEjectedPercent,
	}
}

// The keys of the nested upstream settings, with their kinds.
var (
	targetEntrySchema   = schema{"url": kindString, "weight": kindInt, "discover": kindString}
	passiveHealthSchema = schema{"consecutive_failures": kindInt, "eject_time": kindDuration, "max_eject_time": kindDuration, "max_ejected_percent": kindInt}
	healthCheckSchema   = schema{"path": kindString, "interval": kindDuration, "timeout": kindDuration, "healthy_threshold": kindInt, "unhealthy_threshold": kindInt}
)

// kindNested marks the route keys decodeUpstreamKey decodes; their values never reach
// fromYAML.
const kindNested kind = 100

// The nested keys join the route schema so that "did you mean" and the known-keys list of an
// unknown route key include them.
func init() {
	for _, k := range []string{"targets", "passive_health", "health_check"} {
		routeSchema[k] = kindNested
	}
}

// decodeUpstreamKey decodes the route keys that are lists or mappings (targets,
// passive_health, health_check), which the flat route schema cannot type. It reports whether
// key was one of them; its errors name the sub-key ("targets[1].weight").
func (l *loader) decodeUpstreamKey(i int, in *routeInput, key string, v any) bool {
	switch key {
	case "targets", "passive_health", "health_check":
	default:
		return false
	}
	bad := func(sub, format string, args ...any) {
		l.errs.add(l.routesName, i, in.rawPrefix, sub, format, args...)
		in.failed[key] = true
	}
	switch key {
	case "targets":
		in.Route.Targets = decodeTargets(v, bad)
	case "passive_health":
		if m, ok := decodeMapping(key, v, passiveHealthSchema, bad); ok {
			p := defaultPassiveHealth()
			setInt(m, "consecutive_failures", &p.ConsecutiveFailures)
			setDuration(m, "eject_time", &p.EjectTime)
			setDuration(m, "max_eject_time", &p.MaxEjectTime)
			setInt(m, "max_ejected_percent", &p.MaxEjectedPercent)
			in.Route.PassiveHealth = &p
		}
	case "health_check":
		if m, ok := decodeMapping(key, v, healthCheckSchema, bad); ok {
			h := HealthCheck{Interval: DefaultHealthCheckInterval, Timeout: DefaultHealthCheckTimeout,
				HealthyThreshold: DefaultHealthyThreshold, UnhealthyThreshold: DefaultUnhealthyThreshold}
			if p, ok := m["path"].(string); ok {
				h.Path = p
			} else if !in.failed[key] {
				bad("health_check.path", "is required when health_check is present (a path such as /healthz)")
			}
			setDuration(m, "interval", &h.Interval)
			setDuration(m, "timeout", &h.Timeout)
			setInt(m, "healthy_threshold", &h.HealthyThreshold)
			setInt(m, "unhealthy_threshold", &h.UnhealthyThreshold)
			in.Route.HealthCheck = &h
		}
	}
	if !in.failed[key] {
		in.present[key] = true
	}
	return true
}

// decodeMapping types the sub-keys of a nested mapping (key: {sub: value}) against sch.
func decodeMapping(key string, v any, sch schema, bad func(sub, format string, args ...any)) (map[string]any, bool) {
	raw, ok := asMap(v)
	if !ok {
		bad(key, "must be a mapping of %s, not %s", strings.Join(sch.keys(), ", "), yamlLiteral(v))
		return nil, false
	}
	out := make(map[string]any, len(raw))
	for _, sub := range sortedKeys(raw) {
		kd, known := sch[sub]
		if !known {
			bad(key+"."+sub, "%s", sch.unknownKey(sub))
			continue
		}
		val, err := fromYAML(raw[sub], kd)
		if err != nil {
			bad(key+"."+sub, "%s", err)
			continue
		}
		out[sub] = val
	}
	return out, true
}

// decodeTargets decodes the targets list; each entry's own mistakes are reported here, the
// ones across entries by checkTargets.
func decodeTargets(v any, bad func(sub, format string, args ...any)) []TargetEntry {
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		bad("targets", "must be a list of at least one {url, weight} entry, not %s", yamlLiteral(v))
		return nil
	}
	out := make([]TargetEntry, 0, len(list))
	for j, item := range list {
		key := fmt.Sprintf("targets[%d]", j)
		if s, isString := item.(string); isString {
			bad(key, "must be a mapping such as {url: %q, weight: 1}, not a string", s)
			continue
		}
		m, ok := decodeMapping(key, item, targetEntrySchema, bad)
		if !ok {
			continue
		}
		e := TargetEntry{Weight: DefaultTargetWeight}
		if u, ok := m["url"].(string); ok {
			e.URL = u
			if msg := checkTarget(u); msg != "" {
				bad(key+".url", "%s", msg)
			}
		} else if _, given := m["url"]; !given {
			bad(key+".url", "is required (http://host:port or https://host:port)")
		}
		if d, ok := m["discover"].(string); ok {
			e.Discover = d
			if d != DiscoverDNS {
				bad(key+".discover", "must be %s (one target per address of the name), not %q", DiscoverDNS, d)
			}
		}
		if w, ok := m["weight"].(int); ok {
			e.Weight = w
			if w < MinTargetWeight || w > MaxTargetWeight {
				bad(key+".weight", "must be between %d and %d, not %d", MinTargetWeight, MaxTargetWeight, w)
			}
		}
		out = append(out, e)
	}
	return out
}

// setInt and setDuration copy a typed sub-key into a field when it was given.
func setInt(m map[string]any, key string, dst *int) {
	if v, ok := m[key].(int); ok {
		*dst = v
	}
}

func setDuration(m map[string]any, key string, dst *time.Duration) {
	if v, ok := m[key].(time.Duration); ok {
		*dst = v
	}
}

// checkTargets validates target/targets and the pool settings of a route, after decoding:
// exactly one of target and targets, host:port unique, one scheme, and the values of
// balance, passive_health, health_check and retries.
func (l *loader) checkTargets(r *Route, in *routeInput, bad func(key, format string, args ...any)) {
	switch {
	case in.present["target"] && (in.present["targets"] || in.failed["targets"]):
		bad("targets", "a route has either target or targets, not both (targets: [{url: %q}, ...] replaces target)", r.Target)
	case in.present["target"]:
		if msg := checkTarget(r.Target); msg != "" {
			bad("target", "%s", msg)
		}
	case in.present["targets"]:
		seen := make(map[string]int, len(r.Targets))
		scheme := ""
		for j, e := range r.Targets {
			u, err := url.Parse(e.URL)
			if err != nil || checkTarget(e.URL) != "" {
				continue // reported when decoded
			}
			addr := strings.ToLower(u.Host)
			if k, dup := seen[addr]; dup {
				bad("targets", "targets[%d] and targets[%d] are both %s: each host:port once (raise its weight instead)", k, j, addr)
			}
			seen[addr] = j
			if scheme == "" {
				scheme = u.Scheme
			} else if u.Scheme != scheme {
				bad("targets", "targets[%d] is %s but targets[0] is %s: all targets of a route share one scheme", j, u.Scheme, scheme)
			}
		}
	case !in.failed["target"] && !in.failed["targets"]:
		bad("target", "is required (http://host:port or https://host:port)")
	}

	if r.Balance != nil {
		switch *r.Balance {
		case BalanceP2C, BalanceLeastRequest, BalanceRoundRobin, BalanceClientIPHash:
		default:
			bad("balance", "must be %s, %s, %s or %s, not %q", BalanceP2C, BalanceLeastRequest, BalanceRoundRobin, BalanceClientIPHash, *r.Balance)
		}
	}
	checkBound := func(key string, d *time.Duration, lo, hi time.Duration) {
		if d != nil && (*d < lo || *d > hi) {
			bad(key, "must be between %s and %s, not %s", formatDuration(lo), formatDuration(hi), formatDuration(*d))
		}
	}
	checkBound("latency_decay", r.LatencyDecay, MinLatencyDecay, MaxLatencyDecay)
	checkBound("discovery_refresh", r.DiscoveryRefresh, MinDiscoveryRefresh, MaxDiscoveryRefresh)
	if r.Retries != nil && (*r.Retries < 0 || *r.Retries > MaxRetries) {
		bad("retries", "must be between 0 and %d, not %d", MaxRetries, *r.Retries)
	}
	if p := r.PassiveHealth; p != nil {
		if p.ConsecutiveFailures < 0 {
			bad("passive_health", "consecutive_failures must not be negative, not %d (0 turns passive health off)", p.ConsecutiveFailures)
		}
		ejectBound := checkDurationBound("passive_health.eject_time", p.EjectTime) // bounds.go
		maxBound := checkDurationBound("passive_health.max_eject_time", p.MaxEjectTime)
		switch {
		case p.EjectTime <= 0:
			bad("passive_health", "eject_time must be greater than 0, not %s (set consecutive_failures: 0 to turn passive health off)", formatDuration(p.EjectTime))
		case ejectBound != "":
			bad("passive_health", "eject_time %s", ejectBound)
		case maxBound != "":
			bad("passive_health", "max_eject_time %s", maxBound)
		case p.MaxEjectTime < p.EjectTime:
			bad("passive_health", "max_eject_time %s must be at least eject_time %s", formatDuration(p.MaxEjectTime), formatDuration(p.EjectTime))
		}
		if p.MaxEjectedPercent < 0 || p.MaxEjectedPercent > 100 {
			bad("passive_health", "max_ejected_percent must be between 0 and 100, not %d", p.MaxEjectedPercent)
		}
	}
	if h := r.HealthCheck; h != nil {
		if h.Path != "" {
			if msg := checkHealthPath(h.Path); msg != "" {
				bad("health_check", "path %s", msg)
			}
		}
		if h.Interval <= 0 {
			bad("health_check", "interval must be greater than 0, not %s", formatDuration(h.Interval))
		} else if msg := checkDurationBound("health_check.interval", h.Interval); msg != "" {
			bad("health_check", "interval %s", msg) // bounds.go
		}
		if h.Timeout <= 0 {
			bad("health_check", "timeout must be greater than 0, not %s", formatDuration(h.Timeout))
		} else if msg := checkDurationBound("health_check.timeout", h.Timeout); msg != "" {
			bad("health_check", "timeout %s", msg)
		}
		if h.HealthyThreshold < 1 || h.UnhealthyThreshold < 1 {
			bad("health_check", "healthy_threshold and unhealthy_threshold must be at least 1, not %d and %d", h.HealthyThreshold, h.UnhealthyThreshold)
		}
	}
}

// checkResolver validates server.resolver: "" or the host:port of a DNS server.
func (l *loader) checkResolver(s *Server) {
	if s.Resolver == "" {
		return
	}
	host, port, err := net.SplitHostPort(s.Resolver)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		l.configErr("server.resolver", "must be the host:port of a DNS server (10.96.0.10:53, [fd00::a]:53), not %q", s.Resolver)
	}
}

// checkHealthPath accepts a request target for the check: a path starting with /, with an
// optional query, no spaces or control bytes (it goes on the request line as it is).
func checkHealthPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		return fmt.Sprintf("must start with /, not %q", p)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == 0x7f {
			return fmt.Sprintf("%q must not contain spaces or control characters (percent-encode them)", p)
		}
	}
	return ""
}

// resolveUpstream fills the pool part of a route's Effective. With targets, Route.Target is
// set to the first target's URL, so code that knows only one target keeps working.
func resolveUpstream(r *Route, e *Effective) {
	e.Targets = nil
	discovered := false
	if len(r.Targets) > 0 {
		for _, t := range r.Targets {
			e.Targets = append(e.Targets, EffectiveTarget{URL: t.URL, Addr: targetAddr(t.URL), Weight: t.Weight, Discover: t.Discover})
			discovered = discovered || t.Discover != ""
		}
		if r.Target == "" {
			r.Target = r.Targets[0].URL
		}
	} else if r.Target != "" {
		e.Targets = []EffectiveTarget{{URL: r.Target, Addr: targetAddr(r.Target), Weight: DefaultTargetWeight}}
	}
	e.Balance = deref(r.Balance, DefaultBalance)
	e.LatencyDecay = deref(r.LatencyDecay, DefaultLatencyDecay)
	e.DiscoveryRefresh = 0
	if discovered {
		e.DiscoveryRefresh = deref(r.DiscoveryRefresh, DefaultDiscoveryRefresh)
	}
	e.PassiveHealth = deref(r.PassiveHealth, defaultPassiveHealth())
	if r.HealthCheck != nil {
		h := *r.HealthCheck
		e.HealthCheck = &h
	}
	// SPEC 13: "in effect never more than the route's other targets". A discovered entry's
	// count is known at run time only: the balancer caps it then.
	e.Retries = deref(r.Retries, DefaultRetries)
	if !discovered {
		e.Retries = max(0, min(e.Retries, len(e.Targets)-1))
	}
}

// targetAddr is the host:port of a target URL, host lower-cased; "" when it does not parse
// (the route is then refused anyway).
func targetAddr(t string) string {
	u, err := url.Parse(t)
	if err != nil {
		return ""
	}
	return strings.ToLower(u.Host)
}

var (
	_ json.Marshaler = PassiveHealth{}
	_ json.Marshaler = HealthCheck{}
)
