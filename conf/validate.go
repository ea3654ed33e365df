package conf

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxWorkerPoolSize bounds worker_pool_size: far above any real pool, low enough that
// 64 × worker_pool_size (the max_connections default) cannot overflow.
const maxWorkerPoolSize = 1 << 20

// Why zero is refused for the server keys that must be positive. Keys not listed accept 0
// with a documented meaning (see Config.checkServer).
var zeroMeans = map[string]string{
	"read_timeout":            "a client could hold its connection forever (Slowloris)",
	"write_timeout":           "a client that stops reading could hold its worker forever",
	"response_header_timeout": "a hung upstream could hold its worker forever",
	"connect_timeout":         "a black-holed upstream could hold its worker until the kernel gives up",
	"idle_timeout":            "remove the key to use read_timeout",
	"upstream_idle_timeout":   "no upstream connection could be reused",
}

// checkServer validates the merged server and log settings. Judgement on zero, written
// down because other packages rely on it:
//   - worker_queue_timeout 0: a request that finds every worker busy gets its 503 at once.
//   - shutdown_timeout 0: in-flight requests are not waited for; drain_delay 0: no drain phase.
//   - max_body_bytes 0: no request body is accepted (any declared body is 413).
//   - min_progress_bytes 0: only pauses longer than read_timeout cut a client, not a drip.
//   - stream_threshold_bytes 0: every body is streamed.
//   - every other duration, port, worker_pool_size, max_connections and max_header_bytes
//     must be greater than 0.
func (l *loader) checkServer(cfg *Config) {
	s := &cfg.Server
	if msg := checkListenHost(s.Host); msg != "" {
		l.configErr("server.host", "%s", msg)
	}
	if s.Port < 1 || s.Port > 65535 {
		l.configErr("server.port", "must be between 1 and 65535, not %d", s.Port)
	}
	if s.WorkerPoolSize < 1 || s.WorkerPoolSize > maxWorkerPoolSize {
		l.configErr("server.worker_pool_size", "must be between 1 and %d, not %d", maxWorkerPoolSize, s.WorkerPoolSize)
	}
	if !(s.ElevatedShare > 0 && s.ElevatedShare <= 1) {
		l.configErr("server.elevated_share", "must be greater than 0 and at most 1, not %v", s.ElevatedShare)
	}
	if s.MaxConnections < 1 {
		l.configErr("server.max_connections", "must be at least 1, not %d (remove the key for %d × worker_pool_size)", s.MaxConnections, DefaultMaxConnectionsPerWorker)
	}

	durations := []struct {
		key string
		d   time.Duration
	}{
		{"worker_queue_timeout", s.WorkerQueueTimeout},
		{"read_timeout", s.ReadTimeout},
		{"write_timeout", s.WriteTimeout},
		{"response_header_timeout", s.ResponseHeaderTimeout},
		{"connect_timeout", s.ConnectTimeout},
		{"idle_timeout", s.IdleTimeout},
		{"upstream_idle_timeout", s.UpstreamIdleTimeout},
		{"shutdown_timeout", s.ShutdownTimeout},
		{"drain_delay", s.DrainDelay},
	}
	for _, d := range durations {
		why, positive := zeroMeans[d.key]
		switch {
		case d.d < 0:
			l.configErr("server."+d.key, "must not be negative, not %s", d.d)
		case d.d == 0 && positive:
			l.configErr("server."+d.key, "must be greater than 0: %s", why)
		default:
			if msg := checkDurationBound(d.key, d.d); msg != "" {
				l.configErr("server."+d.key, "%s", msg) // bounds.go
			}
		}
	}

	sizes := []struct {
		key string
		n   int64
	}{
		{"max_body_bytes", s.MaxBodyBytes},
		{"max_header_bytes", s.MaxHeaderBytes},
		{"min_progress_bytes", s.MinProgressBytes},
		{"stream_threshold_bytes", s.StreamThresholdBytes},
	}
	for _, n := range sizes {
		if n.n < 0 {
			l.configErr("server."+n.key, "must not be negative, not %d", n.n)
		}
	}
	switch {
	case s.MaxHeaderBytes == 0:
		l.configErr("server.max_header_bytes", "must be greater than 0: no request line would fit")
	case s.MaxHeaderBytes > 0 && s.MaxHeaderBytes < MinHeaderBytes:
		l.configErr("server.max_header_bytes", "must be at least %d (1 KiB), not %d: the headers every client sends would not fit", MinHeaderBytes, s.MaxHeaderBytes)
	case s.MaxHeaderBytes > MaxHeaderBytes:
		l.configErr("server.max_header_bytes", "must be at most %d (1 MiB), not %d: every open connection holds a read buffer of this size", MaxHeaderBytes, s.MaxHeaderBytes)
	}
	if s.StreamThresholdBytes > MaxStreamThresholdBytes {
		l.configErr("server.stream_threshold_bytes", "must be at most %d (1 GiB), not %d: bodies at or below it are buffered whole in memory", MaxStreamThresholdBytes, s.StreamThresholdBytes)
	}
	if msg := checkChunkedMode(s.InboundChunkedMode); msg != "" {
		l.configErr("server.inbound_chunked_mode", "%s", msg)
	}
	if msg := checkServedPath(s.HealthPath); msg != "" {
		l.configErr("server.health_path", "%s", msg)
	}
	if msg := checkServedPath(s.MetricsPath); msg != "" {
		l.configErr("server.metrics_path", "%s", msg)
	} else if s.MetricsPath == s.HealthPath {
		l.configErr("server.metrics_path", "must differ from health_path (%s)", s.HealthPath)
	}

	l.checkTLS(cfg)
	l.checkTracing(cfg)
	l.checkHTTPRedirect(cfg)

	switch cfg.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		l.configErr("log.level", "must be debug, info, warn or error, not %q", cfg.Log.Level)
	}
	switch cfg.Log.Format {
	case "json", "console":
	default:
		l.configErr("log.format", "must be json or console, not %q", cfg.Log.Format)
	}
	l.checkClientIdentity(cfg)
	l.checkAuthDefaults(cfg)
	l.checkResolver(&cfg.Server)
	l.checkRedis(cfg)
	l.hasRedis = cfg.Server.Redis != nil
}

