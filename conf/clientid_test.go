package conf

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestClientIdentityKeys(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `
server:
  read_timeout: 7s
  trusted_proxies: [10.0.0.0/8, "2001:db8::/32", 192.168.1.7, "::ffff:172.16.0.0/108"]
  proxy_protocol: {enabled: true, allow: [10.1.0.0/16]}
`, route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001", rate_limit: {requests_per_second: 0.5}`,
		`type: upstream, prefix: /b, target: "http://127.0.0.1:9001", rate_limit: {requests_per_second: 20, burst: 40, key: "header:X-Api-Key"}`))
	s := cfg.Server
	got, err := ParsePrefixes(s.TrustedProxies)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32"),
		netip.MustParsePrefix("192.168.1.7/32"), netip.MustParsePrefix("172.16.0.0/12")}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("trusted[%d] = %s, want %s", i, got[i], want[i])
		}
	}
	if p := s.ProxyProtocol; !p.Enabled || len(p.Allow) != 1 || p.Timeout != 7*time.Second {
		t.Errorf("proxy_protocol = %+v, want enabled, one allow entry, timeout = read_timeout 7s", p)
	}
	if rl := cfg.Routes[0].Effective.RateLimit; rl == nil || rl.RequestsPerSecond != 0.5 || rl.Burst != 1 || rl.Key != RateKeyClientIP {
		t.Errorf("route 0 rate_limit = %+v, want 0.5/s, burst 1, client_ip", rl)
	}
	if rl := cfg.Routes[1].Effective.RateLimit; rl == nil || rl.Burst != 40 || rl.HeaderName() != "X-Api-Key" {
		t.Errorf("route 1 rate_limit = %+v", rl)
	}
	if cfg.Routes[0].Effective.RateLimit.HeaderName() != "" {
		t.Error("client_ip key names a header")
	}
	checkJSONHas(t, cfg, `"timeout":"7s"`, `"rate_limit":{"requests_per_second":0.5,"burst":1,"key":"client_ip","scope":"local"}`, `"trusted_proxies":["10.0.0.0/8"`)
}

func TestClientIdentityErrors(t *testing.T) {
	t.Parallel()
	rt := func(rl string) string {
		return route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001", rate_limit: ` + rl)
	}
	for _, tc := range []struct {
		config, routes, want string
	}{
		{"server: {trusted_proxies: [10.0.0.0/33]}", okRoute, `config.yaml: server.trusted_proxies: item 0 ("10.0.0.0/33") must be an IP address`},
		{"server: {trusted_proxies: [example.com]}", okRoute, `server.trusted_proxies: item 0 ("example.com")`},
		{"server: {trusted_proxies: 10.0.0.1}", okRoute, `config.yaml: server.trusted_proxies: must be a list of strings`},
		{"server: {proxy_protocol: {enabled: true, allow: [nope]}}", okRoute, `config.yaml: server.proxy_protocol.allow: item 0 ("nope")`},
		{"server: {proxy_protocol: {enabled: yes please}}", okRoute, `config.yaml: server.proxy_protocol: enabled: must be true or false`},
		{"server: {proxy_protocol: {enable: true}}", okRoute, `config.yaml: server.proxy_protocol: enable: unknown key (did you mean enabled?)`},
		{"server: {proxy_protocol: {timeout: -1s}}", okRoute, `config.yaml: server.proxy_protocol.timeout: must not be negative`},
		{"server: {proxy_protocol: true}", okRoute, `config.yaml: server.proxy_protocol: must be a mapping with the keys allow, enabled, timeout`},
		{"", rt("{burst: 5}"), `routes.yaml: routes[0] (/api): rate_limit: requests_per_second: is required`},
		{"", rt("{requests_per_second: -1}"), `routes.yaml: routes[0] (/api): rate_limit: requests_per_second: must be greater than 0`},
		{"", rt("{requests_per_second: 5, burst: 0.5}"), `routes.yaml: routes[0] (/api): rate_limit: burst: must be at least 1`},
		{"", rt("{requests_per_second: 5, burst: 1e12}"), `routes.yaml: routes[0] (/api): rate_limit: burst: must be at least 1 (a request costs one token) and at most 1e+09`},
		{"", rt("{requests_per_second: .nan}"), `rate_limit: requests_per_second: must be greater than 0`},
		{"", rt("{requests_per_second: 5, key: ip}"), `routes.yaml: routes[0] (/api): rate_limit: key: must be client_ip or header:NAME, not "ip"`},
		{"", rt(`{requests_per_second: 5, key: "header:"}`), `routes.yaml: routes[0] (/api): rate_limit: key: "header:" must name a header`},
		{"", rt(`{requests_per_second: 5, key: "header:X Y"}`), `rate_limit: key: "header:X Y" must name a header`},
		{"", rt(`{requests_per_second: "5"}`), `routes.yaml: routes[0] (/api): rate_limit: requests_per_second: must be a number`},
		{"", rt(`{rps: 5}`), `routes.yaml: routes[0] (/api): rate_limit: rps: unknown key`},
		{"", rt(`10`), `routes.yaml: routes[0] (/api): rate_limit: must be a mapping with the keys burst, key, on_error, requests_per_second, scope`},
	} {
		_, err := loadStrings(tc.config, tc.routes)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q routes %q:\n got %v\nwant %s", tc.config, tc.routes, err, tc.want)
		}
	}
}

