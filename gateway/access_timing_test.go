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
			if c.header == "" {
				benchmarkSmallGET(b, gw.addr, 200)
			} else {
				benchmarkSmallGET(b, gw.addr, 200, c.header, c.value)
			}
		})
	}
}

// BenchmarkAuthPaired measures what each access-control mechanism costs a small GET in CPU
// (SPEC 19's targets are CPU per request: a cached JWT at most 1.1x no auth, a cached basic
// credential 1.05x, forward auth to a fast local service 2x). A gateway without auth and one
// with it serve the same GET with the same credential header, in interleaved rounds
// (measureCPUPaired): cpu-ratio is the median over rounds of the process's CPU per request with
// auth over without, base-cpu-ns/req the median CPU per request without, and extra-allocs/req
// the heap allocations per request that auth adds. Client,
// gateways and upstream are one process, so the ratio is that of whole requests; for forward
// the auth service is in the process too, and its CPU (a second request served) is counted, as
// it would be on a machine where it runs beside the gateway. The credential is cached after the
// first request; forward auth calls the service on every request.
//
//	go test -run='^$' -bench=AuthPaired -benchtime=20000x ./gateway/
func BenchmarkAuthPaired(b *testing.B) {
	users := filepath.Join(b.TempDir(), "users")
	writeUsers(b, users, "alice", "pw")
	jwks, signTok := testJWKS(b)
	tok := signTok(jwt.MapClaims{"iss": "idp", "aud": "api", "sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	authSvc := startFastAuthService(b)
	for _, v := range []struct {
		name, route, header, value string
	}{
		{"basic", fmt.Sprintf("auth: {basic: {users_file: %q}}", users), "Authorization", basicCred("alice", "pw")},
		{"jwt", fmt.Sprintf("auth: {jwt: {jwks_file: %q, algorithms: [ES256], issuer: idp, audience: [api], claims_to_headers: {sub: X-User}}}", jwks), "Authorization", "Bearer " + tok},
		{"forward", fmt.Sprintf("auth: {forward: {url: \"http://%s/verify\", request_headers: [Authorization], upstream_headers: [X-User]}}", authSvc), "Authorization", "Bearer x"},
		{"access", "access: {allow: [127.0.0.0/8]}", "Authorization", "Bearer x"},
	} {
		b.Run(v.name, func(b *testing.B) {
			up := startFastUpstream(b)
			plain := startGatewayB(b, "", upstreamRoute("/api", up, ""), false)
			feat := startGatewayB(b, "", upstreamRoute("/api", up, v.route), false)
			send := []func() time.Duration{authPairedClient(b, plain.addr, v.header, v.value), authPairedClient(b, feat.addr, v.header, v.value)}
			measureCPUPaired(b, send)
		})
	}
}

// startFastAuthService is a forward-auth service answering 204 with X-User at once.
func startFastAuthService(tb testing.TB) string {
	tb.Helper()
	return serveFast(tb, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set("X-User", "alice")
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	}})
}

// authPairedClient returns a function sending one small GET with the header name: value on a
// keep-alive connection to addr and returning its latency.
func authPairedClient(b *testing.B, addr, name, value string) func() time.Duration {
	return timedGET(b, &fasthttp.HostClient{Addr: addr, MaxConns: 1}, name, value)
}
