package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/valyala/fasthttp"
)

// Test keys, generated once per test binary: RSA generation is slow.
var (
	keysOnce sync.Once
	rsaA     *rsa.PrivateKey
	rsaB     *rsa.PrivateKey
	ecKey    *ecdsa.PrivateKey
)

func testKeys(t testing.TB) {
	t.Helper()
	keysOnce.Do(func() {
		var err error
		if rsaA, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if rsaB, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
	})
}

var b64 = base64.RawURLEncoding

// sign makes a token with method m, key key, header kid and claims c.
func sign(t testing.TB, m jwt.SigningMethod, kid string, key any, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// claims are valid claims for issuer "https://idp.test" and audience "api", expiring in an hour.
func claims(extra map[string]any) jwt.MapClaims {
	c := jwt.MapClaims{"iss": "https://idp.test", "aud": "api", "sub": "alice",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// writeFile writes data to a file in a temporary directory and returns its path.
func writeFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// input is a request's Input with the given headers (name, value pairs).
func input(kv ...string) *Input {
	h := &fasthttp.RequestHeader{}
	h.SetMethod("GET")
	h.SetRequestURI("/app/page?x=1")
	h.SetHost("app.test")
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &Input{Header: h, ClientIP: netip.MustParseAddr("192.0.2.7"), Scheme: "https"}
}

// closedAtEnd is a checker just made by its New function: the test fails at once when err is
// not nil, and the checker is closed when the test ends.
func closedAtEnd[C interface{ Close() }](t testing.TB, c C, err error) C {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
