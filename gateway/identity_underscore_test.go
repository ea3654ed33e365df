package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestUnderscoreIdentityHeadersDropped (SPEC 16): a request header that spells one of the
// identity headers with '_' for '-', in any case, never reaches the upstream, whatever
// trusted_proxies and the peer: upstreams that map header names to CGI variables
// (HTTP_X_FORWARDED_FOR) would take it for the real one. The request is served, and other
// headers with underscores pass.
func TestUnderscoreIdentityHeadersDropped(t *testing.T) {
	spoofed := []string{
		"X_Forwarded_For: 6.6.6.6", "x_real_ip: 6.6.6.7", "X_REAL_IP: 6.6.6.8", "X_Forwarded_Proto: gopher",
		"x_forwarded_host: evil.test", "X_Forwarded-Prefix: /admin", "X-Forwarded_For: 6.6.6.9", "x-real_ip: 6.6.6.10",
	}
	for name, server := range map[string]string{
		"no trusted proxies": "",
		"peer untrusted":     "trusted_proxies: [10.0.0.0/8]\n",
		"peer trusted":       "trusted_proxies: [127.0.0.1]\n",
	} {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t, nil)
			gw := startGateway(t, server, upstreamRoute("/api", up.addr, ""))
			req := "GET /api/x HTTP/1.1\r\nHost: example.test\r\n" + strings.Join(spoofed, "\r\n") + "\r\nX_Custom_Thing: kept\r\nConnection: close\r\n\r\n"
			if rr := rawRequest(t, gw.addr, req); rr.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200 (the request is served)", rr.StatusCode)
			}
			r := up.lastRequest()
			if r == nil {
				t.Fatal("the upstream saw no request")
			}
			for k, v := range r.Header {
				if strings.Contains(k, "_") && !strings.EqualFold(k, "X_Custom_Thing") {
					t.Errorf("the upstream got %s: %q", k, v)
				}
			}
			if got := headerValueFold(r.Header, "X_Custom_Thing"); got != "kept" {
				t.Errorf("X_Custom_Thing: %q, want kept", got)
			}
			if got := r.Header.Get("X-Real-IP"); got != "127.0.0.1" {
				t.Errorf("X-Real-IP: %q, want the peer", got)
			}
		})
	}
}

func headerValueFold(h http.Header, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
