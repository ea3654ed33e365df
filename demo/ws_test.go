package demo

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"
)

// clientFrame is a masked client frame (RFC 6455 5.3).
func clientFrame(op byte, payload []byte) []byte {
	mask := [4]byte{1, 2, 3, 4}
	f := []byte{0x80 | op}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	default:
		f = append(f, 0x80|126, byte(n>>8), byte(n))
	}
	f = append(f, mask[:]...)
	for i, b := range payload {
		f = append(f, b^mask[i%4])
	}
	return f
}

// wsHandshake opens a connection to addr (closed when the test ends, 10 s deadline) and
// completes a WebSocket handshake on /ws/, failing the test unless the answer is a 101 with
// the accept key of RFC 6455 1.3's example; it returns the connection and its reader.
func wsHandshake(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := testnet.Dial(t, addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /ws/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 || resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("handshake: %d %v", resp.StatusCode, resp.Header)
	}
	return c, br
}

func TestWSEcho(t *testing.T) {
	u := startUpstreams(t)
	c, br := wsHandshake(t, u.WS)
	big := bytes.Repeat([]byte("x"), 1000)
	for _, m := range []struct {
		op      byte
		payload []byte
		wantOp  byte
	}{{wsOpText, []byte("hello"), wsOpText}, {0x2, big, 0x2}, {wsOpPing, []byte("p"), wsOpPong}, {wsOpClose, []byte{3, 232}, wsOpClose}} {
		if _, err := c.Write(clientFrame(m.op, m.payload)); err != nil {
			t.Fatal(err)
		}
		h := make([]byte, 2)
		if _, err := io.ReadFull(br, h); err != nil {
			t.Fatal(err)
		}
		n := int(h[1] & 0x7f)
		if n == 126 {
			ext := make([]byte, 2)
			_, _ = io.ReadFull(br, ext)
			n = int(ext[0])<<8 | int(ext[1])
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(br, p); err != nil {
			t.Fatal(err)
		}
		if h[0] != 0x80|m.wantOp || h[1]&0x80 != 0 || !bytes.Equal(p, m.payload) {
			t.Errorf("op %x: got header %x, %d bytes", m.op, h, len(p))
		}
	}
	if _, err := br.ReadByte(); err == nil {
		t.Error("connection open after the close frame")
	}
}

func TestWSRefusesPlainHTTP(t *testing.T) {
	u := startUpstreams(t)
	resp, err := http.Get("http://" + u.WS + "/ws/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 426 || !strings.Contains(string(b), "WebSocket") {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
}

// The raw mode (the load test's tunnel upstream): the same handshake, then the bytes come back
// as they were sent, unframed; a request that is no upgrade (a relay's health check) is a 200.
func TestWSEchoRaw(t *testing.T) {
	e := ServeWSEcho(testnet.Listen(t), true)
	defer e.Close()

	resp, err := http.Get("http://" + e.Addr() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Errorf("plain request: %d %q, want 200 ok", resp.StatusCode, b)
	}

	c, br := wsHandshake(t, e.Addr())
	msg := bytes.Repeat([]byte("not a frame "), 1000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %v, %d bytes equal %v", err, len(got), bytes.Equal(got, msg))
	}
}
