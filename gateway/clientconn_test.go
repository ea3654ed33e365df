package gateway

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"toron/internal/testnet"
)

// TestSilentClientBeyondMaxConnectionsHoldsOnlyItself (SPEC 16): nothing reads from a client on
// the accept loop. At max_connections a new TLS connection is closed at once, without a
// handshake: fasthttp writes its 503 to a refused connection on the accept goroutine, and a TLS
// write runs the handshake, which waited there for a silent client's ClientHello (every accept
// stopped for handshake_timeout). The same with PROXY protocol in front of TLS.
func TestSilentClientBeyondMaxConnectionsHoldsOnlyItself(t *testing.T) {
	const handshakeTimeout = 3 * time.Second
	for name, proxied := range map[string]bool{"TLS": false, "PROXY protocol and TLS": true} {
		t.Run(name, func(t *testing.T) {
			pki := testnet.NewCA(t)
			_, certFile, keyFile := pki.IssueFiles(t, "gw", "127.0.0.1")
			server := "max_connections: 1\n"
			if proxied {
				server += "proxy_protocol: {enabled: true}\n"
			}
			server += tlsServerYAML("handshake_timeout: 3s\n", certFile, keyFile)
			up := startUpstream(t, nil)
			gw := startGateway(t, server, upstreamRoute("/api", up.addr, ""))
			dial := func() net.Conn {
				c, err := net.Dial("tcp", gw.addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				return c
			}
			// request sends one request over TLS on a new connection and returns its status.
			request := func() (int, error) {
				raw := dial()
				if proxied {
					if _, err := io.WriteString(raw, "PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r\n"); err != nil {
						return 0, err
					}
				}
				c := tls.Client(raw, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"})
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, "GET /api/x HTTP/1.1\r\nHost: example.test\r\n\r\n"); err != nil {
					return 0, err
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
				if err != nil {
					return 0, err
				}
				resp.Body.Close()
				return resp.StatusCode, nil
			}

			// A holds the one connection (idle keep-alive, after a request).
			a := dial()
			if proxied {
				_, _ = io.WriteString(a, "PROXY TCP4 203.0.113.8 10.0.0.1 1 443\r\n")
			}
			ac := tls.Client(a, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"})
			_ = ac.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(ac, "GET /api/a HTTP/1.1\r\nHost: example.test\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			if resp, err := http.ReadResponse(bufio.NewReader(ac), &http.Request{Method: "GET"}); err != nil || resp.StatusCode != 200 {
				t.Fatalf("first client: %v %v", resp, err)
			}
			// B is beyond max_connections and sends nothing: it is refused.
			b := dial()
			refused := make(chan time.Duration, 1)
			go func() {
				start := time.Now()
				_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, _ = b.Read(make([]byte, 1))
				refused <- time.Since(start)
			}()
			time.Sleep(200 * time.Millisecond) // B reaches the accept loop
			// A leaves; C, a new client, must be served at once, not after B's handshake timeout.
			_ = ac.Close()
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			var code int
			var err error
			for time.Since(start) < 2*handshakeTimeout {
				// Until A's worker is released, C may be refused as well (closed at once).
				if code, err = request(); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			wait := time.Since(start)
			t.Logf("a new client waited %s behind a silent one (handshake_timeout %s)", wait.Round(time.Millisecond), handshakeTimeout)
			if err != nil || code != 200 {
				t.Fatalf("new client: %d %v", code, err)
			}
			if wait > handshakeTimeout/2 {
				t.Errorf("a new client waited %s behind a silent one: the accept loop ran its handshake (handshake_timeout %s)", wait, handshakeTimeout)
			}
			select {
			case d := <-refused:
				if d > handshakeTimeout/2 {
					t.Errorf("the refused connection was closed after %s, want at once", d)
				}
			case <-time.After(10 * time.Second):
				t.Error("the refused connection is still open")
			}
		})
	}
}

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
