package conf

import (
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
)

// Traffic rules (SPEC 20): redirect routes, https_only, header rules, CORS and compression;
// server.tls.http_redirect is decoded with server.tls (conf/tls.go) and checked here. The
// gateway applies them (gateway/traffic.go).

// RouteTypeRedirect is the route type answered at routing with a redirect to To (SPEC 20).
const RouteTypeRedirect = "redirect"

const (
	// DefaultRedirectStatus is 308 Permanent Redirect: SPEC 20's example, and unlike 301 it
	// keeps the method and body of a POST (RFC 9110 15.4.9), so an API client is not turned
	// into a GET.
	DefaultRedirectStatus = 308
	// DefaultCORSMaxAge is how long a browser may cache a preflight answer: 10 minutes, the
	// most Chromium honours (Firefox caps at 24 hours), so a preflight per path is one every
	// 10 minutes, not one per request.
	DefaultCORSMaxAge = 10 * time.Minute
	// DefaultCompressMinBytes mirrors streaming.DefaultCompressMinBytes (conf does not import
	// the leaves): below 1 KiB framing and CPU cost more than the bytes saved.
	DefaultCompressMinBytes = 1024
)

// DefaultCompressEncodings are the codings of compress: true, in order of preference: zstd
// compresses JSON as well as brotli at quality 1 and costs the least CPU, gzip is what every
// client reads (docs/traffic-rules.md has the figures).
var DefaultCompressEncodings = []string{"zstd", "br", "gzip"}

// DefaultCompressTypes are the media types compressed when compress lists none (SPEC 20); a
// wildcard never matches text/event-stream.
var DefaultCompressTypes = []string{"text/*", "application/json", "application/javascript", "application/xml", "image/svg+xml", "application/wasm"}

// Traffic holds a route's traffic rules, each nil or false when the route does not set it.
type Traffic struct {
	// Redirect is set on a type: redirect route: its to and status.
	Redirect *Redirect `json:"redirect,omitempty"`
	// HTTPSOnly redirects requests whose scheme is http to https (308, same host and URI).
	HTTPSOnly bool `json:"https_only,omitempty"`
	// RequestHeaders edit the request forwarded upstream, after Toron's own headers.
	RequestHeaders *HeaderRules `json:"request_headers,omitempty"`
	// ResponseHeaders edit the response sent to the client, after Toron's own headers.
	ResponseHeaders *HeaderRules `json:"response_headers,omitempty"`
	// CORS answers preflights and adds the CORS headers to answers to allowed origins.
	CORS *CORS `json:"cors,omitempty"`
	// Compress compresses responses of compressible types.
	Compress *Compress `json:"compress,omitempty"`
}

// empty reports whether no rule is set.
func (t *Traffic) empty() bool { return reflect.ValueOf(*t).IsZero() }

// Redirect is a redirect route's answer.
type Redirect struct {
	// To is the Location, with {host} {uri} {path} {query} {scheme}. Required.
	To Template `json:"to"`
	// Status is 301, 302, 303, 307 or 308; default DefaultRedirectStatus.
	Status int `json:"status"`
}

// HeaderRules is request_headers or response_headers: remove, then set (replacing every
// field of the name), then add (one more field), each in file order; values may hold
// {client_ip} {request_id} {route} {host}.
type HeaderRules struct {
	Set    []HeaderValue `json:"set,omitempty"`
	Add    []HeaderValue `json:"add,omitempty"`
	Remove []string      `json:"remove,omitempty"`
}

// HeaderValue is one header of a set or add rule.
type HeaderValue struct {
	Name  string   `json:"name"`
	Value Template `json:"value"`
}

