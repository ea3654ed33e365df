package conf

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Access control before the body (SPEC 19): a route's access and auth keys and
// server.auth_defaults. The gateway builds them into toron/auth's checkers (gateway/access.go).

// Access is a route's access key: IP lists on the client IP of SPEC 16, deny first, then, when
// Allow is not empty, the client must be in it.
type Access struct {
	// Allow lists the IP addresses and CIDRs that may use the route; empty means any.
	Allow []string `koanf:"allow" json:"allow"`
	// Deny lists the IP addresses and CIDRs refused, whatever Allow says.
	Deny []string `koanf:"deny" json:"deny"`
}

// Auth is a route's auth key, or server.auth_defaults: exactly one of Basic, JWT and Forward.
// A route may also say auth: default, which Load resolves to a copy of server.auth_defaults.
type Auth struct {
	// Default is true for a route's "auth: default" (never in server.auth_defaults); Load
	// then fills the mechanism from server.auth_defaults and keeps Default set, for -check.
	Default bool `json:"default,omitempty"`
	// Basic is HTTP Basic against an htpasswd file of bcrypt hashes.
	Basic *BasicAuth `json:"basic,omitempty"`
	// JWT is bearer tokens checked against a JWKS.
	JWT *JWTAuth `json:"jwt,omitempty"`
	// Forward asks an external service (nginx auth_request, Traefik forwardAuth).
	Forward *ForwardAuth `json:"forward,omitempty"`
}

// BasicAuth is auth.basic.
type BasicAuth struct {
	// UsersFile is an htpasswd file of bcrypt hashes ($2y$, $2a$, $2b$). Required.
	UsersFile string `json:"users_file"`
	// Realm is the realm of the WWW-Authenticate challenge; default DefaultAuthRealm.
	Realm string `json:"realm"`
}

// JWTAuth is auth.jwt.
type JWTAuth struct {
	// JWKSFile and JWKSURL (exactly one) hold the verification keys.
	JWKSFile string `json:"jwks_file,omitempty"`
	JWKSURL  string `json:"jwks_url,omitempty"`
	// JWKSRefresh is how often JWKSURL is fetched again; default DefaultJWKSRefresh.
	JWKSRefresh time.Duration `json:"jwks_refresh,omitempty"`
	// Issuer, when set, must equal the token's iss.
	Issuer string `json:"issuer,omitempty"`
	// Audience, when set, must hold one of the token's aud values.
	Audience []string `json:"audience,omitempty"`
	// Algorithms is the allow-list of JWS algorithms (JWTAlgorithms); required.
	Algorithms []string `json:"algorithms"`
	// Leeway is the clock skew allowed on exp and nbf; default DefaultJWTLeeway.
	Leeway time.Duration `json:"leeway"`
	// From is JWTFromHeader (default) or "cookie:NAME".
	From string `json:"from"`
	// ClaimsToHeaders maps a claim to the upstream header set from it.
	ClaimsToHeaders map[string]string `json:"claims_to_headers,omitempty"`
	// ForwardToken keeps the token on the upstream request; default true.
	ForwardToken bool `json:"forward_token"`
}

// ForwardAuth is auth.forward.
type ForwardAuth struct {
	// URL is the auth service, http:// or https://. Required.
	URL string `json:"url"`
	// Timeout bounds one call; default DefaultForwardAuthTimeout.
	Timeout time.Duration `json:"timeout"`
	// MaxConcurrency bounds the calls in flight; default DefaultForwardAuthMaxConcurrency.
	MaxConcurrency int `json:"max_concurrency"`
	// RequestHeaders are copied from the request to the subrequest; default
	// DefaultForwardAuthRequestHeaders (the credentials an auth service reads), [] for none.
	RequestHeaders []string `json:"request_headers"`
	// UpstreamHeaders are copied from a 2xx answer to the upstream request.
	UpstreamHeaders []string `json:"upstream_headers,omitempty"`
}

// MarshalJSON encodes the durations as Go duration strings.
func (j JWTAuth) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(j)) }

// MarshalJSON encodes the timeout as a Go duration string.
func (f ForwardAuth) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(f)) }

