package conf

import (
	"errors"
	"strings"
	"testing"
	"time"
	"toron/internal/testnet"
)

// TestTrafficKeys: SPEC 20's route keys load with their defaults and show in -check.
func TestTrafficKeys(t *testing.T) {
	t.Parallel()
	cfg, err := loadStrings("", `routes:
  - {type: redirect, prefix: /old, to: "https://{host}/new{uri}"}
  - {type: redirect, prefix: /tmp, host: a.example.com, to: "/elsewhere?from={path}&{query}", status: 302}
  - type: upstream
    prefix: /api
    target: "http://127.0.0.1:9001"
    methods: [GET, PUT]
    https_only: true
    request_headers: {set: {X-Env: prod, X-Client: "{client_ip}"}, add: {X-Trace: "{request_id} {route}"}, remove: [Cookie]}
    response_headers: {remove: [Server], set: {Strict-Transport-Security: "max-age=63072000"}}
    cors: {allow_origins: ["https://App.example.com"], allow_credentials: true, expose_headers: [X-Total]}
    compress: true
  - type: upstream
    prefix: /json
    target: "http://127.0.0.1:9001"
    cors: {allow_origins: ["*"], max_age: 1h, allow_methods: [GET, DELETE], allow_headers: [Content-Type]}
    compress: {encodings: [gzip, zstd], min_bytes: 2KiB, types: [application/json, text/event-stream]}
  - {type: upstream, prefix: /plain, target: "http://127.0.0.1:9001", compress: false}
`)
	if err != nil {
		t.Fatal(err)
	}
	old, tmp, api, js, plain := cfg.Routes[0].Effective.Traffic, cfg.Routes[1].Effective.Traffic, cfg.Routes[2].Effective.Traffic, cfg.Routes[3].Effective.Traffic, cfg.Routes[4].Effective.Traffic
	if old == nil || old.Redirect == nil || old.Redirect.Status != DefaultRedirectStatus || old.Redirect.To.String() != "https://{host}/new{uri}" {
		t.Fatalf("redirect defaults: %+v", old)
	}
	if cfg.Routes[0].Effective.Targets != nil {
		t.Error("a redirect route got targets")
	}
	if tmp.Redirect.Status != 302 || !tmp.Redirect.To.Uses(PlaceholderQuery) {
		t.Errorf("redirect: %+v", tmp.Redirect)
	}
	if !api.HTTPSOnly || len(api.RequestHeaders.Set) != 2 || api.RequestHeaders.Set[0].Name != "X-Client" || len(api.RequestHeaders.Add) != 1 || api.RequestHeaders.Remove[0] != "Cookie" {
		t.Errorf("request_headers: %+v", api.RequestHeaders)
	}
	if c := api.CORS; c.AllowOrigins[0] != "https://app.example.com" || !c.AllowCredentials || c.MaxAge != DefaultCORSMaxAge || strings.Join(c.AllowMethods, ",") != "GET,PUT" {
		t.Errorf("cors defaults: %+v", c)
	}
	if c := api.Compress; strings.Join(c.Encodings, ",") != "zstd,br,gzip" || c.MinBytes != 1024 || len(c.Types) != len(DefaultCompressTypes) {
		t.Errorf("compress: true: %+v", c)
	}
	if c := js.CORS; !c.AnyOrigin() || c.MaxAge != time.Hour || strings.Join(c.AllowMethods, ",") != "GET,DELETE" {
		t.Errorf("cors: %+v", c)
	}
	if c := js.Compress; strings.Join(c.Encodings, ",") != "gzip,zstd" || c.MinBytes != 2048 || strings.Join(c.Types, ",") != "application/json,text/event-stream" {
		t.Errorf("compress: %+v", c)
	}
	if plain != nil {
		t.Errorf("compress: false left rules: %+v", plain)
	}
	checkJSONHas(t, cfg, `"redirect":{"to":"https://{host}/new{uri}","status":308}`, `"https_only":true`, `{"name":"X-Client","value":"{client_ip}"}`, `"max_age":"10m"`, `"max_age":"1h"`, `"encodings":["zstd","br","gzip"]`, `"min_bytes":2048`)
}

