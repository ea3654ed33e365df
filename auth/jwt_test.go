package auth

import (
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/valyala/fasthttp"

	"toron/internal/testnet"
)

// fileJWT is a JWT over a JWKS file holding rsaA as "a" and ecKey as "e".
func fileJWT(t testing.TB, o JWTOptions) *JWT {
	t.Helper()
	testKeys(t)
	o.JWKSFile = writeFile(t, "jwks.json", testnet.JWKS(testnet.RSAJWK("a", rsaA), testnet.ECJWK("e", ecKey)))
	if o.Algorithms == nil {
		o.Algorithms = []string{"RS256", "ES256"}
	}
	if o.Issuer == "" {
		o.Issuer = "https://idp.test"
	}
	if o.Audience == nil {
		o.Audience = []string{"api", "other"}
	}
	return newJWT(t, o)
}

// newJWT is NewJWT(o), which must succeed, closed when the test ends.
func newJWT(t testing.TB, o JWTOptions) *JWT {
	t.Helper()
	j, err := NewJWT(o)
	return closedAtEnd(t, j, err)
}

func bearer(tok string) *Input { return input("Authorization", "Bearer "+tok) }

func TestJWTAcceptsAndRefuses(t *testing.T) {
	j := fileJWT(t, JWTOptions{Leeway: 30 * time.Second})
	now := time.Now()
	pubDER, err := x509.MarshalPKIXPublicKey(&rsaA.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	none := sign(t, jwt.SigningMethodNone, "a", jwt.UnsafeAllowNoneSignatureType, claims(nil))
	cases := []struct {
		name string
		tok  string
		want Outcome
	}{
		{"RS256", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(nil)), Pass},
		{"ES256", sign(t, jwt.SigningMethodES256, "e", ecKey, claims(nil)), Pass},
		{"aud list holding one allowed", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"aud": []string{"x", "other"}})), Pass},
		{"expired within leeway", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"exp": now.Add(-10 * time.Second).Unix()})), Pass},
		{"expired", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"exp": now.Add(-2 * time.Minute).Unix()})), Unauthorized},
		{"not yet valid", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"nbf": now.Add(2 * time.Minute).Unix()})), Unauthorized},
		{"nbf within leeway", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"nbf": now.Add(10 * time.Second).Unix()})), Pass},
		{"wrong issuer", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"iss": "https://evil.test"})), Unauthorized},
		{"wrong audience", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"aud": "billing"})), Unauthorized},
		{"no audience", sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"aud": nil})), Unauthorized},
		{"alg none", none, Unauthorized},
		{"alg none without kid", sign(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, claims(nil)), Unauthorized},
		// The classic algorithm confusion: HS256 "signed" with the RSA public key as the secret.
		{"HS256 with the RSA public key (PEM)", sign(t, jwt.SigningMethodHS256, "a", pubPEM, claims(nil)), Unauthorized},
		{"HS256 with the RSA public key (DER)", sign(t, jwt.SigningMethodHS256, "a", pubDER, claims(nil)), Unauthorized},
		{"RS384 not in the list", sign(t, jwt.SigningMethodRS384, "a", rsaA, claims(nil)), Unauthorized},
		{"RS256 on the EC kid", sign(t, jwt.SigningMethodRS256, "e", rsaA, claims(nil)), Unauthorized},
		{"unknown kid", sign(t, jwt.SigningMethodRS256, "zz", rsaA, claims(nil)), Unauthorized},
		{"signed by another key", sign(t, jwt.SigningMethodRS256, "a", rsaB, claims(nil)), Unauthorized},
		{"garbage", "not.a.token", Unauthorized},
	}
	for _, c := range cases {
		v := j.Check(bearer(c.tok))
		if v.Outcome != c.want {
			t.Errorf("%s: %v, want outcome %d", c.name, v, c.want)
			continue
		}
		if c.want == Unauthorized && (v.Status != 401 || v.Challenge != `Bearer error="invalid_token"` ||
			string(v.Body) != `{"error":"401 Unauthorized: Invalid token"}`) {
			t.Errorf("%s: 401 verdict %+v", c.name, v)
		}
	}
	v := j.Check(input())
	if v.Outcome != Unauthorized || v.Challenge != "Bearer" || string(v.Body) != `{"error":"401 Unauthorized: Bearer token required"}` {
		t.Errorf("no token: %+v", v)
	}
}

