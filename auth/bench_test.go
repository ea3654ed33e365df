package auth

import (
	"net/http"
	"net/netip"
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
	basic := newBasic(b, BasicOptions{UsersFile: usersFile(b, "alice", "s3cret")})
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

// TestCachedChecksDoNotAllocate: the steady state of an authenticated route, a credential or a
// token already verified, costs no allocation (the gateway's small-GET benchmark shows 0
// allocs/op with both).
func TestCachedChecksDoNotAllocate(t *testing.T) {
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret")})
	bin := input("Authorization", basicHeader("alice", "s3cret"))
	b.Check(bin)
	j := fileJWT(t, JWTOptions{ClaimsToHeaders: map[string]string{"sub": "X-User"}})
	jin := bearer(sign(t, jwt.SigningMethodRS256, "a", rsaA, claims(nil)))
	j.Check(jin)
	a := NewAccess([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")})
	ip := netip.MustParseAddr("10.2.3.4")
	var v Verdict
	for name, f := range map[string]func(){
		"basic":  func() { v = b.Check(bin) },
		"jwt":    func() { v = j.Check(jin) },
		"access": func() { _ = a.Allows(ip) },
	} {
		if n := testing.AllocsPerRun(200, f); n != 0 {
			t.Errorf("%s: %v allocations per cached check", name, n)
		}
	}
	if v.Outcome != Pass {
		t.Error(v)
	}
}
