package conf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// bcryptLine is a valid htpasswd line (bcrypt of "demo-password", cost 10).
const bcryptLine = "alice:$2a$10$jg/bnlbmcXdL6pyibpgETuY8f07GDz78V9OQLcMfECNyzfdKeTSZ.\n"

// authFiles writes a users file, a JWKS file and a broken users file; it returns their paths.
func authFiles(t *testing.T) (users, jwks, badUsers string) {
	t.Helper()
	dir := t.TempDir()
	users = filepath.Join(dir, "users")
	jwks = filepath.Join(dir, "jwks.json")
	badUsers = filepath.Join(dir, "bad-users")
	for p, data := range map[string]string{
		users:    "# demo\n" + bcryptLine,
		jwks:     `{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"}]}`,
		badUsers: bcryptLine + "bob:$apr1$x$y\n",
	} {
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return users, jwks, badUsers
}

func TestAuthKeysResolve(t *testing.T) {
	t.Parallel()
	users, jwks, _ := authFiles(t)
	config := "server:\n  auth_defaults:\n    forward: {url: \"http://127.0.0.1:9100/verify\", upstream_headers: [X-User]}\n"
	routes := route(
		`type: upstream, prefix: /b, target: "http://127.0.0.1:9001", auth: {basic: {users_file: "`+users+`", realm: ops}}, access: {allow: [10.0.0.0/8], deny: [10.1.0.0/16]}`,
		`type: upstream, prefix: /j, target: "http://127.0.0.1:9001", auth: {jwt: {jwks_file: "`+jwks+`", algorithms: [RS256, ES256], audience: [api], from: "cookie:tok", claims_to_headers: {sub: X-User}}}`,
		`type: upstream, prefix: /u, target: "http://127.0.0.1:9001", auth: {jwt: {jwks_url: "https://idp.test/jwks", algorithms: [RS256], forward_token: false}}`,
		`type: upstream, prefix: /d, target: "http://127.0.0.1:9001", auth: default`,
		`type: upstream, prefix: /open, target: "http://127.0.0.1:9001"`,
		`type: upstream, prefix: /fnone, target: "http://127.0.0.1:9001", auth: {forward: {url: "http://127.0.0.1:9100/", request_headers: []}}`,
		`type: upstream, prefix: /fsome, target: "http://127.0.0.1:9001", auth: {forward: {url: "http://127.0.0.1:9100/", request_headers: [X-Api-Key]}}`,
	)
	cfg := mustLoad(t, config, routes)
	b := findRoute(t, cfg, "/b").Effective
	if b.Auth == nil || b.Auth.Basic == nil || b.Auth.Basic.Realm != "ops" || b.Access == nil || b.Access.Deny[0] != "10.1.0.0/16" {
		t.Errorf("/b: %+v %+v", b.Auth, b.Access)
	}
	j := findRoute(t, cfg, "/j").Effective.Auth.JWT
	if j.Leeway != DefaultJWTLeeway || j.From != "cookie:tok" || !j.ForwardToken || j.ClaimsToHeaders["sub"] != "X-User" || j.JWKSRefresh != 0 {
		t.Errorf("/j: %+v", j)
	}
	u := findRoute(t, cfg, "/u").Effective.Auth.JWT
	if u.JWKSRefresh != DefaultJWKSRefresh || u.ForwardToken {
		t.Errorf("/u: %+v", u)
	}
	d := findRoute(t, cfg, "/d").Effective.Auth
	if d == nil || !d.Default || d.Forward == nil || d.Forward.Timeout != 2*time.Second || d.Forward.MaxConcurrency != 64 ||
		!slices.Equal(d.Forward.RequestHeaders, []string{"Authorization", "Cookie"}) {
		t.Errorf("/d: %+v", d)
	}
	// request_headers: [] sends none; a list replaces the default.
	if f := findRoute(t, cfg, "/fnone").Effective.Auth.Forward; len(f.RequestHeaders) != 0 {
		t.Errorf("/fnone: request_headers %q, want none", f.RequestHeaders)
	}
	if f := findRoute(t, cfg, "/fsome").Effective.Auth.Forward; !slices.Equal(f.RequestHeaders, []string{"X-Api-Key"}) {
		t.Errorf("/fsome: request_headers %q", f.RequestHeaders)
	}
	if o := findRoute(t, cfg, "/open").Effective; o.Auth != nil || o.Access != nil {
		t.Errorf("/open: %+v %+v", o.Auth, o.Access)
	}
	out, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"users_file": "` + users, `"leeway": "30s"`, `"timeout": "2s"`, `"request_headers": [`, `"Cookie"`, `"default": true`, `"auth_defaults"`, `"jwks_refresh": "5m"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-check output lacks %s", want)
		}
	}
	files := cfg.AuthFiles()
	if len(files) != 2 || files[0] != users || files[1] != jwks {
		t.Errorf("AuthFiles = %v", files)
	}
}