func TestProxyProtocolReload(t *testing.T) {
	t.Parallel()
	on := mustLoad(t, "server: {proxy_protocol: {enabled: true, allow: [10.0.0.0/8]}}", okRoute)
	off := mustLoad(t, "", okRoute)
	if err := off.ReloadCompatible(on); err == nil || !strings.Contains(err.Error(), "config.yaml: server.proxy_protocol: cannot change on reload") {
		t.Errorf("turning proxy_protocol off: %v", err)
	}
	other := mustLoad(t, "server: {proxy_protocol: {enabled: true, allow: [10.0.0.0/9]}}", okRoute)
	if err := other.ReloadCompatible(on); err == nil {
		t.Error("a new allow list was accepted on reload")
	}
	// The timeout and trusted_proxies follow the configuration in force.
	same := mustLoad(t, "server: {read_timeout: 9s, trusted_proxies: [10.0.0.1], proxy_protocol: {enabled: true, allow: [10.0.0.0/8]}}", okRoute)
	if err := same.ReloadCompatible(on); err != nil {
		t.Errorf("compatible reload refused: %v", err)
	}
}

func TestClientIdentityFromEnvironment(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "server: {proxy_protocol: {allow: [10.0.0.0/8]}}", okRoute,
		"TORON_SERVER__TRUSTED_PROXIES=10.0.0.0/8, 192.0.2.7,",
		"TORON_SERVER__PROXY_PROTOCOL__ENABLED=true",
		"TORON_SERVER__PROXY_PROTOCOL__TIMEOUT=2s")
	s := cfg.Server
	if len(s.TrustedProxies) != 2 || s.TrustedProxies[1] != "192.0.2.7" {
		t.Errorf("trusted_proxies = %q", s.TrustedProxies)
	}
	// The file's allow and the environment's keys merge.
	if p := s.ProxyProtocol; !p.Enabled || p.Timeout != 2*time.Second || len(p.Allow) != 1 {
		t.Errorf("proxy_protocol = %+v", p)
	}
	for env, want := range map[string]string{
		"TORON_SERVER__PROXY_PROTOCOL__ENABLE=true":    "environment: TORON_SERVER__PROXY_PROTOCOL__ENABLE: server.proxy_protocol.enable is not a configuration key (did you mean TORON_SERVER__PROXY_PROTOCOL__ENABLED?)",
		"TORON_SERVER__PROXY_PROTOCOL__TIMEOUT=-1s":    "environment: TORON_SERVER__PROXY_PROTOCOL__TIMEOUT: must not be negative",
		"TORON_SERVER__PROXY_PROTOCOL=on":              "environment: TORON_SERVER__PROXY_PROTOCOL: cannot be set from the environment",
		"TORON_SERVER__TRUSTED_PROXIES=10.0.0.0/8,bad": `environment: TORON_SERVER__TRUSTED_PROXIES: item 1 ("bad")`,
	} {
		_, err := loadStrings("", okRoute, env)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s:\n got %v\nwant %s", env, err, want)
		}
	}
}
