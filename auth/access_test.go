package auth

import (
	"net/netip"
	"testing"
)

func TestAccessDenyFirstThenAllow(t *testing.T) {
	p := func(s ...string) []netip.Prefix {
		out := make([]netip.Prefix, 0, len(s))
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	a := NewAccess(p("10.0.0.0/8", "2001:db8::/32"), p("10.1.0.0/16"))
	deny := NewAccess(nil, p("192.0.2.0/24"))
	cases := []struct {
		acc  *Access
		ip   string
		want bool
	}{
		{a, "10.2.3.4", true},
		{a, "10.1.2.3", false}, // denied inside an allowed range: deny wins
		{a, "192.0.2.1", false},
		{a, "2001:db8::5", true},
		{a, "::ffff:10.2.3.4", true}, // IPv4-mapped is the IPv4 address
		{a, "2001:db9::1", false},
		{deny, "192.0.2.9", false},
		{deny, "198.51.100.1", true},
		{nil, "198.51.100.1", true},
	}
	for _, c := range cases {
		if got := c.acc.Allows(netip.MustParseAddr(c.ip)); got != c.want {
			t.Errorf("%s: Allows = %v, want %v", c.ip, got, c.want)
		}
	}
	if NewAccess(nil, nil) != nil {
		t.Error("empty lists should give a nil Access")
	}
	if a.Allows(netip.Addr{}) {
		t.Error("an unknown address passed an allow list")
	}
}