// CORS is a route's cors block (SPEC 20).
type CORS struct {
	// AllowOrigins are the origins ("https://app.example.com", scheme://host[:port],
	// compared case-insensitively) allowed, or ["*"]. Required.
	AllowOrigins []string `json:"allow_origins"`
	// AllowMethods are the methods a preflight allows; default the route's methods, else GET,
	// HEAD and POST.
	AllowMethods []string `json:"allow_methods"`
	// AllowHeaders are the request headers a preflight allows; default none beyond the
	// CORS-safelisted ones.
	AllowHeaders []string `json:"allow_headers,omitempty"`
	// ExposeHeaders are the response headers scripts may read.
	ExposeHeaders []string `json:"expose_headers,omitempty"`
	// AllowCredentials lets cookies and credentials through; refused with allow_origins ["*"].
	AllowCredentials bool `json:"allow_credentials"`
	// MaxAge is how long a preflight answer may be cached; default DefaultCORSMaxAge; 0 sends
	// no Access-Control-Max-Age.
	MaxAge time.Duration `json:"max_age"`
}

// AnyOrigin reports whether every origin is allowed.
func (c *CORS) AnyOrigin() bool { return len(c.AllowOrigins) == 1 && c.AllowOrigins[0] == "*" }

// MarshalJSON shows max_age as a Go duration string.
func (c CORS) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(c)) }

// Compress is a route's compress block: compress: true is every default.
type Compress struct {
	// Encodings are zstd, br and gzip in order of preference; default DefaultCompressEncodings.
	Encodings []string `json:"encodings"`
	// MinBytes: a response declaring a shorter Content-Length is not compressed; default 1024.
	MinBytes int64 `json:"min_bytes"`
	// Types are the media types compressed ("application/json", wildcards "text/*");
	// default DefaultCompressTypes.
	Types []string `json:"types"`
}

// HTTPRedirect is server.tls.http_redirect: a second, plaintext listener that redirects every
// request to the TLS listener, except the health path, which it serves (SPEC 20).
type HTTPRedirect struct {
	// Port is the plaintext listener's port, on server.host. Required; cannot change on reload.
	Port int `json:"port"`
	// Status is 301, 302, 303, 307 or 308; default DefaultRedirectStatus.
	Status int `json:"status"`
}

// trafficKeys are the route keys decodeTrafficKey decodes.
var trafficKeys = []string{"to", "status", "https_only", "request_headers", "response_headers", "cors", "compress"}

var (
	headerRulesSchema  = schema{"set": kindNested, "add": kindNested, "remove": kindStrings}
	corsSchema         = schema{"allow_origins": kindStrings, "allow_methods": kindStrings, "allow_headers": kindStrings, "expose_headers": kindStrings, "allow_credentials": kindBool, "max_age": kindDuration}
	compressSchema     = schema{"encodings": kindStrings, "min_bytes": kindSize, "types": kindStrings}
	httpRedirectSchema = schema{"port": kindInt, "status": kindInt}
)

func init() {
	for _, k := range trafficKeys {
		routeSchema[k] = kindNested
	}
}

// forbiddenHeaders cannot be named by header rules (SPEC 20): hop-by-hop headers (SPEC 7),
// the framing headers, and the client-identity headers of SPEC 16, which only Toron writes.
var forbiddenHeaders = map[string]string{
	"connection":         "a hop-by-hop header",
	"keep-alive":         "a hop-by-hop header",
	"proxy-connection":   "a hop-by-hop header",
	"te":                 "a hop-by-hop header",
	"trailer":            "a hop-by-hop header",
	"transfer-encoding":  "a hop-by-hop header that frames the body",
	"upgrade":            "a hop-by-hop header",
	"host":               "the request's authority, which is forwarded as received",
	"content-length":     "it frames the body",
	"x-forwarded-for":    "a client-identity header only Toron writes (SPEC 16)",
	"x-forwarded-proto":  "a client-identity header only Toron writes (SPEC 16)",
	"x-forwarded-host":   "a client-identity header only Toron writes (SPEC 16)",
	"x-forwarded-prefix": "a client-identity header only Toron writes (SPEC 16)",
	"x-real-ip":          "a client-identity header only Toron writes (SPEC 16)",
	"forwarded":          "a client-identity header only Toron writes (SPEC 16)",
}

