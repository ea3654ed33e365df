package gateway

import (
	"net/netip"
	"strings"
	"testing"
)

func TestClientFromXFF(t *testing.T) {
	ts := trustedSet{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	peer := netip.MustParseAddr("10.0.0.1")
	for _, tc := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"no header", nil, "10.0.0.1"},
		{"one client", []string{"203.0.113.7"}, "203.0.113.7"},
		{"rightmost untrusted wins over a forged left part", []string{"1.1.1.1, 203.0.113.7, 10.0.0.9"}, "203.0.113.7"},
		{"several lines are one list, read from the right", []string{"1.1.1.1, 198.51.100.4", "10.0.0.8", "10.0.0.9"}, "198.51.100.4"},
		{"the last line is the rightmost", []string{"10.0.0.8", "198.51.100.4"}, "198.51.100.4"},
		{"all trusted: the leftmost", []string{"10.0.0.7, 10.0.0.8", "10.0.0.9"}, "10.0.0.7"},
		{"malformed stops the walk at the last trusted", []string{"203.0.113.7, bogus, 10.0.0.9"}, "10.0.0.9"},
		{"malformed rightmost: the peer", []string{"203.0.113.7, unknown"}, "10.0.0.1"},
		{"malformed in an earlier line", []string{"203.0.113.7, 300.1.1.1", "10.0.0.9"}, "10.0.0.9"},
		{"zone is malformed", []string{"fe80::1%eth0"}, "10.0.0.1"},
		{"empty elements are ignored", []string{" , 203.0.113.7 ,, 10.0.0.9,"}, "203.0.113.7"},
		{"IPv6 client", []string{"2001:db8:1::5, 2001:db8:ffff::1"}, "2001:db8:1::5"},
		{"IPv6 all trusted", []string{"2001:db8:ffff::2", "2001:db8:ffff::1"}, "2001:db8:ffff::2"},
		{"bracketed IPv6 with a port", []string{"[2001:db8:1::5]:4711"}, "2001:db8:1::5"},
		{"IPv4 with a port", []string{"203.0.113.7:4711, 10.0.0.9:80"}, "203.0.113.7"},
		{"bad port is malformed", []string{"203.0.113.7:http"}, "10.0.0.1"},
		{"IPv4-mapped IPv6 is IPv4, and trusted", []string{"203.0.113.7, ::ffff:10.0.0.9"}, "203.0.113.7"},
		{"tabs", []string{"\t203.0.113.7\t"}, "203.0.113.7"},
	} {
		lines := make([][]byte, len(tc.lines))
		for i, l := range tc.lines {
			lines[i] = []byte(l)
		}
		if got := clientFromXFF(lines, ts, peer); got.String() != tc.want {
			t.Errorf("%s: %q -> %s, want %s", tc.name, tc.lines, got, tc.want)
		}
	}
	lines := [][]byte{[]byte("198.51.100.4, 2001:db8:1::5"), []byte("10.0.0.9")}
	if n := testing.AllocsPerRun(100, func() { clientFromXFF(lines, ts, peer) }); n != 0 {
		t.Errorf("the walk allocates %.1f times", n)
	}
}

// identityRequest sends a GET with forwarded headers an attacker might forge.
const identityRequest = "GET /api/x HTTP/1.1\r\nHost: front.example\r\n" +
	"X-Forwarded-For: 203.0.113.7, 10.0.0.2\r\nX-Forwarded-For: 10.0.0.3\r\n" +
	"X-Forwarded-Proto: https\r\nX-Forwarded-Host: public.example\r\nX-Forwarded-Prefix: /p\r\n" +
	"X-Real-IP: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\n\r\n"

func echoed(rr rawResponse, h string) string { return rr.Header.Get("X-Echo-H-" + h) }

// checkForwarded sends identityRequest through a gateway with serverYAML and checks the
// forwarded headers the upstream saw against want.
func checkForwarded(t *testing.T, serverYAML string, want map[string]string) *testGateway {
	t.Helper()
	gw, _ := startProxied(t, serverYAML, "/api", nil)
	rr := rawRequest(t, gw.addr, identityRequest)
	if rr.StatusCode != 200 {
		t.Fatalf("status %d", rr.StatusCode)
	}
	for h, w := range want {
		if got := echoed(rr, h); got != w {
			t.Errorf("upstream saw %s %q, want %q", h, got, w)
		}
	}
	return gw
}

