package demo

import "fmt"

// TracingBanner is the banner's part about traces (SPEC 21): where they go when tracing is on
// (endpoint non-empty), else how to point the demo at an OpenTelemetry collector.
func TracingBanner(gatewayURL, endpoint string, ratio float64) string {
	if endpoint != "" {
		return fmt.Sprintf(`
Traces: OpenTelemetry spans of %[1]g of new requests go to %[2]s (OTLP/HTTP).
  curl -s -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' %[3]s/api/users
  continues that trace, sampled.
  Dropped spans (a collector slow or gone): toron_tracing_spans_dropped_total on /metrics.
`, ratio, endpoint, gatewayURL)
	}
	return `
Traces (OpenTelemetry, off): point the demo at a collector's OTLP/HTTP port (4318), e.g. an
OpenTelemetry Collector or Jaeger listening on 127.0.0.1:4318, and record every request:
  TORON_SERVER__TRACING__ENDPOINT=http://127.0.0.1:4318/v1/traces TORON_SERVER__TRACING__SAMPLE_RATIO=1 make run
`
}