// TestTrafficValidation: each mistake names the file, route, prefix and key.
func TestTrafficValidation(t *testing.T) {
	t.Parallel()
	const up = `type: upstream, prefix: /p, target: "http://127.0.0.1:9001", `
	const rd = `type: redirect, prefix: /p, `
	cases := []struct{ entry, key, msg string }{
		{rd + `status: 308`, "to", "is required"},
		{rd + `to: "https://{host}{uri}", status: 200`, "status", "301, 302, 303, 307 or 308"},
		{rd + `to: "https://{host}{url}"`, "to", "unknown placeholder {url}"},
		{rd + `to: "https://{host}{uri"`, "to", "not closed"},
		{rd + `to: "https://{client_ip}/"`, "to", "unknown placeholder {client_ip}"},
		{rd + `to: "example.com{uri}"`, "to", "must start with"},
		{rd + `to: "//example.com{uri}"`, "to", "scheme-relative"},
		{rd + `to: "https:///x"`, "to", "names no host"},
		{rd + "to: \"https://a/\\r\\nX: y\"", "to", "control characters"},
		{rd + `to: "https://a{uri}", target: "http://127.0.0.1:9001"`, "target", "does not apply to a redirect route"},
		{rd + `to: "https://a{uri}", compress: true`, "compress", "does not apply"},
		{rd + `to: "https://a{uri}", rate_limit: {requests_per_second: 5}`, "rate_limit", "does not apply"},
		{up + `to: "https://a/"`, "to", "only applies with type: redirect"},
		{up + `status: 301`, "status", "only applies with type: redirect"},
		{up + `https_only: yes`, "https_only", "true or false"},
		{up + `request_headers: {set: {Host: x}}`, "request_headers.set.Host", "cannot be named"},
		{up + `request_headers: {add: {X-Forwarded-For: x}}`, "request_headers.add.X-Forwarded-For", "client-identity"},
		{up + `response_headers: {remove: [Transfer-Encoding]}`, "response_headers.remove", "cannot be named"},
		{up + `response_headers: {set: {Connection: close}}`, "response_headers.set.Connection", "hop-by-hop"},
		{up + `request_headers: {set: {Content-Length: "1"}}`, "request_headers.set.Content-Length", "frames the body"},
		{up + `request_headers: {set: {Forwarded: x}}`, "request_headers.set.Forwarded", "cannot be named"},
		{up + `request_headers: {set: {X-Real-IP: x}}`, "request_headers.set.X-Real-IP", "cannot be named"},
		{up + `request_headers: {set: {"Bad Name": x}}`, "request_headers.set.Bad Name", "not a header name"},
		{up + `request_headers: {set: {X-A: "{uri}"}}`, "request_headers.set.X-A", "unknown placeholder {uri}"},
		{up + `request_headers: {set: {X-A: 5}}`, "request_headers.set.X-A", "must be a string"},
		{up + `request_headers: {set: {X-A: a, x-a: b}}`, "request_headers.set.x-a", "same header"},
		{up + `request_headers: {replace: {X-A: a}}`, "request_headers.replace", "unknown key"},
		{up + `request_headers: [X-A]`, "request_headers", "must be a mapping"},
		{up + `cors: {allow_origins: ["*"], allow_credentials: true}`, "cors.allow_credentials", `allow_origins ["*"] is refused`},
		{up + `cors: {allow_methods: [GET]}`, "cors.allow_origins", "is required"},
		{up + `cors: {allow_origins: ["https://a.example.com/app"]}`, "cors.allow_origins[0]", "scheme://host[:port] only"},
		{up + `cors: {allow_origins: [a.example.com]}`, "cors.allow_origins[0]", "must be an origin"},
		{up + `cors: {allow_origins: ["*", "https://a"]}`, "cors.allow_origins", "list it alone"},
		{up + `cors: {allow_origins: ["*"], max_age: -1s}`, "cors.max_age", "negative"},
		{up + `cors: {allow_origins: ["*"], max_age: 1500ms}`, "cors.max_age", "whole seconds"},
		{up + `cors: {allow_origins: ["*"], allow_methods: [get]}`, "cors.allow_methods", "upper case"},
		{up + `cors: {allow_origins: ["*"], maxage: 1s}`, "cors.maxage", "did you mean max_age"},
		{up + `compress: {encodings: [deflate]}`, "compress.encodings", "not one of zstd, br, gzip"},
		{up + `compress: {encodings: [gzip, GZIP]}`, "compress.encodings", "twice"},
		{up + `compress: {encodings: []}`, "compress.encodings", "at least one"},
		{up + `compress: {min_bytes: -1}`, "compress.min_bytes", "negative"},
		{up + `compress: {types: [json]}`, "compress.types", "not a media type"},
		{up + `compress: yes`, "compress", "must be a mapping"},
	}
	for _, c := range cases {
		oneRouteError(t, route(c.entry), "/p", c.key, c.msg)
	}
}

