package gateway

import (
	"crypto/tls"
	"testing"

	"toron/internal/testnet"

	"github.com/valyala/fasthttp"
)

// startTLSGatewayB is a TLS gateway in front of the fast upstream, and a client config that
// trusts it.
func startTLSGatewayB(b *testing.B) (*testGateway, *tls.Config) {
	pki := testnet.NewCA(b)
	_, certFile, keyFile := pki.IssueFiles(b, "gw", "gw.test")
	gw := startFastGatewayB(b, tlsServerYAML("", certFile, keyFile), "/api", "")
	return gw, &tls.Config{RootCAs: pki.Pool, ServerName: "gw.test"}
}

// BenchmarkTLSProxySmallGET is BenchmarkProxySmallGET over TLS (keep-alive): the record
// layer's cost per request, to set beside the plaintext one.
func BenchmarkTLSProxySmallGET(b *testing.B) {
	gw, cfg := startTLSGatewayB(b)
	benchmarkGET(b, &fasthttp.HostClient{Addr: gw.addr, IsTLS: true, TLSConfig: cfg, MaxConns: 1}, 200)
}

// BenchmarkTLSNewConn is one full TLS 1.3 handshake (ECDSA P-256, no resumption) and one
// proxied small GET per iteration: client and server sides both run in this process, so the
// number is an upper bound of the server's handshake cost.
func BenchmarkTLSNewConn(b *testing.B) {
	gw, cfg := startTLSGatewayB(b)
	cfg.ClientSessionCache = nil
	buf := make([]byte, 4096)
	req := []byte("GET /api/users HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := tls.Dial("tcp", gw.addr, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		n, err := c.Read(buf)
		if err != nil || n < 12 || string(buf[9:12]) != "200" {
			b.Fatalf("answer %q %v", buf[:n], err)
		}
		c.Close()
	}
}
