package conf

import (
	"strings"
	"testing"
	"time"
)

func TestRedisAndGlobalScope(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `
server:
  redis: {addrs: ["redis:6379"], username: toron, db: 2}
`, route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001", rate_limit: {requests_per_second: 5, scope: global}`,
		`type: upstream, prefix: /b, target: "http://127.0.0.1:9001", rate_limit: {requests_per_second: 5, scope: global, on_error: deny}`,
		`type: upstream, prefix: /c, target: "http://127.0.0.1:9001", rate_limit: {requests_per_second: 5}`),
		"TORON_SERVER__REDIS__PASSWORD=from-env")
	r := cfg.Server.Redis
	if r == nil || len(r.Addrs) != 1 || r.Username != "toron" || r.Password != "from-env" || r.DB != 2 || r.TLS || r.Timeout != 10*time.Millisecond {
		t.Fatalf("server.redis = %+v, want the file's keys, the password from the environment, timeout 10ms", r)
	}
	for i, want := range []struct{ scope, onError string }{{"global", "local"}, {"global", "deny"}, {"local", ""}} {
		rl := cfg.Routes[i].Effective.RateLimit
		if rl.Scope != want.scope || rl.OnError != want.onError || rl.IsGlobal() != (want.scope == "global") {
			t.Errorf("routes[%d] rate_limit = %+v, want scope %s on_error %q", i, rl, want.scope, want.onError)
		}
	}
	js, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(js), "from-env") || !strings.Contains(string(js), `"timeout": "10ms"`) {
		t.Errorf("-check JSON shows the password or lacks the timeout:\n%s", js)
	}
}

func TestRedisErrors(t *testing.T) {
	t.Parallel()
	rt := func(rl string) string {
		return route(`type: upstream, prefix: /api, target: "http://127.0.0.1:9001", rate_limit: ` + rl)
	}
	const redis = `server: {redis: {addrs: ["127.0.0.1:6379"]}}`
	for _, tc := range []struct {
		config, routes, want string
	}{
		{"", rt("{requests_per_second: 5, scope: global}"), `routes.yaml: routes[0] (/api): rate_limit: scope: global needs server.redis`},
		{redis, rt("{requests_per_second: 5, scope: everywhere}"), `routes.yaml: routes[0] (/api): rate_limit: scope: must be local or global, not "everywhere"`},
		{redis, rt("{requests_per_second: 5, scope: global, on_error: retry}"), `routes.yaml: routes[0] (/api): rate_limit: on_error: must be local, allow or deny, not "retry"`},
		{redis, rt("{requests_per_second: 5, on_error: allow}"), `routes.yaml: routes[0] (/api): rate_limit: on_error: only applies to scope: global`},
		{"server: {redis: {db: 1}}", okRoute, `config.yaml: server.redis: addrs: is required`},
		{`server: {redis: {addrs: ["redis"]}}`, okRoute, `config.yaml: server.redis: addrs: item 0 ("redis") must be host:port`},
		{`server: {redis: {addrs: ["redis:0"]}}`, okRoute, `config.yaml: server.redis: addrs: item 0 ("redis:0") must be host:port`},
		{`server: {redis: {addrs: ["a:1", "b:1"], db: 3}}`, okRoute, `config.yaml: server.redis: db: a Redis Cluster (several addrs) has only database 0`},
		{`server: {redis: {addrs: ["a:1"], db: -1}}`, okRoute, `config.yaml: server.redis: db: must be a database number`},
		{`server: {redis: {addrs: ["a:1"], timeout: 5s}}`, okRoute, `config.yaml: server.redis: timeout: must be at most 1s`},
		{`server: {redis: {addrs: ["a:1"], timeout: -1ms}}`, okRoute, `config.yaml: server.redis: timeout: must not be negative`},
		{`server: {redis: {addrs: ["a:1"], tls: maybe}}`, okRoute, `config.yaml: server.redis: tls: must be true or false`},
		{`server: {redis: {addr: "a:1"}}`, okRoute, `config.yaml: server.redis: addr: unknown key (did you mean addrs?)`},
	} {
		_, err := loadStrings(tc.config, tc.routes)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q routes %q:\n got %v\nwant %s", tc.config, tc.routes, err, tc.want)
		}
	}
}