// TestHTTPRedirectListener: server.tls.http_redirect loads, is checked, and its port cannot
// change on reload.
func TestHTTPRedirectListener(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c1, k1 := testnet.SelfSigned(t, dir, "a", []string{"a.example.com"}, time.Now().Add(24*time.Hour))
	base := tlsConfig(c1, k1)
	cfg := mustLoad(t, base+"    http_redirect: {port: 8081}\n", okRoute)
	if h := cfg.Server.TLS.HTTPRedirect; h == nil || h.Port != 8081 || h.Status != DefaultRedirectStatus {
		t.Fatalf("http_redirect = %+v", h)
	}
	for _, c := range []struct{ extra, msg string }{
		{"    http_redirect: {status: 301}\n", "server.tls: http_redirect.port: is required"},
		{"    http_redirect: {port: 8080}\n", "server.tls: http_redirect.port: must differ from server.port"},
		{"    http_redirect: {port: 70000}\n", "http_redirect.port: must be between 1 and 65535"},
		{"    http_redirect: {port: 80, status: 200}\n", "http_redirect.status: must be 301"},
		{"    http_redirect: {port: 80, code: 301}\n", "http_redirect.code: unknown key"},
		{"    http_redirect: 80\n", "http_redirect: must be a mapping"},
	} {
		_, err := loadStrings(base+c.extra, okRoute)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: got %v, want %q", c.extra, err, c.msg)
		}
	}
	moved := mustLoad(t, base+"    http_redirect: {port: 8082, status: 301}\n", okRoute)
	err := moved.ReloadCompatible(cfg)
	var ce *Error
	if !errors.As(err, &ce) || ce.Key != "server.tls.http_redirect.port" {
		t.Fatalf("reload with a new port: %v", err)
	}
	same := mustLoad(t, base+"    http_redirect: {port: 8081, status: 301}\n", okRoute)
	if err := same.ReloadCompatible(cfg); err != nil {
		t.Fatalf("a new status must reload: %v", err)
	}
}

// templateValues is a fixed set of request values.
type templateValues map[Placeholder]string

func (v templateValues) AppendPlaceholder(dst []byte, p Placeholder) []byte {
	return append(dst, v[p]...)
}

var sampleValues = templateValues{
	PlaceholderHost: "a.example.com", PlaceholderURI: "/x/y?q=1", PlaceholderPath: "/x/y", PlaceholderQuery: "q=1",
	PlaceholderScheme: "http", PlaceholderClientIP: "192.0.2.7", PlaceholderRequestID: "rid-1", PlaceholderRoute: "api",
}

