package demo

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// The demo's access-control routes (SPEC 19): /api/private behind basic auth and /api/token
// behind JWT. Start writes an htpasswd file and a JWKS file holding a fresh ES256 key into a
// temporary directory, and signs a token with that key, valid for an hour; Close removes them.

const (
	// AuthDemoUser and AuthDemoPassword are the basic-auth credential of /api/private, printed
	// in the banner. The users file holds authDemoHash, their bcrypt hash (cost 10).
	AuthDemoUser     = "demo"
	AuthDemoPassword = "demo-password"
	authDemoHash     = "$2a$10$jg/bnlbmcXdL6pyibpgETuY8f07GDz78V9OQLcMfECNyzfdKeTSZ."
	// AuthDemoIssuer and AuthDemoAudience are what the /api/token route requires of a token.
	AuthDemoIssuer   = "https://demo.toron.test"
	AuthDemoAudience = "toron-demo"
	// authDemoKID names the demo key in the JWKS and in the token's header.
	authDemoKID = "demo-es256"
	// authDemoTokenTTL is how long the banner's token is valid.
	authDemoTokenTTL = time.Hour
)

// AuthDemo is the files and credentials of the access-control routes.
type AuthDemo struct {
	// Dir holds UsersFile and JWKSFile; Close removes it.
	Dir, UsersFile, JWKSFile string
	// Token is a JWT for /api/token, signed by the demo key, valid for an hour from Start, with
	// sub "demo-user" (forwarded as X-User).
	Token string
}

// newAuthDemo writes the demo's users and JWKS files and signs its token.
func newAuthDemo() (*AuthDemo, error) {
	dir, err := os.MkdirTemp("", "toron-demo-auth-")
	if err != nil {
		return nil, fmt.Errorf("demo: cannot create the auth files: %w", err)
	}
	a := &AuthDemo{Dir: dir, UsersFile: filepath.Join(dir, "users.htpasswd"), JWKSFile: filepath.Join(dir, "jwks.json")}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("demo: cannot generate the JWT key: %w", err)
	}
	pt, err := key.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		return nil, fmt.Errorf("demo: cannot encode the JWT key: %w", err)
	}
	b64 := base64.RawURLEncoding
	jwks, err := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "EC", "crv": "P-256", "kid": authDemoKID, "use": "sig", "alg": "ES256",
		"x": b64.EncodeToString(pt[1:33]), "y": b64.EncodeToString(pt[33:]),
	}}})
	if err != nil {
		return nil, fmt.Errorf("demo: cannot encode the JWKS: %w", err)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{
		"iss": AuthDemoIssuer, "aud": AuthDemoAudience, "sub": "demo-user",
		"iat": time.Now().Unix(), "exp": time.Now().Add(authDemoTokenTTL).Unix(),
	})
	tok.Header["kid"] = authDemoKID
	if a.Token, err = tok.SignedString(key); err != nil {
		return nil, fmt.Errorf("demo: cannot sign the token: %w", err)
	}
	for p, data := range map[string][]byte{
		a.UsersFile: []byte(AuthDemoUser + ":" + authDemoHash + "\n"),
		a.JWKSFile:  jwks,
	} {
		if err := os.WriteFile(p, data, 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("demo: cannot write %s: %w", p, err)
		}
	}
	return a, nil
}

// authRoutesTemplate adds the access-control routes; the %[n]s verbs: 1 api, 2 users file,
// 3 JWKS file.
const authRoutesTemplate = `
  # Access control before the body (SPEC 19): basic auth (bcrypt, the credential is not forwarded).
  - type: upstream
    prefix: /api/private
    target: http://%[1]s
    auth: {basic: {users_file: "%[2]s", realm: toron-demo}}

  # JWT: an ES256 token of the demo key, its sub forwarded as X-User.
  - type: upstream
    prefix: /api/token
    target: http://%[1]s
    auth:
      jwt:
        jwks_file: "%[3]s"
        algorithms: [ES256]
        issuer: "` + AuthDemoIssuer + `"
        audience: [` + AuthDemoAudience + `]
        claims_to_headers: {sub: X-User}
`

// authBannerTemplate is the banner's part for the routes above; the verbs: 1 gateway URL,
// 2 user, 3 password, 4 token.
const authBannerTemplate = `
Access control (decided from the headers, before any body byte):
  /api/private  -> api  basic auth, user %[2]s password %[3]s (bcrypt; Authorization is not forwarded)
  /api/token    -> api  JWT (ES256, the demo key), sub forwarded as X-User

  # 401 without credentials, then 200
  curl -s -i %[1]s/api/private/x | head -1
  curl -s -u %[2]s:%[3]s %[1]s/api/private/x

  # 401 without a token, then 200 with the demo token (valid for an hour): the api echoes "user":"demo-user"
  curl -s -i %[1]s/api/token/x | head -1
  curl -s -H 'Authorization: Bearer %[4]s' %[1]s/api/token/x
`
