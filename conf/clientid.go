package conf

import (
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
)

// The client's identity (SPEC 16) and per-client rate limits (SPEC 17): server.trusted_proxies,
// server.proxy_protocol and a route's rate_limit.

// ProxyProtocol is server.proxy_protocol: the PROXY protocol (v1 or v2) on the listener, for an
// AWS NLB, HAProxy or another L4 balancer in front. It cannot change on reload.
type ProxyProtocol struct {
	// Enabled makes every connection start with a PROXY header; default false.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// Allow lists the IP addresses and CIDRs a connection may come from (the socket peer, never
	// the address inside the header); empty means any source.
	Allow []string `koanf:"allow" json:"allow"`
	// Timeout bounds the wait for the header, counted from the accept; default read_timeout.
	// Unlike Enabled and Allow, a reload may change it.
	Timeout time.Duration `koanf:"timeout" json:"timeout"`
}

// MarshalJSON encodes the timeout as a Go duration string.
func (p ProxyProtocol) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(p)) }

// RateLimit is a route's rate_limit: a token bucket per key (SPEC 17).
type RateLimit struct {
	// RequestsPerSecond is the refill rate R, tokens per second; > 0, may be a fraction.
	RequestsPerSecond float64 `koanf:"requests_per_second" json:"requests_per_second"`
	// Burst is the bucket size B in tokens; default R, at least 1.
	Burst float64 `koanf:"burst" json:"burst"`
	// Key is RateKeyClientIP (default; IPv6 per /64) or "header:NAME" (a request without the
	// header is keyed by its client IP).
	Key string `koanf:"key" json:"key"`
	// Scope is RateScopeLocal (default: per instance) or RateScopeGlobal (shared by every
	// replica in server.redis).
	Scope string `koanf:"scope" json:"scope"`
	// OnError is what a global limit does when Redis gives no decision within
	// server.redis.timeout: RateOnErrorLocal (default), RateOnErrorAllow or RateOnErrorDeny.
	OnError string `koanf:"on_error" json:"on_error,omitempty"`
}

// Values and limits of rate_limit.
const (
	// RateKeyClientIP keys the buckets by the client IP of SPEC 16, IPv6 addresses per /64 (one
	// subscriber usually holds a whole /64, and could rotate through it at will).
	RateKeyClientIP = "client_ip"
	// RateKeyHeaderPrefix starts a key naming a request header, "header:X-Api-Key".
	RateKeyHeaderPrefix = "header:"
	// RateLimitMaxKeys bounds the buckets of one route (SPEC 17); beyond it new keys share one
	// overflow bucket.
	RateLimitMaxKeys = 100_000
	// maxRequestsPerSecond bounds requests_per_second: far above what one key of one instance
	// serves, low enough that one token is at least a nanosecond.
	maxRequestsPerSecond = 1e9
	// maxBurst bounds burst: a bucket of a billion requests is no limit already.
	maxBurst = 1e9
)

// HeaderName returns the header a "header:NAME" key names, or "" for client_ip.
func (r *RateLimit) HeaderName() string {
	name, _ := strings.CutPrefix(r.Key, RateKeyHeaderPrefix)
	if name == r.Key {
		return ""
	}
	return name
}

// ParsePrefix parses an IP address (a /32 or /128) or a CIDR, as trusted_proxies and
// proxy_protocol.allow write them. IPv4-mapped IPv6 addresses are IPv4; host bits of a CIDR
// are masked off.
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		a := p.Addr()
		bits := p.Bits()
		if a.Is4In6() && bits >= 96 {
			a, bits = a.Unmap(), bits-96
		}
		return netip.PrefixFrom(a, bits).Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("a zone (%%%s) has no meaning here", a.Zone())
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// ParsePrefixes parses a validated list of addresses and CIDRs (see ParsePrefix).
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// checkClientIdentity validates trusted_proxies and proxy_protocol and fills the default
// proxy_protocol.timeout (read_timeout).
func (l *loader) checkClientIdentity(cfg *Config) {
	s := &cfg.Server
	if s.TrustedProxies == nil {
		s.TrustedProxies = []string{}
	}
	l.checkPrefixList("server.trusted_proxies", s.TrustedProxies)
	p := &s.ProxyProtocol
	if p.Allow == nil {
		p.Allow = []string{}
	}
	l.checkPrefixList("server.proxy_protocol.allow", p.Allow)
	switch {
	case p.Timeout < 0:
		l.configErr("server.proxy_protocol.timeout", "must not be negative, not %s", p.Timeout)
	case p.Timeout == 0:
		p.Timeout = s.ReadTimeout // SPEC 16's default (read_timeout has bounds of its own)
	default:
		if msg := checkDurationBound("proxy_protocol.timeout", p.Timeout); msg != "" {
			l.configErr("server.proxy_protocol.timeout", "%s", msg) // bounds.go
		}
	}
}