// expandReference is the obvious, allocating expansion the compiled template must agree with.
func expandReference(s string, allowed []Placeholder, v templateValues) (string, bool) {
	var out strings.Builder
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "{{"):
			out.WriteByte('{')
			i += 2
		case s[i] == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", false
			}
			p := lookupPlaceholder(s[i+1 : i+end])
			if p == 0 || !containsPlaceholder(allowed, p) {
				return "", false
			}
			out.WriteString(v[p])
			i += end + 1
		default:
			out.WriteByte(s[i])
			i++
		}
	}
	return out.String(), true
}

func TestTemplate(t *testing.T) {
	cases := []struct{ in, want string }{
		{"https://{host}{uri}", "https://a.example.com/x/y?q=1"},
		{"{scheme}://{host}/new{path}?{query}", "http://a.example.com/new/x/y?q=1"},
		{"plain", "plain"},
		{"", ""},
		{"{{literal}", "{literal}"},
		{"a}b", "a}b"},
	}
	for _, c := range cases {
		tm, err := CompileTemplate(c.in, redirectPlaceholders)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if got := string(tm.Append(nil, sampleValues)); got != c.want {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
	tm, _ := CompileTemplate("{client_ip} via {route} ({request_id}) for {host}", headerPlaceholders)
	buf := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(100, func() { buf = tm.Append(buf[:0], sampleValues) })
	if allocs != 0 {
		t.Errorf("Append allocates %.1f times", allocs)
	}
	if string(buf) != "192.0.2.7 via api (rid-1) for a.example.com" {
		t.Errorf("header template: %q", buf)
	}
	if _, err := CompileTemplate("{uri}", headerPlaceholders); err == nil {
		t.Error("{uri} accepted in a header value")
	}
}

// TestTemplateBind: {route} bound at load leaves a literal, or the other placeholders in
// place; Single names a template that is one placeholder alone.
func TestTemplateBind(t *testing.T) {
	for _, c := range []struct {
		in, want string
		literal  bool
		single   Placeholder
	}{
		{"{route}", "api", true, 0},
		{"via {route}/{route}!", "via api/api!", true, 0},
		{"{client_ip} via {route}", "192.0.2.7 via api", false, 0},
		{"{client_ip}", "192.0.2.7", false, PlaceholderClientIP},
		{"{request_id}", "rid-1", false, PlaceholderRequestID},
		{"plain", "plain", true, 0},
	} {
		tm, err := CompileTemplate(c.in, headerPlaceholders)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		b := tm.Bind(PlaceholderRoute, "api")
		if got := string(b.Append(nil, sampleValues)); got != c.want {
			t.Errorf("%q bound: %q, want %q", c.in, got, c.want)
		}
		if lit, ok := b.Literal(); ok != c.literal || ok && lit != c.want {
			t.Errorf("%q bound: Literal %q %v", c.in, lit, ok)
		}
		if p, ok := b.Single(); p != c.single || ok != (c.single != 0) {
			t.Errorf("%q bound: Single %v %v", c.in, p, ok)
		}
		if b.String() != c.in { // -check shows the template as written
			t.Errorf("%q bound: shown as %q", c.in, b.String())
		}
	}
}

func FuzzTemplate(f *testing.F) {
	for _, s := range []string{"https://{host}{uri}", "{scheme}://{host}/{path}?{query}", "{{x}}", "{", "}{", "{client_ip}", "a{host", "{{{host}}}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		all := append(append([]Placeholder{}, redirectPlaceholders...), headerPlaceholders...)
		tm, err := CompileTemplate(s, all)
		want, ok := expandReference(s, all, sampleValues)
		if (err == nil) != ok {
			t.Fatalf("%q: compile error %v, reference ok %v", s, err, ok)
		}
		if err != nil {
			return
		}
		if got := string(tm.Append(nil, sampleValues)); got != want {
			t.Fatalf("%q: %q, reference %q", s, got, want)
		}
		if tm.String() != s {
			t.Fatalf("String() = %q", tm.String())
		}
	})
}
