package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"toron/demo"
)

// TestSIGTERMWithOpenTunnel: on SIGTERM an open tunnel keeps working through drain_delay, is
// closed by the end of shutdown_timeout, the process exits 0 and the tunnel's access line is
// written.
func TestSIGTERMWithOpenTunnel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ws := demo.ServeWSEcho(ln, true) // the load test's raw echo: bytes back as they come
	t.Cleanup(func() { _ = ws.Close() })
	up := ws.Addr()
	cmd, stderr, base := startGateway(t, "  drain_delay: 1s\n  shutdown_timeout: 2s\n", "  access: true\n", "routes:\n"+upstreamRoute("/ws", up)+"    websocket: true\n")

	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	echo := func(msg string) error {
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		b := make([]byte, len(msg))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(br, b); err != nil {
			return err
		}
		if string(b) != msg {
			return fmt.Errorf("echo %q", b)
		}
		return nil
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := echo("during the drain delay"); err != nil {
		t.Errorf("tunnel during drain_delay: %v", err)
	}
	// Closed at the latest when shutdown_timeout (2s after the 1s delay) ends.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = br.ReadByte()
	closedAfter := time.Since(start)
	if err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("tunnel not closed by the shutdown: %v", err)
	}
	if closedAfter < 900*time.Millisecond || closedAfter > 6*time.Second {
		t.Errorf("tunnel closed %s after SIGTERM, want between drain_delay and drain_delay + shutdown_timeout", closedAfter)
	}
	waitExit0(t, exited(cmd), stderr)
	if log := stderr.String(); !strings.Contains(log, `"msg":"tunnel"`) || !strings.Contains(log, `"status":101`) {
		t.Errorf("no tunnel access line:\n%s", log)
	}
}
