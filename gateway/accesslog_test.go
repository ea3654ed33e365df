package gateway

import (
	"testing"
)

func TestAccessLogLine(t *testing.T) {
	entries, up := accessLinesOf(t, "", "max_body_bytes: 10", 2, // health is not logged
		"POST /api/a?q=1 HTTP/1.1\r\nHost: a\r\nX-Request-Id: rid-7\r\nContent-Length: 5\r\n\r\nhello",
		"POST /api/a HTTP/1.1\r\nHost: a\r\nContent-Length: 50\r\n\r\n",
		"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
	first := entries[0].ContextMap()
	want := map[string]any{
		"request_id": "rid-7", "route": "/api", "method": "POST", "path": "/api/a",
		"status": int64(200), "bytes_in": int64(5), "bytes_out": int64(5), "reject_reason": "",
		"target": up.addr,
	}
	for k, v := range want {
		if first[k] != v {
			t.Errorf("%s = %#v, want %#v", k, first[k], v)
		}
	}
	for _, k := range []string{"duration", "upstream_header_wait", "remote"} {
		if _, ok := first[k]; !ok {
			t.Errorf("access line lacks %s", k)
		}
	}
	second := entries[1].ContextMap()
	if second["status"] != int64(413) || second["reject_reason"] != "body_too_large" || second["request_id"] == "" {
		t.Errorf("rejection line %v", second)
	}
}
