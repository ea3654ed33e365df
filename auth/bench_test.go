package auth

import (
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/valyala/fasthttp"
)

// BenchmarkCheckAndPrepare is one passing request's access control, as the gateway runs it:
// Check, then Prepare on the header forwarded upstream. basic and jwt hit their caches (the
// credential and the token verified before the loop); forward calls an auth service on
// loopback on every request (an httptest server: its allocations are in forward's figures;
// the gateway's BenchmarkAuthPaired calls a fasthttp one). Profile one with -cpuprofile to see what the check itself costs
// beside the gateway's small GET (BenchmarkAuthPaired in package gateway).
func BenchmarkCheckAndPrepare(b *testing.B) {
	basic, err := NewBasic(BasicOptions{UsersFile: usersFile(b, "alice", "s3cret")})
	if err != nil {
		b.Fatal(err)
	}
	j := fileJWT(b, JWTOptions{ClaimsToHeaders: map[string]string{"sub": "X-User", "iss": "X-Issuer"}})
	tok := sign(b, jwt.SigningMethodES256, "e", ecKey, claims(nil))
	svc := newAuthService(b, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-User", "alice")
		w.WriteHeader(http.StatusNoContent)
	})
	f := newForward(b, ForwardOptions{URL: svc.URL + "/verify",
		RequestHeaders: []string{"Authorization", "Cookie"}, UpstreamHeaders: []string{"X-User"}})
	for _, c := range []struct {
		name  string
		check Checker
		in    *Input
	}{
		{"basic", basic, input("Authorization", basicHeader("alice", "s3cret"))},
		{"jwt", j, bearer(tok)},
		{"forward", f, input("Authorization", "Bearer x")},
	} {
		c.in.Now = time.Now()
		b.Run(c.name, func(b *testing.B) {
			var up fasthttp.RequestHeader
			c.in.Header.CopyTo(&up)
			if v := c.check.Check(c.in); v.Outcome != Pass {
				b.Fatal(v)
			}
			// As the gateway keeps it in the exchange: a verdict whose address goes to an
			// interface method would be allocated per request.
			var v Verdict
			b.ReportAllocs()
			for b.Loop() {
				v = c.check.Check(c.in)
				if v.Outcome != Pass {
					b.Fatal(v)
				}
				c.check.Prepare(&up, &v)
			}
		})
	}
}
