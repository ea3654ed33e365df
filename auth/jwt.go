package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/valyala/fasthttp"
)

// Defaults and bounds of JWT auth (SPEC 19).
const (
	// DefaultJWTLeeway is the clock skew allowed on exp and nbf.
	DefaultJWTLeeway = 30 * time.Second
	// JWTCacheMaxEntries bounds the verified tokens of one route.
	JWTCacheMaxEntries = 10_000
	// JWTCacheMaxTTL caps how long a verified token is trusted without checking its signature
	// again, whatever its exp: a key removed from the JWKS stops working within it.
	JWTCacheMaxTTL = 10 * time.Minute
	// JWTUnknownKidWait is how long a request whose kid is unknown waits for the JWKS fetch
	// it caused (or found in progress): a key rotated in at the IdP is picked up by the first
	// request that uses it, and an IdP that is slow or down costs a request at most this.
	JWTUnknownKidWait = 500 * time.Millisecond
	// FromHeader takes the token from Authorization: Bearer; FromCookiePrefix starts
	// "cookie:NAME".
	FromHeader       = "header"
	FromCookiePrefix = "cookie:"
)

// Algorithms lists the JWS algorithms a route may allow, by family. "none" is never one.
var Algorithms = []string{
	"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
	"ES256", "ES384", "ES512", "EdDSA", "HS256", "HS384", "HS512",
}

// JWTOptions configures a JWT.
type JWTOptions struct {
	// JWKSFile or JWKSURL (exactly one) hold the verification keys.
	JWKSFile, JWKSURL string
	// JWKSRefresh is how often JWKSURL is fetched again; 0 means DefaultJWKSRefresh.
	JWKSRefresh time.Duration
	// Issuer, when set, must equal the token's iss.
	Issuer string
	// Audience, when not empty, must hold one of the token's aud values.
	Audience []string
	// Algorithms is the allow-list of JWS algorithms (required; see Algorithms).
	Algorithms []string
	// Leeway is the clock skew allowed on exp and nbf; 0 means none (conf defaults it to
	// DefaultJWTLeeway).
	Leeway time.Duration
	// From is FromHeader ("" too) or "cookie:NAME".
	From string
	// ClaimsToHeaders maps a claim to the upstream header set from it (string and number
	// claims); the header is always removed from the client's request first.
	ClaimsToHeaders map[string]string
	// ForwardToken keeps the token on the upstream request; false removes it.
	ForwardToken bool
	// UnknownKidInterval is the least time between fetches caused by unknown kids; 0 means
	// JWKSUnknownKidInterval. For tests.
	UnknownKidInterval time.Duration
	// OnError hears the failed fetches of JWKSURL; nil ignores them.
	OnError func(error)
	// Now is the clock; nil means time.Now. For tests.
	Now func() time.Time
}

// JWT checks bearer tokens: signature by the JWKS key of the token's kid with an allowed
// algorithm, exp and nbf within the leeway, iss and aud. A verified token is cached (by a
// seeded hash, compared in full on a hit) until its exp, at most JWTCacheMaxTTL; a cached token
// is checked against the clock on every hit.
//
// A token whose kid is not in the keys of a jwks_url causes a fetch (at most every
// JWKSUnknownKidInterval) and waits for it at most JWTUnknownKidWait, on the caller's goroutine,
// which holds no worker or slot (see the package doc).
type JWT struct {
	src     *jwksSource
	parser  *jwt.Parser
	allowed map[string]bool
	leeway  time.Duration
	cookie  string
	forward bool
	claims  []claimHeader
	strip   [][]byte
	now     func() time.Time
	// clock says now is the test's clock (JWTOptions.Now), which the cache check reads too;
	// otherwise it takes the request's arrival time (Input.Now).
	clock    bool
	seed     maphash.Seed
	cache    *cache[uint64, *jwtEntry]
	verifies atomic.Int64
}

// claimHeader is one entry of claims_to_headers.
type claimHeader struct {
	claim, header string
}