// decodeTrafficKey decodes and checks the traffic keys of a route into in.Route.Traffic. It
// reports whether key was one of them; errors name the sub-key ("cors.max_age").
func (l *loader) decodeTrafficKey(i int, in *routeInput, key string, v any) bool {
	if !slices.Contains(trafficKeys, key) {
		return false
	}
	bad := func(sub, format string, args ...any) {
		l.errs.add(l.routesName, i, in.rawPrefix, sub, format, args...)
		in.failed[key] = true
	}
	t := &in.Route.Traffic
	switch key {
	case "to":
		s, ok := v.(string)
		if !ok {
			bad(key, "must be a string such as \"https://{host}{uri}\", not %s", yamlLiteral(v))
			break
		}
		tmpl, msg := compileRedirectTo(s)
		if msg != "" {
			bad(key, "%s", msg)
			break
		}
		redirect(t).To = tmpl
	case "status":
		n, err := fromYAML(v, kindInt)
		if err != nil {
			bad(key, "%s", err)
			break
		}
		if msg := checkRedirectStatus(n.(int)); msg != "" {
			bad(key, "%s", msg)
			break
		}
		redirect(t).Status = n.(int)
	case "https_only":
		b, err := fromYAML(v, kindBool)
		if err != nil {
			bad(key, "%s", err)
			break
		}
		t.HTTPSOnly = b.(bool)
	case "request_headers", "response_headers":
		rules := decodeHeaderRules(key, v, bad)
		if key == "request_headers" {
			t.RequestHeaders = rules
		} else {
			t.ResponseHeaders = rules
		}
	case "cors":
		t.CORS = decodeCORS(v, bad)
	case "compress":
		t.Compress = decodeCompress(v, bad)
	}
	if !in.failed[key] {
		in.present[key] = true
	}
	return true
}

func redirect(t *Traffic) *Redirect {
	if t.Redirect == nil {
		t.Redirect = &Redirect{}
	}
	return t.Redirect
}

// compileRedirectTo compiles a redirect target: an absolute http(s) URL or a path on the same
// host, possibly built from placeholders.
func compileRedirectTo(s string) (Template, string) {
	tmpl, err := CompileTemplate(s, redirectPlaceholders)
	if err != nil {
		return Template{}, err.Error()
	}
	if msg := checkHeaderValue(s); msg != "" {
		return Template{}, msg
	}
	switch {
	case strings.HasPrefix(s, "https://"), strings.HasPrefix(s, "http://"), strings.HasPrefix(s, "{scheme}://"):
		rest := s[strings.Index(s, "://")+3:]
		if rest == "" || rest[0] == '/' {
			return Template{}, fmt.Sprintf("%q names no host (write https://{host}{uri} to keep the request's)", s)
		}
		if lit, ok := tmpl.Literal(); ok {
			if _, err := url.Parse(lit); err != nil {
				return Template{}, fmt.Sprintf("%q is not a URL: %v", s, unwrapURLError(err))
			}
		}
	case strings.HasPrefix(s, "//"):
		return Template{}, fmt.Sprintf("%q: a scheme-relative URL is refused, write the scheme (https://...)", s)
	case strings.HasPrefix(s, "/"), strings.HasPrefix(s, "{uri}"), strings.HasPrefix(s, "{path}"):
	default:
		return Template{}, fmt.Sprintf("%q must start with https://, http://, {scheme}:// or / (a path on the same host)", s)
	}
	return tmpl, ""
}

// checkRedirectStatus accepts the redirect statuses of SPEC 20.
func checkRedirectStatus(n int) string {
	switch n {
	case 301, 302, 303, 307, 308:
		return ""
	}
	return fmt.Sprintf("must be 301, 302, 303, 307 or 308, not %d (308 keeps the method, 301 may turn a POST into a GET)", n)
}

// checkHeaderValue refuses bytes no header value may hold (CR, LF, NUL and other controls but
// HTAB): a value with a line break would forge headers of its own.
func checkHeaderValue(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return fmt.Sprintf("%q must not contain control characters or line breaks", s)
		}
	}
	return ""
}