func TestJWTHMACNeverWithPublicKeyEvenWhenAllowed(t *testing.T) {
	// Even with HS256 in the list, an RSA kid cannot verify an HMAC token.
	j := fileJWT(t, JWTOptions{Algorithms: []string{"RS256", "HS256"}})
	pubDER, _ := x509.MarshalPKIXPublicKey(&rsaA.PublicKey)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	for _, secret := range [][]byte{pubPEM, pubDER, rsaA.N.Bytes()} {
		if v := j.Check(bearer(sign(t, jwt.SigningMethodHS256, "a", secret, claims(nil)))); v.Outcome != Unauthorized {
			t.Errorf("HS256 with the public key's bytes: %v", v)
		}
	}
	// An oct key does verify HS256.
	secret := []byte(strings.Repeat("k", 32))
	hs := newJWT(t, JWTOptions{JWKSFile: writeFile(t, "oct.json", testnet.JWKS(map[string]string{"kty": "oct", "kid": "h", "k": b64.EncodeToString(secret)})),
		Algorithms: []string{"HS256"}})
	if v := hs.Check(bearer(sign(t, jwt.SigningMethodHS256, "h", secret, claims(nil)))); v.Outcome != Pass {
		t.Errorf("HS256 with its oct key: %v", v)
	}
}

func TestJWTRefusesNoneInOptions(t *testing.T) {
	testKeys(t)
	for _, algs := range [][]string{{"none"}, {"RS256", "None"}, {}, {"XS256"}} {
		_, err := NewJWT(JWTOptions{JWKSFile: writeFile(t, "k.json", testnet.JWKS(testnet.RSAJWK("a", rsaA))), Algorithms: algs})
		if err == nil {
			t.Errorf("algorithms %q accepted", algs)
		}
	}
}

func TestJWTCacheUntilExp(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	j := fileJWT(t, JWTOptions{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	exp := time.Unix(0, clock.Load()).Add(2 * time.Minute)
	tok := sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{"exp": exp.Unix()}))
	for range 10 {
		if v := j.Check(bearer(tok)); v.Outcome != Pass {
			t.Fatal(v)
		}
	}
	if n := j.Verifies(); n != 1 {
		t.Errorf("verified %d times, want 1 (cached)", n)
	}
	clock.Store(exp.Add(time.Second).UnixNano())
	if v := j.Check(bearer(tok)); v.Outcome != Unauthorized {
		t.Errorf("cached token past its exp: %v", v)
	}
	// A token differing in one byte is never served from the cache.
	if v := j.Check(bearer(tok[:len(tok)-2] + "AA")); v.Outcome != Unauthorized {
		t.Errorf("tampered token: %v", v)
	}
}

func TestJWTClaimsToHeadersAndCookie(t *testing.T) {
	j := fileJWT(t, JWTOptions{From: "cookie:session", ClaimsToHeaders: map[string]string{
		"sub": "X-User", "tier": "X-Tier", "groups": "X-Groups", "evil": "X-Evil"}})
	tok := sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(map[string]any{
		"tier": 12345678901234, "groups": []string{"a"}, "evil": "a\r\nX-Admin: 1"}))
	in := input("Cookie", "session="+tok+"; other=1", "X-User", "forged", "X-Groups", "forged", "Authorization", "Bearer junk")
	v := j.Check(in)
	if v.Outcome != Pass {
		t.Fatal(v)
	}
	j.Prepare(in.Header, &v)
	h := in.Header
	if got := string(h.Peek("X-User")); got != "alice" {
		t.Errorf("X-User = %q", got)
	}
	if got := string(h.Peek("X-Tier")); got != "12345678901234" {
		t.Errorf("X-Tier = %q (a number claim)", got)
	}
	if got := h.Peek("X-Groups"); got != nil {
		t.Errorf("X-Groups = %q: a list claim sets nothing and the forged copy must go", got)
	}
	if got := h.Peek("X-Evil"); got != nil {
		t.Errorf("X-Evil = %q", got)
	}
	// ForwardToken is false: the token's cookie goes, the others stay.
	if len(h.Cookie("session")) != 0 || string(h.Cookie("other")) != "1" {
		t.Errorf("cookies forwarded: %q", h.Peek(fasthttp.HeaderCookie))
	}
}

func TestJWTForwardTokenFalseRemovesIt(t *testing.T) {
	j := fileJWT(t, JWTOptions{ForwardToken: false})
	in := bearer(sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(nil)))
	v := j.Check(in)
	j.Prepare(in.Header, &v)
	if v.Outcome != Pass || len(in.Header.Peek("Authorization")) != 0 {
		t.Errorf("%v, Authorization %q", v, in.Header.Peek("Authorization"))
	}
	k := fileJWT(t, JWTOptions{ForwardToken: true})
	in = bearer(sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(nil)))
	v = k.Check(in)
	k.Prepare(in.Header, &v)
	if v.Outcome != Pass || len(in.Header.Peek("Authorization")) == 0 {
		t.Errorf("forward_token true: %v, Authorization %q", v, in.Header.Peek("Authorization"))
	}
}

