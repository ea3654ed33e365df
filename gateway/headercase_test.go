package gateway

import (
	"bufio"
	"net"
	"strings"
	"testing"
)

// TestHeaderNamesGoUpstreamCanonical: header names reach the upstream in canonical form
// (X-Custom-Header), whatever case the client used; values are byte for byte. HTTP field names
// are case-insensitive (RFC 9110 5.1), and one spelling upstream means one rule for every
// legacy backend that compares them case-sensitively. Documented in the README's forwarded
// headers.
func TestHeaderNamesGoUpstreamCanonical(t *testing.T) {
	heads := make(chan string, 1)
	addr := startScriptedUpstream(t, func(c net.Conn, br *bufio.Reader) {
		var b strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			b.WriteString(line)
			if line == "\r\n" {
				break
			}
		}
		heads <- b.String()
		answer(c, "ok")
	})
	gw := startGateway(t, "", upstreamRoute("/", addr, ""))
	resp := rawRequest(t, gw.addr, "GET / HTTP/1.1\r\nHost: a\r\nx-custom-HEADER: MiXeD value\r\naccept: */*\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	head := <-heads
	for _, want := range []string{"\r\nX-Custom-Header: MiXeD value\r\n", "\r\nAccept: */*\r\n", "\r\nHost: a\r\n"} {
		if !strings.Contains(head, want) {
			t.Errorf("upstream head lacks %q:\n%s", want, head)
		}
	}
}
