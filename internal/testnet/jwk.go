package testnet

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"math/big"
)

// The JSON Web Keys (RFC 7517) that the JWT tests of auth/ and gateway/ serve or write to a
// JWKS file: public halves of keys a test made, and the set that holds them.

// RSAJWK is the public JWK of k under kid, for signatures.
func RSAJWK(kid string, k *rsa.PrivateKey) map[string]string {
	b64 := base64.RawURLEncoding
	return map[string]string{"kty": "RSA", "kid": kid, "use": "sig",
		"n": b64.EncodeToString(k.N.Bytes()), "e": b64.EncodeToString(big.NewInt(int64(k.E)).Bytes())}
}

// ECJWK is the public JWK of a P-256 key k under kid: x and y are the 32-byte halves of the
// uncompressed point (RFC 7518 6.2.1).
func ECJWK(kid string, k *ecdsa.PrivateKey) map[string]string {
	pt, err := k.PublicKey.Bytes()
	if err != nil {
		panic(err)
	}
	b64 := base64.RawURLEncoding
	return map[string]string{"kty": "EC", "kid": kid, "crv": "P-256",
		"x": b64.EncodeToString(pt[1:33]), "y": b64.EncodeToString(pt[33:])}
}

// JWKS is the JWK Set document of keys.
func JWKS(keys ...map[string]string) []byte {
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		panic(err)
	}
	return b
}