// proxyProtocolWarnings warns about a PROXY protocol listener that any host may reach with a
// header of its choosing: enabled, allow empty, and the listener not on loopback. Whoever
// connects then chooses their client IP, hence their rate-limit key, their access-log address
// and what trusted_proxies decides.
func proxyProtocolWarnings(c *Config) []string {
	p := c.Server.ProxyProtocol
	if !p.Enabled || len(p.Allow) > 0 || loopbackHost(c.Server.Host) {
		return nil
	}
	return []string{fmt.Sprintf("server.proxy_protocol: enabled with an empty allow on %s, which is not a loopback address: any host that reaches port %d can send a PROXY header and choose its client IP (its rate-limit key); list the balancer's addresses in proxy_protocol.allow",
		c.Server.Host, c.Server.Port)}
}

// loopbackHost reports a listener host that only this machine reaches: localhost or a
// loopback IP.
func loopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(h, "[]"))
	return err == nil && ip.Unmap().IsLoopback()
}

// checkPrefixList reports every entry of list that is not an IP address or a CIDR.
func (l *loader) checkPrefixList(key string, list []string) {
	for i, s := range list {
		if _, err := ParsePrefix(strings.TrimSpace(s)); err != nil || strings.TrimSpace(s) != s {
			l.configErr(key, "item %d (%q) must be an IP address (10.0.0.5, 2001:db8::1) or a CIDR (10.0.0.0/8, 2001:db8::/32)", i, s)
		}
	}
}

// checkRateLimit validates a route's rate_limit and resolves it into r.Effective.RateLimit.
func checkRateLimit(r *Route, hasRedis bool, bad func(key, format string, args ...any)) {
	rl := r.RateLimit
	if rl == nil {
		return
	}
	const key = "rate_limit"
	ok := true
	switch rps := rl.RequestsPerSecond; {
	case rps == 0:
		bad(key, "requests_per_second: is required and must be greater than 0 (0.5 is one request every 2s)")
		ok = false
	case !(rps > 0) || math.IsInf(rps, 0) || rps > maxRequestsPerSecond:
		bad(key, "requests_per_second: must be greater than 0 and at most %g, not %v", float64(maxRequestsPerSecond), rps)
		ok = false
	}
	eff := *rl
	switch {
	case rl.Burst == 0:
		eff.Burst = max(1, rl.RequestsPerSecond)
	case !(rl.Burst >= 1) || rl.Burst > maxBurst:
		bad(key, "burst: must be at least 1 (a request costs one token) and at most %g, not %v; remove it for requests_per_second", float64(maxBurst), rl.Burst)
		ok = false
	}
	switch {
	case rl.Key == "":
		eff.Key = RateKeyClientIP
	case rl.Key == RateKeyClientIP:
	case strings.HasPrefix(rl.Key, RateKeyHeaderPrefix):
		if name := rl.HeaderName(); !isToken(name) {
			bad(key, "key: %q must name a header, as in header:X-Api-Key", rl.Key)
			ok = false
		}
	default:
		bad(key, "key: must be %s or header:NAME, not %q", RateKeyClientIP, rl.Key)
		ok = false
	}
	if !checkRateScope(rl, &eff, hasRedis, bad) {
		ok = false
	}
	if eff.Scope == RateScopeLocal {
		eff.OnError = ""
	}
	if ok {
		r.Effective.RateLimit = &eff
	}
}

// isToken reports an RFC 9110 token, what a header name is.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// checkProxyProtocolReload refuses a reload that turns server.proxy_protocol on or off or
// changes its allow list: the listener is wrapped once, at start. Its timeout follows the
// configuration in force (it defaults to read_timeout, which a reload may change).
func checkProxyProtocolReload(old, now *Config, errs *errorList) {
	a, b := old.Server.ProxyProtocol, now.Server.ProxyProtocol
	if a.Enabled != b.Enabled || (a.Enabled && !slices.Equal(a.Allow, b.Allow)) {
		errs.add(now.ConfigFile, -1, "", "server.proxy_protocol", "cannot change on reload (%s -> %s): restart the gateway to apply it", a.describe(), b.describe())
	}
}

// describe shows the setting in one line, for the reload error.
func (p ProxyProtocol) describe() string {
	if !p.Enabled {
		return "off"
	}
	return fmt.Sprintf("on, allow [%s]", strings.Join(p.Allow, " "))
}
