// Package otlptest is a real OTLP/HTTP traces receiver on a loopback port, for the tests of
// the packages that export spans (tracing, and the gateway through it). Tests import it; no
// production code does.
package otlptest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Collector decodes each export request's protobuf body and keeps its spans, the resource
// attributes of the last one and its headers. A request that is not an export (a
// path other than /v1/traces, a content type other than application/x-protobuf, a body that
// does not decode) is answered 400 and kept nowhere.
type Collector struct {
	srv *httptest.Server

	mu       sync.Mutex
	spans    []*tracepb.Span
	resource []*commonpb.KeyValue
	headers  http.Header
}

// Start starts a Collector, closed when the test ends.
func Start(t testing.TB) *Collector {
	c := &Collector{headers: http.Header{}}
	c.srv = httptest.NewServer(http.HandlerFunc(c.export))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *Collector) export(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "bad export request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.headers = r.Header.Clone()
	for _, rs := range req.ResourceSpans {
		c.resource = rs.GetResource().GetAttributes()
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Endpoint is the URL to export to: the receiver's /v1/traces.
func (c *Collector) Endpoint() string { return c.srv.URL + "/v1/traces" }

// Spans is a copy of the spans received so far, in arrival order.
func (c *Collector) Spans() []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*tracepb.Span(nil), c.spans...)
}

// Resource is the resource attributes of the last export request.
func (c *Collector) Resource() []*commonpb.KeyValue {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resource
}

// Header is the header name of the last export request.
func (c *Collector) Header(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.headers.Get(name)
}