// checkHeaderName accepts a field name rules may name.
func checkHeaderName(name string) string {
	if !isToken(name) {
		return fmt.Sprintf("%q is not a header name (RFC 9110 5.1: a token)", name)
	}
	if why, ok := forbiddenHeaders[strings.ToLower(name)]; ok {
		return fmt.Sprintf("%s cannot be named by header rules: %s", name, why)
	}
	return ""
}

// decodeHeaderRules decodes {set: {Name: value}, add: {Name: value}, remove: [Name]}.
func decodeHeaderRules(key string, v any, bad func(sub, format string, args ...any)) *HeaderRules {
	m, ok := asMap(v)
	if !ok {
		bad(key, "must be a mapping of set, add, remove, not %s", yamlLiteral(v))
		return nil
	}
	rules := &HeaderRules{}
	for _, sub := range sortedKeys(m) {
		path := key + "." + sub
		switch sub {
		case "set", "add":
			vals, ok := asMap(m[sub])
			if !ok {
				bad(path, "must be a mapping of header names to values, such as {X-Env: prod}, not %s", yamlLiteral(m[sub]))
				continue
			}
			var list []HeaderValue
			seen := map[string]string{}
			for _, name := range sortedKeys(vals) {
				if msg := checkHeaderName(name); msg != "" {
					bad(path+"."+name, "%s", msg)
					continue
				}
				if other, dup := seen[strings.ToLower(name)]; dup {
					bad(path+"."+name, "names the same header as %s (names are case-insensitive)", other)
					continue
				}
				seen[strings.ToLower(name)] = name
				s, ok := vals[name].(string)
				if !ok {
					bad(path+"."+name, "must be a string, not %s (quote numbers and booleans)", yamlLiteral(vals[name]))
					continue
				}
				if msg := checkHeaderValue(s); msg != "" {
					bad(path+"."+name, "%s", msg)
					continue
				}
				tmpl, err := CompileTemplate(s, headerPlaceholders)
				if err != nil {
					bad(path+"."+name, "%s", err)
					continue
				}
				list = append(list, HeaderValue{Name: name, Value: tmpl})
			}
			if sub == "set" {
				rules.Set = list
			} else {
				rules.Add = list
			}
		case "remove":
			names, err := fromYAML(m[sub], kindStrings)
			if err != nil {
				bad(path, "%s", err)
				continue
			}
			for _, name := range names.([]string) {
				if msg := checkHeaderName(name); msg != "" {
					bad(path, "%s", msg)
					continue
				}
				rules.Remove = append(rules.Remove, name)
			}
		default:
			bad(path, "%s", headerRulesSchema.unknownKey(sub))
		}
	}
	return rules
}

// decodeCORS decodes and checks a cors block; the route-dependent default of allow_methods is
// filled in by resolveTraffic.
func decodeCORS(v any, bad func(sub, format string, args ...any)) *CORS {
	m, ok := decodeMapping("cors", v, corsSchema, bad)
	if !ok {
		return nil
	}
	c := &CORS{MaxAge: DefaultCORSMaxAge}
	strs := func(k string) []string {
		s, _ := m[k].([]string)
		return s
	}
	c.AllowOrigins = strs("allow_origins")
	c.AllowMethods = strs("allow_methods")
	c.AllowHeaders = strs("allow_headers")
	c.ExposeHeaders = strs("expose_headers")
	c.AllowCredentials, _ = m["allow_credentials"].(bool)
	setDuration(m, "max_age", &c.MaxAge)

	if _, given := m["allow_origins"]; !given || len(c.AllowOrigins) == 0 {
		bad("cors.allow_origins", `is required: the origins allowed, such as ["https://app.example.com"], or ["*"]`)
	}
	for j, o := range c.AllowOrigins {
		if o == "*" {
			if len(c.AllowOrigins) > 1 {
				bad("cors.allow_origins", `"*" allows every origin: list it alone`)
			}
			continue
		}
		if msg := checkOrigin(o); msg != "" {
			bad(fmt.Sprintf("cors.allow_origins[%d]", j), "%s", msg)
		}
		c.AllowOrigins[j] = strings.ToLower(o)
	}
	if c.AllowCredentials && c.AnyOrigin() {
		bad("cors.allow_credentials", `true with allow_origins ["*"] is refused: browsers reject credentials for a wildcard origin (Fetch standard), and echoing any origin would hand every site the user's cookies; list the origins`)
	}
	for _, k := range []string{"allow_methods"} {
		for _, meth := range strs(k) {
			if msg := checkMethod(meth); msg != "" {
				bad("cors."+k, "%s", msg)
			}
		}
	}
	for _, k := range []string{"allow_headers", "expose_headers"} {
		for _, h := range strs(k) {
			if h != "*" && !isToken(h) {
				bad("cors."+k, "%q is not a header name", h)
			}
		}
	}
	switch {
	case c.MaxAge < 0:
		bad("cors.max_age", "must not be negative, not %s", c.MaxAge)
	case c.MaxAge%time.Second != 0:
		bad("cors.max_age", "must be whole seconds (Access-Control-Max-Age counts seconds), not %s", c.MaxAge)
	}
	return c
}

