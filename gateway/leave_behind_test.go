package gateway

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"toron/internal/testnet"
)

// TestClientLeavingBytesBehindIsSeenLeaving (SPEC 5 and 16): on an elevated route, a client
// that closes its connection while its request waits for the upstream is noticed within about
// a second and the upstream request aborted, whatever it sent before leaving: a stray CRLF or
// a pipelined request in a later segment than its request, over TCP or TLS (whose close sends
// close_notify first). Unread bytes are not life: the FIN behind them is the end.
func TestClientLeavingBytesBehindIsSeenLeaving(t *testing.T) {
	for _, tc := range []struct {
		name    string
		overTLS bool
		extra   string
	}{
		{"TCP, stray CRLF", false, "\r\n"},
		{"TCP, pipelined request", false, "GET /slow/second HTTP/1.1\r\nHost: example.test\r\n\r\n"},
		{"TLS, nothing behind (close_notify)", true, ""},
		{"TLS, pipelined request", true, "GET /slow/second HTTP/1.1\r\nHost: example.test\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aborted := make(chan time.Time, 4)
			arrived := make(chan struct{}, 4)
			up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select {
				case <-r.Context().Done(): // the gateway closed the upstream connection
					aborted <- time.Now()
				case <-time.After(15 * time.Second):
				}
			})
			server := ""
			var pki *testnet.CA
			if tc.overTLS {
				pki = testnet.NewCA(t)
				_, certFile, keyFile := pki.IssueFiles(t, "gw", "127.0.0.1")
				server = tlsServerYAML("", certFile, keyFile)
			}
			gw := startGateway(t, server, upstreamRoute("/slow", up.addr, "max_concurrency: 4\nresponse_header_timeout: 30s"))
			var c net.Conn
			c, err := net.Dial("tcp", gw.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.overTLS {
				c = tls.Client(c, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"})
			}
			if _, err := io.WriteString(c, "GET /slow/first HTTP/1.1\r\nHost: example.test\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the request did not reach the upstream")
			}
			if tc.extra != "" {
				time.Sleep(50 * time.Millisecond) // a later segment
				if _, err := io.WriteString(c, tc.extra); err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			left := time.Now()
			_ = c.Close()
			select {
			case at := <-aborted:
				d := at.Sub(left)
				t.Logf("upstream request aborted %s after the client left", d.Round(time.Millisecond))
				if d > 3*time.Second {
					t.Errorf("the upstream request was aborted %s after the client left, want about 1s", d)
				}
			case <-time.After(8 * time.Second):
				t.Fatal("the client left, and the upstream request is still running after 8s")
			}
		})
	}
}