// Defaults of auth (SPEC 19).
const (
	// AuthDefaultKeyword is the value of a route's "auth: default".
	AuthDefaultKeyword = "default"
	// DefaultAuthRealm is the realm of a basic block that names none.
	DefaultAuthRealm = "toron"
	// DefaultJWKSRefresh is how often a jwks_url is fetched again.
	DefaultJWKSRefresh = 5 * time.Minute
	// DefaultJWTLeeway is the clock skew allowed on exp and nbf.
	DefaultJWTLeeway = 30 * time.Second
	// JWTFromHeader takes the token from Authorization: Bearer; JWTFromCookiePrefix starts
	// "cookie:NAME".
	JWTFromHeader       = "header"
	JWTFromCookiePrefix = "cookie:"
	// DefaultForwardAuthTimeout bounds one call to the auth service.
	DefaultForwardAuthTimeout = 2 * time.Second
	// DefaultForwardAuthMaxConcurrency bounds the calls in flight to the auth service.
	DefaultForwardAuthMaxConcurrency = 64
	// maxJWTLeeway bounds leeway: more than a few minutes of skew is a broken clock, and
	// accepts expired tokens that long.
	maxJWTLeeway = 10 * time.Minute
	// minJWKSRefresh keeps jwks_refresh from turning into a flood against the IdP.
	minJWKSRefresh = 10 * time.Second
)

// DefaultForwardAuthRequestHeaders are the request headers forward auth sends when
// request_headers is not set: the credentials an auth service reads (a bearer token, a session
// cookie), as SPEC 19 writes the block. nginx's auth_request and Traefik's forwardAuth send every
// header; Toron sends only what is named, so a route's other headers never leave for the auth
// service unasked.
var DefaultForwardAuthRequestHeaders = []string{"Authorization", "Cookie"}

// JWTAlgorithms are the JWS algorithms algorithms may list. "none" is never one, and an HMAC
// algorithm only verifies with a JWKS key of kty "oct", never with a public key.
var JWTAlgorithms = []string{
	"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
	"ES256", "ES384", "ES512", "EdDSA", "HS256", "HS384", "HS512",
}

// Keys of the auth mappings, with their kinds.
var (
	authSchema        = schema{"basic": kindNested, "jwt": kindNested, "forward": kindNested}
	basicAuthSchema   = schema{"users_file": kindString, "realm": kindString}
	jwtAuthSchema     = schema{"jwks_file": kindString, "jwks_url": kindString, "jwks_refresh": kindDuration, "issuer": kindString, "audience": kindStrings, "algorithms": kindStrings, "leeway": kindDuration, "from": kindString, "claims_to_headers": kindNested, "forward_token": kindBool}
	forwardAuthSchema = schema{"url": kindString, "timeout": kindDuration, "max_concurrency": kindInt, "request_headers": kindStrings, "upstream_headers": kindStrings}
)