// checkListenHost accepts an IP address or a host name to listen on.
func checkListenHost(h string) string {
	switch {
	case h == "":
		return "must not be empty (write 0.0.0.0 to listen on every interface)"
	case net.ParseIP(h) != nil:
		return ""
	case strings.Contains(h, ":"):
		return fmt.Sprintf("%q must be an IP address or host name without a port (set server.port)", h)
	case !validHostname(h):
		return fmt.Sprintf("%q is not an IP address or host name", h)
	}
	return ""
}

// checkChunkedMode accepts the two modes of SPEC 7.
func checkChunkedMode(m string) string {
	if m == ChunkedNormalize || m == ChunkedPassthrough {
		return ""
	}
	return fmt.Sprintf("must be %s or %s, not %q", ChunkedNormalize, ChunkedPassthrough, m)
}

// checkServedPath accepts a path the gateway answers itself (/health, /metrics). It is
// compared with the normalized request path, so it must be normalized too.
func checkServedPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		return fmt.Sprintf("must start with /, not %q", p)
	}
	return checkNormalizedPath(p)
}

// checkNormalizedPath refuses what request paths never contain once normalized (SPEC 2
// matching): such a prefix or path could never match.
func checkNormalizedPath(p string) string {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == 0x7f {
			return fmt.Sprintf("%q must not contain spaces or control characters (percent-encode them)", p)
		}
	}
	if strings.ContainsAny(p, "?#") {
		return fmt.Sprintf("%q must be a path, without query or fragment", p)
	}
	if strings.Contains(p, "//") {
		return fmt.Sprintf(`%q must not contain "//": request paths are matched after repeated slashes are merged`, p)
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return fmt.Sprintf(`%q must not contain "." or ".." segments: request paths are matched after they are removed`, p)
		}
	}
	return checkPercentEncoding(p)
}

