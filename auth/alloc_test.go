package auth

import (
	"net/netip"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// TestCachedChecksDoNotAllocate: the steady state of an authenticated route, a credential or a
// token already verified, costs no allocation (the gateway's small-GET benchmark shows 0
// allocs/op with both).
func TestCachedChecksDoNotAllocate(t *testing.T) {
	b, err := NewBasic(BasicOptions{UsersFile: usersFile(t, "alice", "s3cret")})
	if err != nil {
		t.Fatal(err)
	}
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
