package gateway

import (
	"testing"

	"toron/conf"
)

// TestRewriteForwarded: strip_prefix and add_prefix on real requests (SPEC 16): on the
// normalized path that matched, segment-aware, %2F still encoded, the query byte for byte,
// X-Forwarded-Prefix set to what was removed.
func TestRewriteForwarded(t *testing.T) {
	up := startUpstream(t, nil)
	tg := startGateway(t, "",
		upstreamRoute("/api", up.addr, "strip_prefix: true\n")+
			upstreamRoute("/legacy", up.addr, "strip_prefix: true\nadd_prefix: /v1\n")+
			upstreamRoute("/new", up.addr, "add_prefix: /v2/base\n")+
			upstreamRoute("/dir/", up.addr, "strip_prefix: true\n")+
			upstreamRoute("/plain", up.addr, ""))
	cases := []struct {
		target, uri, prefix string
	}{
		{"/api/users", "/users", "/api"},
		{"/api", "/", "/api"},
		{"/api/", "/", "/api"},
		{"/api/a%2Fb/c", "/a%2Fb/c", "/api"},
		{"/api/x?q=%2F&b=a+b&&z", "/x?q=%2F&b=a+b&&z", "/api"},
		{"/x/../api//users/./y", "/users/y", "/api"},
		{"/legacy", "/v1", "/legacy"},
		{"/legacy/reports?id=7", "/v1/reports?id=7", "/legacy"},
		{"/new/x", "/v2/base/new/x", ""},
		{"/dir/file", "/file", "/dir"},
		{"/plain/x?y", "/plain/x?y", ""},
	}
	for _, c := range cases {
		r := rawRequest(t, tg.addr, "GET "+c.target+" HTTP/1.1\r\nHost: example.test\r\nX-Forwarded-Prefix: /spoofed\r\n\r\n")
		if r.StatusCode != 200 {
			t.Errorf("%s: status %d", c.target, r.StatusCode)
			continue
		}
		if got := r.Header.Get("X-Echo-URI"); got != c.uri {
			t.Errorf("%s: forwarded %q, want %q", c.target, got, c.uri)
		}
		want := c.prefix
		if want == "" {
			want = "/spoofed" // a route that strips nothing leaves the header as it came
		}
		if got := r.Header.Get("X-Echo-H-X-Forwarded-Prefix"); got != want {
			t.Errorf("%s: X-Forwarded-Prefix %q, want %q", c.target, got, want)
		}
	}
	// Matching sees the request's own path: /users is no route.
	if s, _, _, err := getStatus(tg.addr, "/users"); err != nil || s != 404 {
		t.Errorf("/users: %d %v", s, err)
	}
}

// TestAppendForwardPath: the forwarding function agrees with conf.RewritePath, which -check
// uses for its examples, and does not allocate.
func TestAppendForwardPath(t *testing.T) {
	cases := []struct {
		prefix string
		strip  bool
		add    string
		paths  []string
	}{
		{"/api", true, "", []string{"/api", "/api/", "/api/u", "/api/a%2Fb"}},
		{"/api/", true, "", []string{"/api/", "/api/u"}},
		{"/legacy", true, "/v1", []string{"/legacy", "/legacy/", "/legacy/x/y"}},
		{"/legacy", false, "/v1", []string{"/legacy", "/legacy/x"}},
		{"/", true, "", []string{"/", "/x"}},
		{"/", false, "/v1", []string{"/", "/x"}},
		{"/p", false, "", []string{"/p/x"}},
	}
	for _, c := range cases {
		r := &route{rw: newRewrite(&conf.Route{Prefix: c.prefix, StripPrefix: c.strip, AddPrefix: c.add})}
		for _, p := range c.paths {
			want := conf.RewritePath(c.prefix, c.strip, c.add, p)
			if got := string(r.appendForwardPath(nil, []byte(p))); got != want {
				t.Errorf("%+v %s: %q, want %q", c, p, got, want)
			}
		}
	}
	r := &route{rw: newRewrite(&conf.Route{Prefix: "/legacy", StripPrefix: true, AddPrefix: "/v1"})}
	dst := make([]byte, 0, 64)
	path := []byte("/legacy/reports")
	if n := testing.AllocsPerRun(100, func() { dst = r.appendForwardPath(dst[:0], path) }); n != 0 {
		t.Errorf("appendForwardPath allocates %v times", n)
	}
}