// validHostname reports whether h is a DNS host name (or an IPv4 address, which has the
// same shape). Underscores are accepted: container and service-discovery names use them.
func validHostname(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// checkRouteHost accepts an exact host name or a wildcard *.example.com (SPEC 2).
func checkRouteHost(h string) string {
	const shape = "must be a host name such as api.example.com or a wildcard such as *.example.com"
	switch {
	case h == "":
		return "must not be empty (remove the key to match every host)"
	case strings.HasPrefix(h, "["):
		return fmt.Sprintf("%q: IPv6 literal hosts are not supported (remove the key to match every host)", h)
	case strings.Contains(h, ":"):
		return fmt.Sprintf("%q must not have a port: the port of the Host header is ignored when matching", h)
	case strings.HasPrefix(h, "*."):
		if rest := h[2:]; strings.Contains(rest, "*") || !validHostname(rest) {
			return fmt.Sprintf("%q %s", h, shape)
		}
	case strings.Contains(h, "*"):
		return fmt.Sprintf("%q: a wildcard must be the whole first label, as in *.example.com", h)
	case !validHostname(h):
		return fmt.Sprintf("%q %s", h, shape)
	}
	return ""
}

// checkTarget accepts http://host:port or https://host:port and nothing more: Toron
// forwards the request's own path and query (no rewriting, SPEC 11), and credentials do not
// belong in a configuration file that -check prints.
func checkTarget(t string) string {
	u, err := url.Parse(t)
	switch {
	case err != nil:
		return fmt.Sprintf("%q is not a URL: %v", t, unwrapURLError(err))
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("%q must start with http:// or https://", t)
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("%q must name a host and port, as in http://10.0.0.5:8080", t)
	case u.User != nil:
		return fmt.Sprintf("%q must not contain user information", u.Redacted())
	case u.Port() == "":
		return fmt.Sprintf("%q must have an explicit port, as in %s://%s:%s", t, u.Scheme, u.Host, map[string]string{"http": "80", "https": "443"}[u.Scheme])
	case u.Path != "" || u.RawPath != "":
		return fmt.Sprintf("%q must not have a path (not even /): the request's path is forwarded as it is", t)
	case u.RawQuery != "" || u.ForceQuery:
		return fmt.Sprintf("%q must not have a query: the request's query is forwarded as it is", t)
	case u.Fragment != "":
		return fmt.Sprintf("%q must not have a fragment", t)
	}
	if port, err := strconv.Atoi(u.Port()); err != nil || port < 1 || port > 65535 {
		return fmt.Sprintf("%q: the port must be between 1 and 65535", t)
	}
	return ""
}

// unwrapURLError drops the *url.Error wrapper, which repeats the URL.
func unwrapURLError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

// checkMethod accepts an uppercase HTTP method token (RFC 9110 5.6.2). Lower case is refused
// rather than folded: methods are case-sensitive, and "get" would never match a GET.
func checkMethod(m string) string {
	if m == "" {
		return "a method must not be empty"
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c >= 'a' && c <= 'z' {
			return fmt.Sprintf("%q must be upper case (methods are case-sensitive)", m)
		}
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Sprintf("%q is not an HTTP method token", m)
		}
	}
	return ""
}

// checkRoutes validates every route, fills in default names and lower-cases hosts, then
// checks names and matching ties across the table. cfg.Routes[i] is routes[i].Route after
// resolve, so Effective is available.
func (l *loader) checkRoutes(cfg *Config, routes []routeInput) {
	for i := range routes {
		in := &routes[i]
		r := &cfg.Routes[i]
		if !in.mapping {
			continue
		}
		bad := func(key, format string, args ...any) {
			if !in.failed[key] {
				l.errs.add(l.routesName, i, in.rawPrefix, key, format, args...)
			}
		}
		l.checkRoute(r, in, bad)
		checkRouteAuth(cfg, r, bad)
		r.Host = strings.ToLower(r.Host)
		if !in.present["name"] {
			r.Name = defaultName(r)
		}
	}

	// Names label metrics and key bulkhead counters across reloads (SPEC 4): they must be
	// unique. Two default names can only be equal for routes that also tie, which is
	// reported below, so only clashes involving an explicit name are reported here.
	byName := make(map[string]int)
	for i := range routes {
		name := cfg.Routes[i].Name
		if j, dup := byName[name]; dup && (routes[i].present["name"] || routes[j].present["name"]) {
			l.errs.add(l.routesName, i, routes[i].rawPrefix, "name", "%q is already the name of routes[%d] (%s)", name, j, cfg.Routes[j].Prefix)
			continue
		}
		byName[name] = i
	}

	// A tie left after the matching rules (SPEC 2) is a configuration error: host and prefix
	// equal, and method sets that overlap (a route without methods only ties with another
	// route without methods, since a listed method wins over "all").
	for i := range cfg.Routes {
		a := &cfg.Routes[i]
		if a.Prefix == "" {
			continue
		}
		for j := range i {
			b := &cfg.Routes[j]
			if a.Host != b.Host || a.Prefix != b.Prefix {
				continue
			}
			where := "same prefix"
			if a.Host != "" {
				where = "same host " + a.Host + " and prefix"
			}
			switch {
			case len(a.Methods) == 0 && len(b.Methods) == 0:
				l.errs.add(l.routesName, i, routes[i].rawPrefix, "prefix", "ties with routes[%d] (%s): %s, and both allow every method; give one of them a host or methods", j, b.Prefix, where)
			case len(a.Methods) > 0 && len(b.Methods) > 0:
				if common := intersect(a.Methods, b.Methods); len(common) > 0 {
					l.errs.add(l.routesName, i, routes[i].rawPrefix, "methods", "ties with routes[%d] (%s): %s, and both list %s", j, b.Prefix, where, strings.Join(common, ","))
				}
			}
		}
	}
}