func TestForwardedHeadersFromUntrustedPeer(t *testing.T) {
	checkForwarded(t, "trusted_proxies: [10.0.0.0/8]\n", map[string]string{
		"X-Forwarded-For":    "127.0.0.1", // only the peer: what came was dropped
		"X-Forwarded-Proto":  "http",
		"X-Forwarded-Host":   "front.example",
		"X-Forwarded-Prefix": "",
		"X-Real-Ip":          "127.0.0.1",
		"Forwarded":          "",
	})
}

func TestForwardedHeadersFromTrustedPeer(t *testing.T) {
	gw := checkForwarded(t, "trusted_proxies: [127.0.0.1, 10.0.0.0/8]\n", map[string]string{
		"X-Forwarded-For":    "203.0.113.7, 10.0.0.2, 10.0.0.3, 127.0.0.1", // appended to
		"X-Forwarded-Proto":  "https",                                      // kept
		"X-Forwarded-Host":   "public.example",                             // kept
		"X-Forwarded-Prefix": "/p",
		"X-Real-Ip":          "203.0.113.7", // the walk's client, not the forged 6.6.6.6
		"Forwarded":          "for=6.6.6.6",
	})
	// Without forwarded headers of its own, a trusted peer's request gets Toron's.
	rr := rawRequest(t, gw.addr, "GET /api/x HTTP/1.1\r\nHost: front.example\r\n\r\n")
	if echoed(rr, "X-Forwarded-Proto") != "http" || echoed(rr, "X-Forwarded-Host") != "front.example" || echoed(rr, "X-Real-Ip") != "127.0.0.1" {
		t.Errorf("trusted peer without headers: proto %q host %q real ip %q", echoed(rr, "X-Forwarded-Proto"), echoed(rr, "X-Forwarded-Host"), echoed(rr, "X-Real-Ip"))
	}
}

func TestForwardedHeadersWithoutTrustedProxies(t *testing.T) {
	checkForwarded(t, "", map[string]string{
		"X-Forwarded-For":    "203.0.113.7, 10.0.0.2, 10.0.0.3, 127.0.0.1", // SPEC 7: appended
		"X-Forwarded-Proto":  "http",                                       // SPEC 7: set
		"X-Forwarded-Host":   "front.example",
		"X-Forwarded-Prefix": "/p",
		"X-Real-Ip":          "127.0.0.1", // always the client IP, replacing what came
		"Forwarded":          "for=6.6.6.6",
	})
}

func TestAccessLogClientIP(t *testing.T) {
	entries, _ := accessLinesOf(t, "trusted_proxies: [127.0.0.0/8]\n", "", 3,
		"GET /api/a HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 2001:db8::7\r\n\r\n",
		"GET /nowhere HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.1\r\n\r\n",
		"GET /api/a HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n")
	for i, want := range []string{"2001:db8::7", "198.51.100.1", "127.0.0.1"} {
		if got := entries[i].ContextMap()["client_ip"]; got != want {
			t.Errorf("line %d: client_ip %v, want %s", i, got, want)
		}
	}
}

// FuzzClientFromXFF: whatever X-Forwarded-For lines a client sends, the walk never panics and
// its result is the peer or one of the addresses the lines hold.
func FuzzClientFromXFF(f *testing.F) {
	for _, seed := range []string{
		"203.0.113.7", "1.1.1.1, 203.0.113.7, 10.0.0.9", "10.0.0.8\n198.51.100.4", "203.0.113.7, bogus, 10.0.0.9",
		"fe80::1%eth0", " , 203.0.113.7 ,, 10.0.0.9,", "[2001:db8:1::5]:4711", "203.0.113.7:4711", "[::1", "[]:1",
		"::ffff:10.0.0.9", "1.2.3.4:", ":80", "[2001:db8::1]:123456",
	} {
		f.Add(seed)
	}
	ts := trustedSet{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	peer := netip.MustParseAddr("10.0.0.1")
	f.Fuzz(func(t *testing.T, s string) {
		var lines [][]byte
		for _, l := range strings.Split(s, "\n") {
			lines = append(lines, []byte(l))
		}
		got := clientFromXFF(lines, ts, peer)
		if !got.IsValid() {
			t.Fatalf("%q: invalid client IP", s)
		}
		if got == peer {
			return
		}
		for _, l := range lines {
			for _, e := range strings.Split(string(l), ",") {
				if e = strings.Trim(e, " \t"); e == "" {
					continue
				}
				if a, ok := parseForwardedAddr([]byte(e)); ok && a == got {
					return
				}
			}
		}
		t.Fatalf("%q: client IP %s is neither the peer nor in the header", s, got)
	})
}