// decodeAuth decodes an auth value (a route's auth, server.auth_defaults): "default", or a
// mapping of exactly one mechanism, each strictly typed, with its defaults filled in.
func decodeAuth(v any) (*Auth, error) {
	if s, ok := v.(string); ok {
		if s == AuthDefaultKeyword {
			return &Auth{Default: true}, nil
		}
		return nil, fmt.Errorf("must be %q or a mapping with one of basic, jwt, forward, not %q", AuthDefaultKeyword, s)
	}
	m, ok := asMap(v)
	if !ok || len(m) != 1 {
		what := yamlLiteral(v)
		if ok {
			what = fmt.Sprintf("%d mechanisms", len(m))
		}
		return nil, fmt.Errorf("must hold exactly one of basic, jwt, forward (or be %q), not %s", AuthDefaultKeyword, what)
	}
	a := &Auth{}
	for kind, body := range m {
		switch kind {
		case "basic":
			vals, err := authMapping(kind, body, basicAuthSchema)
			if err != nil {
				return nil, err
			}
			b := &BasicAuth{Realm: DefaultAuthRealm}
			setString(vals, "users_file", &b.UsersFile)
			setString(vals, "realm", &b.Realm)
			a.Basic = b
		case "jwt":
			raw, _ := asMap(body)
			claims, hasClaims := raw["claims_to_headers"]
			if hasClaims {
				raw = maps(raw, "claims_to_headers")
			}
			vals, err := authMapping(kind, raw, jwtAuthSchema)
			if err != nil {
				return nil, err
			}
			j := &JWTAuth{Leeway: DefaultJWTLeeway, From: JWTFromHeader, ForwardToken: true}
			setString(vals, "jwks_file", &j.JWKSFile)
			setString(vals, "jwks_url", &j.JWKSURL)
			setDuration(vals, "jwks_refresh", &j.JWKSRefresh)
			setString(vals, "issuer", &j.Issuer)
			setStrings(vals, "audience", &j.Audience)
			setStrings(vals, "algorithms", &j.Algorithms)
			setDuration(vals, "leeway", &j.Leeway)
			setString(vals, "from", &j.From)
			if b, ok := vals["forward_token"].(bool); ok {
				j.ForwardToken = b
			}
			if j.JWKSURL != "" && j.JWKSRefresh == 0 {
				j.JWKSRefresh = DefaultJWKSRefresh
			}
			if hasClaims {
				cm, ok := asMap(claims)
				if !ok {
					return nil, fmt.Errorf("jwt.claims_to_headers: must be a mapping of claim: Header, not %s", yamlLiteral(claims))
				}
				j.ClaimsToHeaders = make(map[string]string, len(cm))
				for _, c := range sortedKeys(cm) {
					h, ok := cm[c].(string)
					if !ok {
						return nil, fmt.Errorf("jwt.claims_to_headers.%s: must be a header name, not %s", c, yamlLiteral(cm[c]))
					}
					j.ClaimsToHeaders[c] = h
				}
			}
			a.JWT = j
		case "forward":
			vals, err := authMapping(kind, body, forwardAuthSchema)
			if err != nil {
				return nil, err
			}
			f := &ForwardAuth{Timeout: DefaultForwardAuthTimeout, MaxConcurrency: DefaultForwardAuthMaxConcurrency,
				RequestHeaders: slices.Clone(DefaultForwardAuthRequestHeaders)}
			setString(vals, "url", &f.URL)
			setDuration(vals, "timeout", &f.Timeout)
			setInt(vals, "max_concurrency", &f.MaxConcurrency)
			setStrings(vals, "request_headers", &f.RequestHeaders)
			setStrings(vals, "upstream_headers", &f.UpstreamHeaders)
			a.Forward = f
		default:
			return nil, fmt.Errorf("%s: %s", kind, authSchema.unknownKey(kind))
		}
	}
	return a, nil
}

// maps returns m without key.
func maps(m map[string]any, key string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// authMapping types the keys of one mechanism's mapping, prefixing errors with its name.
func authMapping(kind string, v any, sch schema) (map[string]any, error) {
	if v == nil {
		v = map[string]any{}
	}
	m, ok := asMap(v)
	if !ok {
		return nil, fmt.Errorf("%s: must be a mapping with the keys %s, not %s", kind, strings.Join(sch.keys(), ", "), yamlLiteral(v))
	}
	out := make(map[string]any, len(m))
	for _, key := range sortedKeys(m) {
		kd, known := sch[key]
		if !known {
			return nil, fmt.Errorf("%s.%s: %s", kind, key, sch.unknownKey(key))
		}
		val, err := fromYAML(m[key], kd)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", kind, key, err)
		}
		out[key] = val
	}
	return out, nil
}

// setString sets *dst from m[key] when it is there.
func setString(m map[string]any, key string, dst *string) {
	if v, ok := m[key].(string); ok {
		*dst = v
	}
}

// setStrings sets *dst from m[key] when it is there.
func setStrings(m map[string]any, key string, dst *[]string) {
	if v, ok := m[key].([]string); ok {
		*dst = v
	}
}

// checkAuthDefaults validates server.auth_defaults.
func (l *loader) checkAuthDefaults(cfg *Config) {
	a := cfg.Server.AuthDefaults
	if a == nil {
		return
	}
	const key = "server.auth_defaults"
	if a.Default {
		l.configErr(key, "cannot itself be %q: write a basic, jwt or forward block", AuthDefaultKeyword)
		return
	}
	checkAuth(a, func(sub, format string, args ...any) { l.configErr(key, sub+format, args...) })
}