// checkRoute validates one route's own keys.
func (l *loader) checkRoute(r *Route, in *routeInput, bad func(key, format string, args ...any)) {
	switch {
	case !in.present["type"]:
		bad("type", "is required (%s or %s)", RouteTypeUpstream, RouteTypeRedirect)
	case r.Type != RouteTypeUpstream && r.Type != RouteTypeRedirect:
		bad("type", "unknown route type %q: the types are %s and %s", r.Type, RouteTypeUpstream, RouteTypeRedirect)
	}
	switch {
	case !in.present["prefix"]:
		bad("prefix", "is required (a path such as /api; / matches every path)")
	case !strings.HasPrefix(r.Prefix, "/"):
		bad("prefix", "%q must start with /", r.Prefix)
	default:
		if msg := checkNormalizedPath(r.Prefix); msg != "" {
			bad("prefix", "%s", msg)
		}
	}
	if r.Type != RouteTypeRedirect {
		l.checkTargets(r, in, bad)
	}
	checkTrafficRoute(r, in, bad)
	if in.present["host"] {
		if msg := checkRouteHost(r.Host); msg != "" {
			bad("host", "%s", msg)
		}
	}
	if in.present["methods"] {
		if len(r.Methods) == 0 {
			bad("methods", "must list at least one method (remove the key to allow every method)")
		}
		for i, m := range r.Methods {
			if msg := checkMethod(m); msg != "" {
				bad("methods", "%s", msg)
			} else if slices.Contains(r.Methods[:i], m) {
				bad("methods", "lists %s twice", m)
			}
		}
	}
	if in.present["name"] {
		switch r.Name {
		case "":
			bad("name", "must not be empty (remove the key for the default host + prefix + methods)")
		case NoRouteName:
			bad("name", "%q is reserved for requests that match no route", NoRouteName)
		}
	}

	for _, s := range []struct {
		key string
		n   *int64
	}{
		{"max_body_bytes", r.MaxBodyBytes},
		{"min_progress_bytes", r.MinProgressBytes},
	} {
		if s.n != nil && *s.n < 0 {
			bad(s.key, "must not be negative, not %d", *s.n)
		}
	}
	for _, d := range []struct {
		key string
		d   *time.Duration
	}{
		{"read_timeout", r.ReadTimeout},
		{"write_timeout", r.WriteTimeout},
		{"response_header_timeout", r.ResponseHeaderTimeout},
		{"connect_timeout", r.ConnectTimeout},
	} {
		switch {
		case d.d == nil:
		case *d.d < 0:
			bad(d.key, "must not be negative, not %s", *d.d)
		case *d.d == 0:
			bad(d.key, "must be greater than 0: %s", zeroMeans[d.key])
		default:
			if msg := checkDurationBound(d.key, *d.d); msg != "" {
				bad(d.key, "%s", msg)
			}
		}
	}
	if r.InboundChunkedMode != nil {
		if msg := checkChunkedMode(*r.InboundChunkedMode); msg != "" {
			bad("inbound_chunked_mode", "%s", msg)
		}
	}
	if r.MaxConcurrency != nil && *r.MaxConcurrency < 1 {
		bad("max_concurrency", "must be at least 1, not %d (remove the key for no limit, or the guardrail's on an elevated route)", *r.MaxConcurrency)
	}
	if r.MaxUpstreamConns != nil && *r.MaxUpstreamConns < 1 {
		bad("max_upstream_conns", "must be at least 1, not %d (remove the key for max_concurrency, else %d)", *r.MaxUpstreamConns, DefaultMaxUpstreamConns)
	}
	checkRouteTLS(r, in, bad)
	if r.StreamRequestBody != nil && !*r.StreamRequestBody && r.Effective.MaxBodyBytes > MaxBufferedBodyBytes {
		bad("stream_request_body", "false buffers every body in memory, which is refused with max_body_bytes above %d (8 MiB): it is %d here; remove the key to stream large bodies", MaxBufferedBodyBytes, r.Effective.MaxBodyBytes)
	}
	checkRateLimit(r, l.hasRedis, bad)
	checkTunnelRoute(r, in, bad)
}

// defaultName is host + prefix, then a space and the methods when the route lists some:
// "api.example.com/api", "/api", "/api GET,POST".
func defaultName(r *Route) string {
	name := r.Host + r.Prefix
	if len(r.Methods) > 0 {
		name += " " + strings.Join(r.Methods, ",")
	}
	return name
}

// intersect returns the methods a and b have in common, in a's order.
func intersect(a, b []string) []string {
	var out []string
	for _, m := range a {
		if slices.Contains(b, m) {
			out = append(out, m)
		}
	}
	return out
}
