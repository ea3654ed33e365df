package gateway

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/valyala/fasthttp"
)

// The cost of access control on a small GET through the gateway (SPEC 19): a cached JWT and a
// cached basic credential against the same route without auth. Compare ns/op and allocs/op of
// the sub-benchmarks (go test -run='^$' -bench=AuthSmallGET -benchmem ./gateway/).

// benchmarkSmallGETWith is benchmarkSmallGET with one extra request header.
func benchmarkSmallGETWith(b *testing.B, addr, name, value string) {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1}
	defer hc.CloseIdleConnections()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/api/users")
	if name != "" {
		req.Header.Set(name, value)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := hc.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode() != 200 {
			b.Fatalf("status %d", resp.StatusCode())
		}
	}
}

func BenchmarkAuthSmallGET(b *testing.B) {
	up := startFastUpstream(b)
	users := filepath.Join(b.TempDir(), "users")
	writeUsers(b, users, "alice", "pw")
	jwks, signTok := testJWKS(b)
	tok := signTok(jwt.MapClaims{"iss": "idp", "aud": "api", "sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	cases := []struct {
		name, extra, header, value string
	}{
		{"none", "", "", ""},
		{"basic-cached", fmt.Sprintf("auth: {basic: {users_file: %q}}", users), "Authorization", basicCred("alice", "pw")},
		{"jwt-cached", fmt.Sprintf("auth: {jwt: {jwks_file: %q, algorithms: [ES256], issuer: idp, audience: [api], claims_to_headers: {sub: X-User}}}", jwks),
			"Authorization", "Bearer " + tok},
		{"access-list", "access: {allow: [127.0.0.0/8]}", "", ""},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			gw := startGatewayB(b, "", upstreamRoute("/api", up, c.extra), false)
			benchmarkSmallGETWith(b, gw.addr, c.header, c.value)
		})
	}
}