// jwtEntry is a verified token and the upstream headers it gives, built with the verification.
type jwtEntry struct {
	token    string
	upstream []Field
}

// NewJWT builds a JWT; with a JWKSURL it fetches the keys once (waiting at most
// JWKSStartWait) and keeps refreshing them until Close.
func NewJWT(o JWTOptions) (*JWT, error) {
	if (o.JWKSFile == "") == (o.JWKSURL == "") {
		return nil, errors.New("auth: jwt needs exactly one of jwks_file and jwks_url")
	}
	if len(o.Algorithms) == 0 {
		return nil, errors.New("auth: jwt needs algorithms")
	}
	j := &JWT{allowed: make(map[string]bool), leeway: o.Leeway, forward: o.ForwardToken, now: o.Now, seed: maphash.MakeSeed(),
		cache: newCache[uint64, *jwtEntry](JWTCacheMaxEntries)}
	for _, a := range o.Algorithms {
		if !slices.Contains(Algorithms, a) {
			return nil, fmt.Errorf("auth: jwt algorithm %q is not one of %s", a, strings.Join(Algorithms, ", "))
		}
		j.allowed[a] = true
	}
	switch {
	case o.From == "" || o.From == FromHeader:
	case strings.HasPrefix(o.From, FromCookiePrefix) && len(o.From) > len(FromCookiePrefix):
		j.cookie = o.From[len(FromCookiePrefix):]
	default:
		return nil, fmt.Errorf("auth: jwt from %q: must be header or cookie:NAME", o.From)
	}
	j.clock = j.now != nil
	if j.now == nil {
		j.now = time.Now
	}
	var strip []string
	for claim, header := range o.ClaimsToHeaders {
		header = string(fasthttp.AppendNormalizedHeaderKey(nil, header))
		j.claims = append(j.claims, claimHeader{claim: claim, header: header})
		strip = append(strip, header)
	}
	slices.SortFunc(j.claims, func(a, b claimHeader) int { return strings.Compare(a.header, b.header) })
	slices.Sort(strip)
	j.strip = canonicalNames(strip)
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(o.Algorithms),
		jwt.WithLeeway(o.Leeway),
		jwt.WithJSONNumber(),
		jwt.WithTimeFunc(func() time.Time { return j.now() }),
	}
	if o.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(o.Issuer))
	}
	if len(o.Audience) > 0 {
		opts = append(opts, jwt.WithAudience(o.Audience...))
	}
	j.parser = jwt.NewParser(opts...)
	if o.JWKSFile != "" {
		src, err := fileSource(o.JWKSFile)
		if err != nil {
			return nil, err
		}
		j.src = src
	} else {
		if !strings.HasPrefix(o.JWKSURL, "http://") && !strings.HasPrefix(o.JWKSURL, "https://") {
			return nil, fmt.Errorf("auth: jwks_url %q: must be an http:// or https:// URL", o.JWKSURL)
		}
		j.src = urlSource(o.JWKSURL, o.JWKSRefresh, o.UnknownKidInterval, o.OnError)
	}
	return j, nil
}

// token returns the request's token, nil when it has none.
func (j *JWT) token(h *fasthttp.RequestHeader) []byte {
	if j.cookie != "" {
		return h.Cookie(j.cookie)
	}
	tok, ok := cutScheme(h.Peek(fasthttp.HeaderAuthorization), "bearer")
	if !ok {
		return nil
	}
	return tok
}

// Check decides a request's bearer token.
func (j *JWT) Check(in *Input) Verdict {
	tok := j.token(in.Header)
	if len(tok) == 0 {
		return unauthorized(challengeBearer, bodyTokenRequired)
	}
	now := in.now()
	if j.clock {
		now = j.now()
	}
	key := maphash.Bytes(j.seed, tok)
	if e, ok := j.cache.get(key, now); ok && e.token == string(tok) {
		return Verdict{Upstream: e.upstream}
	}
	e, until, err := j.verify(string(tok), now)
	if err != nil {
		return unauthorized(challengeBearerInvalid, bodyTokenInvalid)
	}
	j.cache.put(key, e, until, now)
	return Verdict{Upstream: e.upstream}
}

