package conf

import (
	"testing"
	"time"
)

// TestTunnelAndRewriteKeys: the keys of SPEC 15 and 16 load, default and show in -check.
func TestTunnelAndRewriteKeys(t *testing.T) {
	t.Parallel()
	cfg, err := loadStrings("", route(
		`type: upstream, prefix: /ws, target: "http://127.0.0.1:9001", websocket: true`,
		`type: upstream, prefix: /chat, target: "http://127.0.0.1:9001", websocket: true, max_tunnels: 7, tunnel_idle_timeout: 5s`,
		`type: upstream, prefix: /billing/, target: "http://127.0.0.1:9001", strip_prefix: true, add_prefix: /v1`,
		`type: upstream, prefix: /api, target: "http://127.0.0.1:9001"`,
	))
	if err != nil {
		t.Fatal(err)
	}
	ws, chat, billing, api := &cfg.Routes[0].Effective, &cfg.Routes[1].Effective, &cfg.Routes[2].Effective, &cfg.Routes[3].Effective
	if !ws.Websocket || ws.MaxTunnels != DefaultMaxTunnels || ws.TunnelIdleTimeout != DefaultTunnelIdleTimeout {
		t.Errorf("defaults: %+v", ws)
	}
	if chat.MaxTunnels != 7 || chat.TunnelIdleTimeout != 5*time.Second {
		t.Errorf("explicit: %+v", chat)
	}
	if api.Websocket || api.MaxTunnels != 0 || api.RewriteExamples != nil {
		t.Errorf("plain route: %+v", api)
	}
	want := []RewriteExample{{"/billing/", "/v1/"}, {"/billing/example?q=1", "/v1/example?q=1"}}
	if len(billing.RewriteExamples) != 2 || billing.RewriteExamples[0] != want[0] || billing.RewriteExamples[1] != want[1] {
		t.Errorf("examples: %+v", billing.RewriteExamples)
	}
	checkJSONHas(t, cfg, `"websocket":true`, `"max_tunnels":1024`, `"tunnel_idle_timeout":"1m"`, `"strip_prefix":true`, `"add_prefix":"/v1"`, `"rewrite_examples":[{"before":"/billing/","after":"/v1/"}`)
}

// TestTunnelAndRewriteValidation: each mistake names the file, route, prefix and key.
func TestTunnelAndRewriteValidation(t *testing.T) {
	t.Parallel()
	const base = `type: upstream, prefix: /ws, target: "http://127.0.0.1:9001"`
	cases := []struct{ extra, key, msg string }{
		{"websocket: true, max_tunnels: 0", "max_tunnels", "at least 1"},
		{"websocket: true, tunnel_idle_timeout: 0s", "tunnel_idle_timeout", "greater than 0"},
		{"websocket: true, tunnel_idle_timeout: -1s", "tunnel_idle_timeout", "negative"},
		{"max_tunnels: 5", "max_tunnels", "websocket: true"},
		{"tunnel_idle_timeout: 5s", "tunnel_idle_timeout", "websocket: true"},
		{"websocket: yes", "websocket", ""},
		{`add_prefix: v1`, "add_prefix", "must start with /"},
		{`add_prefix: /v1/`, "add_prefix", "must not end with /"},
		{`add_prefix: /`, "add_prefix", "must not end with /"},
		{`add_prefix: /a/../b`, "add_prefix", `".."`},
		{`add_prefix: /a/./b`, "add_prefix", `"."`},
		{`add_prefix: "/a//b"`, "add_prefix", `"//"`},
		{`add_prefix: "/a?x"`, "add_prefix", "query"},
		{`add_prefix: ""`, "add_prefix", "must not be empty"},
		{`strip_prefix: 1`, "strip_prefix", ""},
	}
	for _, c := range cases {
		oneRouteError(t, route(base+", "+c.extra), "/ws", c.key, c.msg)
	}
}

func TestRewritePath(t *testing.T) {
	t.Parallel()
	cases := []struct {
		prefix string
		strip  bool
		add    string
		path   string
		want   string
	}{
		{"/api", true, "", "/api/users", "/users"},
		{"/api", true, "", "/api", "/"},
		{"/api", true, "", "/api/", "/"},
		{"/api/", true, "", "/api/users", "/users"},
		{"/api", true, "", "/api/a%2Fb", "/a%2Fb"},
		{"/legacy", true, "/v1", "/legacy", "/v1"},
		{"/legacy", true, "/v1", "/legacy/x", "/v1/x"},
		{"/legacy", false, "/v1", "/legacy/x", "/v1/legacy/x"},
		{"/", true, "", "/x", "/x"},
		{"/", false, "/v1", "/", "/v1/"},
	}
	for _, c := range cases {
		if got := RewritePath(c.prefix, c.strip, c.add, c.path); got != c.want {
			t.Errorf("RewritePath(%q, %v, %q, %q) = %q, want %q", c.prefix, c.strip, c.add, c.path, got, c.want)
		}
	}
}