// checkRouteAuth validates a route's access and auth keys, resolving auth: default, and fills
// Effective.Access and Effective.Auth.
func checkRouteAuth(cfg *Config, r *Route, bad func(key, format string, args ...any)) {
	if a := r.Access; a != nil {
		for _, l := range []struct {
			key  string
			list []string
		}{{"access.allow", a.Allow}, {"access.deny", a.Deny}} {
			for i, s := range l.list {
				if _, err := ParsePrefix(strings.TrimSpace(s)); err != nil || strings.TrimSpace(s) != s {
					bad(l.key, "item %d (%q) must be an IP address (10.0.0.5, 2001:db8::1) or a CIDR (10.0.0.0/8, 2001:db8::/32)", i, s)
				}
			}
		}
		if len(a.Allow)+len(a.Deny) > 0 {
			eff := Access{Allow: slices.Clone(a.Allow), Deny: slices.Clone(a.Deny)}
			if eff.Allow == nil {
				eff.Allow = []string{}
			}
			if eff.Deny == nil {
				eff.Deny = []string{}
			}
			r.Effective.Access = &eff
		}
	}
	a := r.Auth
	if a == nil {
		return
	}
	if a.Default {
		d := cfg.Server.AuthDefaults
		if d == nil || d.Default {
			bad("auth", "is %q but server.auth_defaults is not set in the config file: set it, or write a basic, jwt or forward block here", AuthDefaultKeyword)
			return
		}
		eff := *d
		eff.Default = true
		r.Effective.Auth = &eff
		return
	}
	ok := true
	checkAuth(a, func(sub, format string, args ...any) {
		ok = false
		bad("auth", sub+format, args...)
	})
	if ok {
		r.Effective.Auth = a
	}
}

// checkAuth validates one mechanism's values; bad gets a sub-key prefix ("jwt.algorithms: ").
func checkAuth(a *Auth, bad func(sub, format string, args ...any)) {
	switch {
	case a.Basic != nil:
		b := a.Basic
		if b.UsersFile == "" {
			bad("basic.users_file: ", "is required (an htpasswd file of bcrypt hashes: htpasswd -B -c FILE USER)")
		} else if msg := checkUsersFile(b.UsersFile); msg != "" {
			bad("basic.users_file: ", "%s", msg)
		}
		if strings.ContainsAny(b.Realm, "\"\\\r\n") {
			bad("basic.realm: ", "must not hold quotes, backslashes or line breaks, not %q", b.Realm)
		}
	case a.JWT != nil:
		checkJWTAuth(a.JWT, bad)
	case a.Forward != nil:
		f := a.Forward
		if msg := checkAuthURL(f.URL); msg != "" {
			bad("forward.url: ", "%s", msg)
		}
		if f.Timeout <= 0 || f.Timeout > time.Minute {
			bad("forward.timeout: ", "must be greater than 0 and at most 1m, not %s", f.Timeout)
		}
		if f.MaxConcurrency < 1 {
			bad("forward.max_concurrency: ", "must be at least 1, not %d", f.MaxConcurrency)
		}
		checkHeaderNames("forward.request_headers: ", f.RequestHeaders, bad)
		checkHeaderNames("forward.upstream_headers: ", f.UpstreamHeaders, bad)
	}
}

// checkJWTAuth validates auth.jwt.
func checkJWTAuth(j *JWTAuth, bad func(sub, format string, args ...any)) {
	switch {
	case j.JWKSFile == "" && j.JWKSURL == "":
		bad("jwt: ", "needs jwks_file or jwks_url")
	case j.JWKSFile != "" && j.JWKSURL != "":
		bad("jwt: ", "has both jwks_file and jwks_url: keep one")
	case j.JWKSFile != "":
		if msg := checkJWKSFile(j.JWKSFile); msg != "" {
			bad("jwt.jwks_file: ", "%s", msg)
		}
	default:
		if msg := checkAuthURL(j.JWKSURL); msg != "" {
			bad("jwt.jwks_url: ", "%s", msg)
		}
		if j.JWKSRefresh < minJWKSRefresh {
			bad("jwt.jwks_refresh: ", "must be at least %s, not %s", minJWKSRefresh, j.JWKSRefresh)
		}
	}
	if len(j.Algorithms) == 0 {
		bad("jwt.algorithms: ", "is required: list the algorithms your IdP signs with, such as [RS256] (one of %s)", strings.Join(JWTAlgorithms, ", "))
	}
	for _, alg := range j.Algorithms {
		switch {
		case strings.EqualFold(alg, "none"):
			bad("jwt.algorithms: ", "%q is never accepted: an unsigned token proves nothing", alg)
		case !slices.Contains(JWTAlgorithms, alg):
			bad("jwt.algorithms: ", "unknown algorithm %q (known: %s)", alg, strings.Join(JWTAlgorithms, ", "))
		}
	}
	if j.Leeway < 0 || j.Leeway > maxJWTLeeway {
		bad("jwt.leeway: ", "must be between 0 and %s, not %s", maxJWTLeeway, j.Leeway)
	}
	if j.From != JWTFromHeader {
		name, ok := strings.CutPrefix(j.From, JWTFromCookiePrefix)
		if !ok || !isToken(name) {
			bad("jwt.from: ", "must be %s or cookie:NAME, not %q", JWTFromHeader, j.From)
		}
	}
	for _, a := range j.Audience {
		if a == "" {
			bad("jwt.audience: ", "must not hold an empty string")
		}
	}
	headers := make([]string, 0, len(j.ClaimsToHeaders))
	for _, c := range sortedKeys(anyMap(j.ClaimsToHeaders)) {
		headers = append(headers, j.ClaimsToHeaders[c])
	}
	checkHeaderNames("jwt.claims_to_headers: ", headers, bad)
}