// jwksServer serves a JWK Set that the test can change, on a loopback listener.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	status  int
	fetches atomic.Int64
}

func newJWKSServer(t *testing.T, body []byte) *jwksServer {
	s := &jwksServer{body: body, status: 200}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		body, status := s.body, s.status
		s.mu.Unlock()
		w.WriteHeader(status)
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(status int, body []byte) {
	s.mu.Lock()
	s.status, s.body = status, body
	s.mu.Unlock()
}

func TestJWKSURLRotationAndLastGoodKeys(t *testing.T) {
	testKeys(t)
	srv := newJWKSServer(t, testnet.JWKS(testnet.RSAJWK("a", rsaA)))
	var errs atomic.Int64
	j := newJWT(t, JWTOptions{JWKSURL: srv.URL + "/jwks", Algorithms: []string{"RS256"},
		UnknownKidInterval: 50 * time.Millisecond, OnError: func(error) { errs.Add(1) }})
	tokA := sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(nil))
	if v := j.Check(bearer(tokA)); v.Outcome != Pass {
		t.Fatalf("key fetched at start: %v", v)
	}
	// Rotation: the IdP adds key b; the first token signed by it finds kid b unknown, causes a
	// fetch and waits for it.
	srv.set(200, testnet.JWKS(testnet.RSAJWK("a", rsaA), testnet.RSAJWK("b", rsaB)))
	time.Sleep(60 * time.Millisecond)
	tokB := sign(t, jwt.SigningMethodRS256, "b", rsaB, claims(nil))
	if v := j.Check(bearer(tokB)); v.Outcome != Pass {
		t.Fatalf("rotated-in kid: %v (fetches %d)", v, srv.fetches.Load())
	}
	// Unknown kids cannot make Toron hammer the IdP: at most one fetch per interval.
	before := srv.fetches.Load()
	start := time.Now()
	for range 20 {
		j.Check(bearer(sign(t, jwt.SigningMethodRS256, "nope", rsaB, claims(map[string]any{"jti": time.Now().String()}))))
	}
	if n, most := srv.fetches.Load()-before, int64(time.Since(start)/(50*time.Millisecond))+2; n > most {
		t.Errorf("%d fetches for 20 unknown-kid tokens in %s, at most %d allowed", n, time.Since(start), most)
	}
	// The IdP fails: the last good keys stay.
	srv.set(500, nil)
	time.Sleep(60 * time.Millisecond)
	j.Check(bearer(sign(t, jwt.SigningMethodRS256, "c", rsaB, claims(nil)))) // causes a failing fetch
	tokB2 := sign(t, jwt.SigningMethodRS256, "b", rsaB, claims(map[string]any{"jti": "2"}))
	if v := j.Check(bearer(tokB2)); v.Outcome != Pass {
		t.Errorf("after a failed fetch: %v", v)
	}
	if errs.Load() == 0 {
		t.Error("the failed fetch was not reported")
	}
}

func TestJWKSURLDownAtStartThenUp(t *testing.T) {
	testKeys(t)
	srv := newJWKSServer(t, nil)
	srv.set(503, nil)
	j := newJWT(t, JWTOptions{JWKSURL: srv.URL, Algorithms: []string{"RS256"}, UnknownKidInterval: 20 * time.Millisecond})
	tok := sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(nil))
	if v := j.Check(bearer(tok)); v.Outcome != Unauthorized {
		t.Errorf("no keys yet: %v", v)
	}
	srv.set(200, testnet.JWKS(testnet.RSAJWK("a", rsaA)))
	time.Sleep(30 * time.Millisecond)
	if v := j.Check(bearer(tok)); v.Outcome != Pass {
		t.Errorf("IdP back: %v", v)
	}
}

func TestParseJWKSRefusesEmptyAndBroken(t *testing.T) {
	testKeys(t)
	for _, doc := range []string{`{}`, `{"keys":[]}`, `not json`, `{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}`,
		`{"keys":[{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}`} {
		if _, err := ParseJWKS([]byte(doc)); err == nil {
			t.Errorf("%s accepted", doc)
		}
	}
	if n, err := ParseJWKS(testnet.JWKS(testnet.RSAJWK("a", rsaA), testnet.ECJWK("e", ecKey), map[string]string{"kty": "RSA", "use": "enc"})); err != nil || n != 2 {
		t.Errorf("good set: %d keys, %v", n, err)
	}
}
