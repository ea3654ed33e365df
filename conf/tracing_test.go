package conf

import (
	"strings"
	"testing"
)

func TestTracingDefaults(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, "", okRoute)
	tr := cfg.Server.Tracing
	if tr.Enabled() || tr.SampleRatio != 0.01 || tr.ServiceName != "toron" || !tr.TrustIncoming || tr.Headers != nil {
		t.Errorf("defaults: %+v", tr)
	}
	out, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"tracing": {`) || !strings.Contains(string(out), `"sample_ratio": 0.01`) {
		t.Errorf("-check lacks server.tracing:\n%s", out)
	}
}

func TestTracingKeys(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `server:
  tracing:
    endpoint: "http://collector:4318"
    sample_ratio: 0.5
    service_name: edge
    trust_incoming: false
    headers: {X-Api-Key: secret-value, Authorization: "Bearer t"}
`, okRoute)
	tr := cfg.Server.Tracing
	if tr.Endpoint != "http://collector:4318/v1/traces" {
		t.Errorf("endpoint %q: want the OTLP traces path added", tr.Endpoint)
	}
	if tr.SampleRatio != 0.5 || tr.ServiceName != "edge" || tr.TrustIncoming || tr.Headers["X-Api-Key"] != "secret-value" || len(tr.Headers) != 2 {
		t.Errorf("tracing = %+v", tr)
	}
	out, err := cfg.CheckJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "secret-value") || !strings.Contains(string(out), `"X-Api-Key": "(hidden)"`) {
		t.Errorf("-check shows a header value, or not its name:\n%s", out)
	}
	// A path is kept as written; the environment sets any key, headers as Name=value pairs.
	cfg = mustLoad(t, "server:\n  tracing: {endpoint: \"https://otlp.example.com/otlp/v1/traces\"}\n", okRoute,
		"TORON_SERVER__TRACING__SAMPLE_RATIO=1", "TORON_SERVER__TRACING__HEADERS=a=1, b = 2")
	tr = cfg.Server.Tracing
	if tr.Endpoint != "https://otlp.example.com/otlp/v1/traces" || tr.SampleRatio != 1 || tr.Headers["a"] != "1" || tr.Headers["b"] != "2" || !tr.TrustIncoming {
		t.Errorf("tracing = %+v", tr)
	}
}

func TestTracingErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ config, want string }{
		"ratio above 1":   {"server:\n  tracing: {endpoint: \"http://c:4318\", sample_ratio: 1.5}\n", "config.yaml: server.tracing.sample_ratio: must be within 0..1"},
		"ratio negative":  {"server:\n  tracing: {sample_ratio: -0.1}\n", "server.tracing.sample_ratio: must be within 0..1"},
		"ratio text":      {"server:\n  tracing: {sample_ratio: half}\n", `config.yaml: server.tracing: sample_ratio: must be a number, not "half"`},
		"grpc endpoint":   {"server:\n  tracing: {endpoint: \"grpc://c:4317\"}\n", `config.yaml: server.tracing.endpoint: must be an http:// or https:// URL`},
		"no scheme":       {"server:\n  tracing: {endpoint: \"collector:4318\"}\n", `server.tracing.endpoint: must be an http:// or https:// URL`},
		"no host":         {"server:\n  tracing: {endpoint: \"http:///v1/traces\"}\n", `server.tracing.endpoint: must be an http:// or https:// URL`},
		"credentials":     {"server:\n  tracing: {endpoint: \"http://u:p@c:4318/v1/traces\"}\n", `server.tracing.endpoint: must have no query, fragment or user information`},
		"unknown key":     {"server:\n  tracing: {endpoint: \"http://c:4318\", ratio: 1}\n", "config.yaml: server.tracing: ratio: unknown key"},
		"bad header name": {"server:\n  tracing: {endpoint: \"http://c:4318\", headers: {\"a b\": x}}\n", `server.tracing.headers: "a b" is not a header name`},
		"header not text": {"server:\n  tracing: {endpoint: \"http://c:4318\", headers: {a: 1}}\n", "server.tracing: headers: a: must be a string, not the number 1"},
		"headers list":    {"server:\n  tracing: {headers: [a]}\n", "server.tracing: headers: must be a mapping of names to strings, not a list"},
		"empty service":   {"server:\n  tracing: {service_name: \"\"}\n", "server.tracing.service_name: must not be empty"},
		"not a mapping":   {"server:\n  tracing: on\n", "config.yaml: server.tracing: must be a mapping with the keys endpoint, headers, sample_ratio, service_name, trust_incoming"},
	} {
		_, err := loadStrings(tc.config, okRoute)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v\nwant it to contain %q", name, err, tc.want)
		}
	}
	if _, err := loadStrings("", okRoute, "TORON_SERVER__TRACING__SAMPLE_RATIO=2"); err == nil || !strings.Contains(err.Error(), "environment: TORON_SERVER__TRACING__SAMPLE_RATIO: must be within 0..1") {
		t.Errorf("env: err = %v", err)
	}
	cfg := mustLoad(t, "server:\n  tracing: {headers: {a: b}}\n", okRoute)
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "tracing is off") {
		t.Errorf("warnings %q, want one saying tracing is off", cfg.Warnings)
	}
}