func TestAuthErrorsNameFileRouteKey(t *testing.T) {
	t.Parallel()
	users, jwks, badUsers := authFiles(t)
	cases := []struct {
		config, auth, want string
	}{
		{"", `auth: {jwt: {jwks_file: "` + jwks + `", algorithms: [RS256, XS999]}}`, `routes.yaml: routes[0] (/a): auth: jwt.algorithms: unknown algorithm "XS999"`},
		{"", `auth: {jwt: {jwks_file: "` + jwks + `", algorithms: [none]}}`, `routes[0] (/a): auth: jwt.algorithms: "none" is never accepted`},
		{"", `auth: {jwt: {jwks_file: "` + jwks + `"}}`, `auth: jwt.algorithms: is required`},
		{"", `auth: {jwt: {jwks_file: "/nonexistent/jwks.json", algorithms: [RS256]}}`, `auth: jwt.jwks_file: cannot read /nonexistent/jwks.json`},
		{"", `auth: {jwt: {jwks_file: "` + users + `", algorithms: [RS256]}}`, `auth: jwt.jwks_file: ` + users + ` is not JSON`},
		{"", `auth: {jwt: {jwks_url: "ftp://idp/jwks", algorithms: [RS256]}}`, `auth: jwt.jwks_url: must be an http:// or https:// URL`},
		{"", `auth: {jwt: {jwks_file: "` + jwks + `", jwks_url: "https://x/", algorithms: [RS256]}}`, `auth: jwt: has both`},
		{"", `auth: {jwt: {jwks_file: "` + jwks + `", algorithms: [RS256], from: query}}`, `auth: jwt.from: must be header or cookie:NAME`},
		{"", `auth: {jwt: {jwks_file: "` + jwks + `", algorithms: [RS256], claims_to_headers: {sub: Host}}}`, `auth: jwt.claims_to_headers: Host cannot be named`},
		{"", `auth: {basic: {users_file: "` + badUsers + `"}}`, `routes[0] (/a): auth: basic.users_file: ` + badUsers + ` line 2: user "bob": not a bcrypt hash`},
		{"", `auth: {basic: {}}`, `auth: basic.users_file: is required`},
		{"", `auth: {basic: {users_file: "` + users + `", realm: 3}}`, `auth: basic.realm: must be a string`},
		{"", `auth: {forward: {url: "ftp://auth/"}}`, `routes[0] (/a): auth: forward.url: must be an http:// or https:// URL`},
		{"", `auth: {forward: {url: "http://a/", max_concurrency: 0}}`, `auth: forward.max_concurrency: must be at least 1`},
		{"", `auth: {forward: {url: "http://a/", timeot: 1s}}`, `auth: forward.timeot: unknown key (did you mean timeout?)`},
		{"", `auth: {basic: {users_file: "` + users + `"}, forward: {url: "http://a/"}}`, `auth: must hold exactly one of basic, jwt, forward`},
		{"", `auth: {ldap: {}}`, `auth: ldap: unknown key`},
		{"", `auth: defaults`, `auth: must be "default" or a mapping`},
		{"", `auth: default`, `routes[0] (/a): auth: is "default" but server.auth_defaults is not set`},
		{"", `access: {allow: [10.0.0.0/33]}`, `routes[0] (/a): access.allow: item 0 ("10.0.0.0/33") must be an IP address`},
		{"", `access: {allow: [10.0.0.0/8], permit: [x]}`, `routes[0] (/a): access: permit: unknown key`},
		{"server:\n  auth_defaults: default\n", ``, `config.yaml: server.auth_defaults: cannot itself be "default"`},
		{"server:\n  auth_defaults: {jwt: {jwks_file: \"" + jwks + "\", algorithms: [HS1]}}\n", ``, `config.yaml: server.auth_defaults: jwt.algorithms: unknown algorithm "HS1"`},
	}
	for _, c := range cases {
		entry := `type: upstream, prefix: /a, target: "http://127.0.0.1:9001"`
		if c.auth != "" {
			entry += ", " + c.auth
		}
		_, err := loadStrings(c.config, route(entry))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s:\n got %v\nwant %s", c.config, c.auth, err, c.want)
		}
	}
}
