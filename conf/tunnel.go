package conf

import (
	"fmt"
	"strings"
	"time"
)

// WebSocket tunnels (SPEC 15) and path rewriting (SPEC 16): defaults, resolution, validation
// and the -check examples. The gateway applies them (gateway/tunnel.go, gateway/rewrite.go).

const (
	// DefaultMaxTunnels bounds the open tunnels of a websocket route: an idle tunnel costs no
	// worker but a socket pair, two goroutines and a few KiB, so 1024 per route keeps a flood
	// of upgrades from exhausting file descriptors long before max_connections.
	DefaultMaxTunnels = 1024
	// DefaultTunnelIdleTimeout closes a tunnel silent in both directions for a minute: browsers
	// and WebSocket libraries ping every 20-30s (nginx's proxy_read_timeout is 60s too), so only
	// a dead peer stays silent that long.
	DefaultTunnelIdleTimeout = 60 * time.Second
)

// RewriteExample is one path before and after a route's rewriting, shown by -check.
type RewriteExample struct {
	Before string `json:"before"`
	After  string `json:"after"`
}

// resolveTunnel fills the tunnel and rewriting fields of a route's Effective.
func resolveTunnel(r *Route, e *Effective) {
	e.Websocket = r.Websocket
	if r.Websocket {
		e.MaxTunnels = deref(r.MaxTunnels, DefaultMaxTunnels)
		e.TunnelIdleTimeout = deref(r.TunnelIdleTimeout, DefaultTunnelIdleTimeout)
	}
	e.StripPrefix = r.StripPrefix
	e.AddPrefix = r.AddPrefix
	if r.StripPrefix || r.AddPrefix != "" {
		e.RewriteExamples = rewriteExamples(r.Prefix, r.StripPrefix, r.AddPrefix)
	}
}

// rewriteExamples shows the rewrite on the prefix itself and on a path below it, with a query.
func rewriteExamples(prefix string, strip bool, add string) []RewriteExample {
	below := strings.TrimSuffix(prefix, "/") + "/example"
	paths := []string{prefix, below + "?q=1"}
	out := make([]RewriteExample, 0, len(paths))
	for _, p := range paths {
		path, query, hasQuery := strings.Cut(p, "?")
		after := RewritePath(prefix, strip, add, path)
		if hasQuery {
			after += "?" + query
		}
		out = append(out, RewriteExample{Before: p, After: after})
	}
	return out
}

// RewritePath returns the path forwarded for the normalized request path path, which matched
// prefix (SPEC 16): with strip the prefix is removed at its segment boundary (the result always
// starts with "/": /api on /api forwards /), then add is prepended (/legacy stripped and
// prefixed with /v1 forwards /v1). It is the reference for the gateway's allocation-free
// version, which its tests compare against.
func RewritePath(prefix string, strip bool, add, path string) string {
	rest := path
	if strip {
		rest = path[len(StrippedPrefix(prefix)):]
	}
	switch {
	case add != "":
		return add + rest
	case rest == "":
		return "/"
	}
	return rest
}

// StrippedPrefix is what strip_prefix removes from a path that matched prefix, and the value of
// X-Forwarded-Prefix: the prefix without its trailing "/" ("" for the prefix "/").
func StrippedPrefix(prefix string) string { return strings.TrimSuffix(prefix, "/") }

// checkTunnelRoute validates the tunnel and rewriting keys of one route.
func checkTunnelRoute(r *Route, in *routeInput, bad func(key, format string, args ...any)) {
	if !r.Websocket {
		for _, key := range []string{"max_tunnels", "tunnel_idle_timeout"} {
			if in.present[key] {
				bad(key, "only applies with websocket: true (set it, or remove this key)")
			}
		}
	}
	if r.MaxTunnels != nil && *r.MaxTunnels < 1 {
		bad("max_tunnels", "must be at least 1, not %d (remove the key for %d)", *r.MaxTunnels, DefaultMaxTunnels)
	}
	if d := r.TunnelIdleTimeout; d != nil {
		switch {
		case *d < 0:
			bad("tunnel_idle_timeout", "must not be negative, not %s", *d)
		case *d == 0:
			bad("tunnel_idle_timeout", "must be greater than 0: a dead peer would hold its tunnel forever (remove the key for %s)", formatDuration(DefaultTunnelIdleTimeout))
		default:
			if msg := checkDurationBound("tunnel_idle_timeout", *d); msg != "" {
				bad("tunnel_idle_timeout", "%s", msg) // bounds.go
			}
		}
	}
	if in.present["add_prefix"] {
		if msg := checkAddPrefix(r.AddPrefix); msg != "" {
			bad("add_prefix", "%s", msg)
		}
	}
}

// checkAddPrefix accepts a path prefix to prepend: it starts with "/", does not end with one
// (the forwarded path brings its own), and has no "." or ".." segment, which an upstream would
// resolve to somewhere else than the operator wrote.
func checkAddPrefix(p string) string {
	switch {
	case p == "":
		return "must not be empty (remove the key to add nothing)"
	case !strings.HasPrefix(p, "/"):
		return fmt.Sprintf("%q must start with /", p)
	case strings.HasSuffix(p, "/"):
		return fmt.Sprintf("%q must not end with / (write %q: the forwarded path starts with its own /)", p, strings.TrimRight(p, "/"))
	}
	return checkNormalizedPath(p)
}

// tunnelWarnings warns about a strip_prefix that removes nothing.
func tunnelWarnings(c *Config) []string {
	var out []string
	for i := range c.Routes {
		r := &c.Routes[i]
		if r.StripPrefix && StrippedPrefix(r.Prefix) == "" {
			out = append(out, fmt.Sprintf("routes[%d] (%s): strip_prefix has no effect on the prefix /", i, r.Prefix))
		}
	}
	return out
}