// anyMap widens a map[string]string for sortedKeys.
func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// protectedHeaders cannot be set from a claim or an auth service's answer: framing, hop-by-hop
// and the identity headers Toron itself vouches for (SPEC 16).
var protectedHeaders = []string{"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade",
	"proxy-authorization", "proxy-connection", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-prefix", "x-real-ip", "forwarded"}

// checkHeaderNames reports names that are not header names, and protected ones.
func checkHeaderNames(sub string, names []string, bad func(sub, format string, args ...any)) {
	for _, n := range names {
		switch {
		case !isToken(n):
			bad(sub, "%q is not a header name", n)
		case slices.Contains(protectedHeaders, strings.ToLower(n)):
			bad(sub, "%s cannot be named here (framing, hop-by-hop or set by Toron itself)", n)
		}
	}
}

// checkAuthURL checks an auth service's or a JWKS's URL: http:// or https://, with a host.
func checkAuthURL(s string) string {
	if s == "" {
		return "is required"
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return fmt.Sprintf("must be an http:// or https:// URL with a host (no user information), not %q", s)
	}
	return ""
}

// checkUsersFile reads an htpasswd file and reports the first line that is not user:bcrypt.
func checkUsersFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("cannot read %s: %v", path, pathCause(err))
	}
	users := 0
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, "\r")
		if t := strings.TrimSpace(line); t == "" || t[0] == '#' {
			continue
		}
		user, hash, ok := strings.Cut(line, ":")
		if !ok || user == "" {
			return fmt.Sprintf("%s line %d: must be user:bcrypt-hash (htpasswd -B)", path, i+1)
		}
		if !isBcrypt(hash) {
			return fmt.Sprintf("%s line %d: user %q: not a bcrypt hash ($2y$, $2a$ or $2b$); only bcrypt is accepted (htpasswd -B)", path, i+1, user)
		}
		users++
	}
	if users == 0 {
		return fmt.Sprintf("%s has no users", path)
	}
	return ""
}

// isBcrypt reports the shape of a bcrypt hash: $2y$, $2a$ or $2b$, a two-digit cost, 53 more
// characters (the gateway's auth package parses it in full).
func isBcrypt(h string) bool {
	if len(h) != 60 || h[6] != '$' {
		return false
	}
	switch h[:4] {
	case "$2y$", "$2a$", "$2b$":
		return h[4] >= '0' && h[4] <= '3' && h[5] >= '0' && h[5] <= '9'
	}
	return false
}

// checkJWKSFile reads a JWKS file and checks it is a JWK Set with at least one key.
func checkJWKSFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("cannot read %s: %v", path, pathCause(err))
	}
	var doc struct {
		Keys []struct {
			Kty string `json:"kty"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Sprintf("%s is not JSON (offset %d): %v", path, se.Offset, err)
		}
		return fmt.Sprintf("%s is not a JWK Set: %v", path, err)
	}
	for _, k := range doc.Keys {
		switch k.Kty {
		case "RSA", "EC", "OKP", "oct":
			return ""
		}
	}
	return fmt.Sprintf("%s holds no key (a JWK Set {\"keys\": [...]} with kty RSA, EC, OKP or oct)", path)
}

// AuthFiles are the files the configuration's auth blocks read (users files, JWKS files): a
// change to one is a reason to reload under -watch (SPEC 18).
func (c *Config) AuthFiles() []string {
	var out []string
	seen := make(map[string]bool)
	add := func(a *Auth) {
		if a == nil {
			return
		}
		var f string
		switch {
		case a.Basic != nil:
			f = a.Basic.UsersFile
		case a.JWT != nil:
			f = a.JWT.JWKSFile
		}
		if f != "" && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	add(c.Server.AuthDefaults)
	for i := range c.Routes {
		add(c.Routes[i].Auth)
	}
	return out
}