// checkOrigin accepts a serialized origin: scheme://host[:port], nothing after.
func checkOrigin(o string) string {
	u, err := url.Parse(o)
	switch {
	case err != nil:
		return fmt.Sprintf("%q is not an origin: %v", o, unwrapURLError(err))
	case u.Scheme == "" || u.Host == "" || u.Opaque != "":
		return fmt.Sprintf("%q must be an origin such as https://app.example.com", o)
	case u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fmt.Sprintf("%q must be scheme://host[:port] only: browsers send the Origin without path (write %s://%s)", o, u.Scheme, u.Host)
	}
	return ""
}

// decodeCompress decodes compress: true, false or {encodings, min_bytes, types}.
func decodeCompress(v any, bad func(sub, format string, args ...any)) *Compress {
	if b, ok := v.(bool); ok {
		if !b {
			return nil
		}
		return &Compress{Encodings: slices.Clone(DefaultCompressEncodings), MinBytes: DefaultCompressMinBytes, Types: slices.Clone(DefaultCompressTypes)}
	}
	m, ok := decodeMapping("compress", v, compressSchema, bad)
	if !ok {
		return nil
	}
	c := &Compress{Encodings: slices.Clone(DefaultCompressEncodings), MinBytes: DefaultCompressMinBytes, Types: slices.Clone(DefaultCompressTypes)}
	if e, ok := m["encodings"].([]string); ok {
		c.Encodings = nil
		if len(e) == 0 {
			bad("compress.encodings", "must list at least one of zstd, br, gzip (write compress: false to turn compression off)")
		}
		for _, name := range e {
			n := strings.ToLower(name)
			switch {
			case !slices.Contains(DefaultCompressEncodings, n):
				bad("compress.encodings", "%q is not one of zstd, br, gzip", name)
			case slices.Contains(c.Encodings, n):
				bad("compress.encodings", "lists %s twice", n)
			default:
				c.Encodings = append(c.Encodings, n)
			}
		}
	}
	if n, ok := m["min_bytes"].(int64); ok {
		if n < 0 {
			bad("compress.min_bytes", "must not be negative, not %d", n)
		}
		c.MinBytes = n
	}
	if ts, ok := m["types"].([]string); ok {
		c.Types = nil
		if len(ts) == 0 {
			bad("compress.types", "must list at least one media type (remove the key for the defaults)")
		}
		for _, t := range ts {
			lt := strings.ToLower(strings.TrimSpace(t))
			major, minor, found := strings.Cut(lt, "/")
			if !found || !isToken(major) || minor != "*" && !isToken(minor) {
				bad("compress.types", "%q is not a media type such as application/json or text/*", t)
				continue
			}
			c.Types = append(c.Types, lt)
		}
	}
	return c
}

