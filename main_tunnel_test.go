package main

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

// startEchoWS is a raw WebSocket upstream: the handshake, then an echo of every byte.
func startEchoWS(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "+
					base64.StdEncoding.EncodeToString(sum[:])+"\r\n\r\n")
				io.Copy(c, br)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestSIGTERMWithOpenTunnel: on SIGTERM an open tunnel keeps working through drain_delay, is
// closed by the end of shutdown_timeout, the process exits 0 and the tunnel's access line is
// written.
func TestSIGTERMWithOpenTunnel(t *testing.T) {
	up := startEchoWS(t)
	port := testnet.FreePort(t)
	dir := t.TempDir()
	cfg := writeFile(t, dir, "config.yaml", fmt.Sprintf("server:\n  host: 127.0.0.1\n  port: %d\n  drain_delay: 1s\n  shutdown_timeout: 2s\nlog:\n  access: true\n", port))
	routes := writeFile(t, dir, "routes.yaml", fmt.Sprintf("routes:\n  - type: upstream\n    prefix: /ws\n    target: http://%s\n    websocket: true\n", up))
	cmd, stderr, _ := startBinary(t, cfg, routes, port)

	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
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
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if code := exitCode(err); code != 0 {
			t.Errorf("exit %d; stderr %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("gateway did not exit; stderr %s", stderr.String())
	}
	if log := stderr.String(); !strings.Contains(log, `"msg":"tunnel"`) || !strings.Contains(log, `"status":101`) {
		t.Errorf("no tunnel access line:\n%s", log)
	}
}