// verify checks a token in full and returns its cache entry and how long it may be cached.
func (j *JWT) verify(tok string, now time.Time) (*jwtEntry, time.Time, error) {
	j.verifies.Add(1)
	claims := jwt.MapClaims{}
	if _, err := j.parser.ParseWithClaims(tok, claims, j.keyFor); err != nil {
		return nil, time.Time{}, err
	}
	until := now.Add(JWTCacheMaxTTL)
	if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
		// The cache check (now before until) must agree with the validator's (now at most
		// exp + leeway).
		if t := exp.Add(j.leeway + time.Nanosecond); t.Before(until) {
			until = t
		}
	}
	e := &jwtEntry{token: strings.Clone(tok)}
	for _, c := range j.claims {
		if v, ok := claimValue(claims[c.claim]); ok {
			e.upstream = append(e.upstream, Field{Name: []byte(c.header), Value: []byte(v)})
		}
	}
	return e, until, nil
}

// keyFor is the parser's Keyfunc: the key of the token's kid, when its type fits the token's
// algorithm. Binding the algorithm family to the key type is what refuses the
// algorithm-confusion token (HS256 with an RSA public key's bytes as the HMAC secret).
func (j *JWT) keyFor(t *jwt.Token) (any, error) {
	alg, _ := t.Header["alg"].(string)
	if !j.allowed[alg] {
		return nil, fmt.Errorf("auth: algorithm %q not allowed", alg)
	}
	kid, _ := t.Header["kid"].(string)
	k := j.src.keys.Load().find(kid)
	if k == nil {
		if done := j.src.refreshSoon(j.now()); done != nil {
			w := time.NewTimer(JWTUnknownKidWait)
			select {
			case <-done:
			case <-w.C:
			}
			w.Stop()
			k = j.src.keys.Load().find(kid)
		}
		if k == nil {
			return nil, fmt.Errorf("auth: no key for kid %q", kid)
		}
	}
	if k.alg != "" && k.alg != alg {
		return nil, fmt.Errorf("auth: key %q is for %s, not %s", kid, k.alg, alg)
	}
	if !keyFits(alg, k.key) {
		return nil, fmt.Errorf("auth: key %q cannot verify %s", kid, alg)
	}
	return k.key, nil
}

// keyFits reports whether key is of the type (and curve) algorithm alg verifies with.
func keyFits(alg string, key any) bool {
	switch alg[:2] {
	case "RS", "PS":
		_, ok := key.(*rsa.PublicKey)
		return ok
	case "ES":
		k, ok := key.(*ecdsa.PublicKey)
		if !ok {
			return false
		}
		want := map[string]int{"ES256": 256, "ES384": 384, "ES512": 521}[alg]
		return k.Curve.Params().BitSize == want
	case "Ed":
		_, ok := key.(ed25519.PublicKey)
		return ok
	case "HS":
		_, ok := key.([]byte)
		return ok
	}
	return false
}

// claimValue renders a string or number claim as a header value; other claims (objects,
// lists, booleans) and values with control characters are not set.
func claimValue(v any) (string, bool) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case json.Number:
		s = x.String()
	default:
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return "", false
		}
	}
	return s, true
}

// Prepare removes the client's own copies of the claim headers, sets the verified ones, and
// removes the token when ForwardToken is false.
func (j *JWT) Prepare(h *fasthttp.RequestHeader, v *Verdict) {
	if !j.forward {
		if j.cookie != "" {
			h.DelCookie(j.cookie)
		} else {
			h.Del(fasthttp.HeaderAuthorization)
		}
	}
	setUpstream(h, j.strip, v, false)
}

// Verifies is the number of tokens j has verified in full (cache misses).
func (j *JWT) Verifies() int64 { return j.verifies.Load() }

// Close stops the JWKS refresh of a jwks_url.
func (j *JWT) Close() { j.src.close() }

var _ Checker = (*JWT)(nil)