// checkTrafficRoute checks what depends on the route's type and other keys.
func checkTrafficRoute(r *Route, in *routeInput, bad func(key, format string, args ...any)) {
	t := &r.Traffic
	if r.Type != RouteTypeRedirect {
		for _, key := range []string{"to", "status"} {
			if in.present[key] {
				bad(key, "only applies with type: %s (set it, or remove this key)", RouteTypeRedirect)
			}
		}
		return
	}
	if !in.present["to"] && !in.failed["to"] {
		bad("to", `is required on a redirect route: the Location, such as "https://{host}{uri}"`)
	}
	// A redirect route is answered at routing: nothing it could forward or edit applies.
	for _, key := range []string{"target", "targets", "balance", "passive_health", "health_check", "retries", "websocket",
		"strip_prefix", "add_prefix", "request_headers", "response_headers", "cors", "compress", "https_only",
		// Answered at step 4, before access (4a), rate limits and auth (6): they would never run.
		"access", "auth", "rate_limit"} {
		if in.present[key] {
			bad(key, "does not apply to a redirect route, which is answered without an upstream (remove it)")
		}
	}
	if t.Redirect != nil && t.Redirect.Status == 0 {
		t.Redirect.Status = DefaultRedirectStatus
	}
}

// resolveTraffic fills the traffic rules of a route's Effective; nil when it has none.
func resolveTraffic(r *Route, e *Effective) {
	if r.Traffic.empty() {
		e.Traffic = nil
		return
	}
	t := r.Traffic
	if t.Redirect != nil {
		rd := *t.Redirect
		if rd.Status == 0 {
			rd.Status = DefaultRedirectStatus
		}
		t.Redirect = &rd
	}
	if t.CORS != nil {
		c := *t.CORS
		if len(c.AllowMethods) == 0 {
			c.AllowMethods = r.Methods
			if len(c.AllowMethods) == 0 {
				c.AllowMethods = []string{"GET", "HEAD", "POST"}
			}
		}
		t.CORS = &c
	}
	e.Traffic = &t
}

// decodeHTTPRedirect decodes server.tls.http_redirect.
func decodeHTTPRedirect(v any) (*HTTPRedirect, *tlsFieldError) {
	m, ok := asMap(v)
	if !ok {
		return nil, &tlsFieldError{"http_redirect", "must be a mapping {port, status}, not " + yamlLiteral(v)}
	}
	h := &HTTPRedirect{Status: DefaultRedirectStatus}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kd, known := httpRedirectSchema[k]
		if !known {
			return nil, &tlsFieldError{"http_redirect." + k, httpRedirectSchema.unknownKey(k)}
		}
		val, err := fromYAML(m[k], kd)
		if err != nil {
			return nil, &tlsFieldError{"http_redirect." + k, err.Error()}
		}
		if k == "port" {
			h.Port = val.(int)
		} else {
			h.Status = val.(int)
		}
	}
	if _, given := m["port"]; !given {
		return nil, &tlsFieldError{"http_redirect.port", "is required: the plaintext port to redirect from, such as 80"}
	}
	return h, nil
}

// checkHTTPRedirect validates server.tls.http_redirect against the server's port.
func (l *loader) checkHTTPRedirect(cfg *Config) {
	t := cfg.Server.TLS
	if t == nil || t.HTTPRedirect == nil {
		return
	}
	h := t.HTTPRedirect
	switch {
	case h.Port < 1 || h.Port > 65535:
		l.configErr("server.tls", "http_redirect.port: must be between 1 and 65535, not %d", h.Port)
	case h.Port == cfg.Server.Port:
		l.configErr("server.tls", "http_redirect.port: must differ from server.port (%d), where TLS is served", h.Port)
	}
	if msg := checkRedirectStatus(h.Status); msg != "" {
		l.configErr("server.tls", "http_redirect.status: %s", msg)
	}
}

// redirectPort is the http_redirect port, 0 without one, for the reload check.
func redirectPort(c *Config) int {
	if c.Server.TLS == nil || c.Server.TLS.HTTPRedirect == nil {
		return 0
	}
	return c.Server.TLS.HTTPRedirect.Port
}
