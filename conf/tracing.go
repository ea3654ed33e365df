package conf

import (
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strings"
)

// Tracing is server.tracing (SPEC 21): OpenTelemetry traces exported over OTLP/HTTP
// (protobuf). Off while Endpoint is empty.
type Tracing struct {
	// Endpoint is the collector's OTLP/HTTP traces URL, http:// or https://
	// ("http://collector:4318/v1/traces"); a URL without a path gets /v1/traces. Empty (the
	// default): tracing is off, and requests are forwarded with their trace headers untouched.
	Endpoint string `koanf:"endpoint" json:"endpoint"`
	// SampleRatio is the share of new traces that are sampled, 0..1; default 0.01. A
	// continued trace follows its caller's sampled flag instead.
	SampleRatio float64 `koanf:"sample_ratio" json:"sample_ratio"`
	// ServiceName is the service.name of Toron's spans; default "toron".
	ServiceName string `koanf:"service_name" json:"service_name"`
	// TrustIncoming continues a request's valid traceparent (from a trusted peer when
	// trusted_proxies is set); false starts a new trace for every request. Default true.
	TrustIncoming bool `koanf:"trust_incoming" json:"trust_incoming"`
	// Headers are sent with every export request (an API key of a hosted collector); default
	// none. -check shows their names only.
	Headers map[string]string `koanf:"headers" json:"headers,omitempty"`
}

// Defaults of server.tracing.
const (
	// DefaultTracingSampleRatio records one new trace in a hundred: enough to follow slow
	// requests at any real traffic, cheap enough to leave on (SPEC 21).
	DefaultTracingSampleRatio = 0.01
	// DefaultTracingServiceName names Toron's spans in the trace backend.
	DefaultTracingServiceName = "toron"
	// DefaultTracingTrustIncoming continues the caller's trace: behind Toron's own edge the
	// caller is usually a service of the same system. An edge facing the internet sets
	// trusted_proxies (or trust_incoming: false) so that strangers cannot pick trace ids.
	DefaultTracingTrustIncoming = true
	// DefaultTracingPath is the OTLP/HTTP path of traces, added to an endpoint without a path.
	DefaultTracingPath = "/v1/traces"
)

// Enabled reports whether traces are exported.
func (t Tracing) Enabled() bool { return t.Endpoint != "" }

// MarshalJSON shows the header names without their values: they are usually credentials, and
// -check's output ends up in logs and tickets.
func (t Tracing) MarshalJSON() ([]byte, error) {
	type plain Tracing
	p := plain(t)
	if len(t.Headers) > 0 {
		p.Headers = make(map[string]string, len(t.Headers))
		for k := range t.Headers {
			p.Headers[k] = "(hidden)"
		}
	}
	return json.Marshal(p)
}

// decodeStringMap checks the YAML value of a mapping of names to string values (headers).
func decodeStringMap(v any) (map[string]string, error) {
	m, ok := asMap(v)
	if !ok {
		return nil, fmt.Errorf("must be %s, not %s", kindStrMap.describe(), yamlLiteral(v))
	}
	out := make(map[string]string, len(m))
	for _, k := range sortedKeys(m) {
		s, ok := m[k].(string)
		if !ok {
			return nil, fmt.Errorf("%s: must be a string, not %s", k, yamlLiteral(m[k]))
		}
		out[k] = s
	}
	return out, nil
}

// envStringMap parses "Name=value,Other=value" (the format of OTEL_EXPORTER_OTLP_HEADERS).
func envStringMap(s string) (map[string]string, error) {
	out := make(map[string]string)
	for _, item := range envList(s) {
		k, v, ok := strings.Cut(item, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("item %q must be Name=value", item)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// checkTracing validates server.tracing and completes its endpoint.
func (l *loader) checkTracing(cfg *Config) {
	t := &cfg.Server.Tracing
	const key = "server.tracing."
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "":
			l.configErr(key+"endpoint", `must be an http:// or https:// URL of an OTLP/HTTP collector ("http://collector:4318/v1/traces"), not %q`, t.Endpoint)
		case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
			l.configErr(key+"endpoint", "must have no query, fragment or user information, not %q (credentials go in headers)", t.Endpoint)
		case u.Path == "" || u.Path == "/":
			u.Path = DefaultTracingPath
			t.Endpoint = u.String()
		}
	}
	if math.IsNaN(t.SampleRatio) || t.SampleRatio < 0 || t.SampleRatio > 1 {
		l.configErr(key+"sample_ratio", "must be within 0..1 (0.01 samples one new trace in a hundred), not %v", t.SampleRatio)
	}
	if strings.TrimSpace(t.ServiceName) == "" {
		l.configErr(key+"service_name", "must not be empty (remove the key for %q)", DefaultTracingServiceName)
	}
	if len(t.Headers) == 0 {
		t.Headers = nil // the decoder makes an empty map of an absent key
	}
	names := make([]string, 0, len(t.Headers))
	for k := range t.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		switch {
		case !isToken(k):
			l.configErr(key+"headers", "%q is not a header name", k)
		case strings.ContainsAny(t.Headers[k], "\r\n\x00"):
			l.configErr(key+"headers."+k, "must not hold CR, LF or NUL")
		}
	}
}

// tracingWarnings: keys of server.tracing set without an endpoint do nothing.
func (c *Config) tracingWarnings() []string {
	t := c.Server.Tracing
	if !t.Enabled() && len(t.Headers) > 0 {
		return []string{c.ConfigFile + ": server.tracing: headers are set but endpoint is not: tracing is off"}
	}
	return nil
}
