package gateway

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"toron/internal/testnet"
	"toron/socket"
)

// TestTunnelStalledSideEnds (SPEC 15): a side that takes no byte of a pending write for the
// route's write_timeout ends the tunnel, both sides closed, over TLS as over TCP, toward the
// client as toward the upstream, and the gateway spends no CPU meanwhile (crypto/tls keeps a
// write deadline's error: a copy loop that retried would spin).
func TestTunnelStalledSideEnds(t *testing.T) {
	const writeTimeout, idle = time.Second, 10 * time.Second
	for _, side := range []string{"client", "upstream"} {
		for _, overTLS := range []bool{false, true} {
			name := side + " stalls over TCP"
			if overTLS {
				name = side + " stalls over TLS"
			}
			t.Run(name, func(t *testing.T) {
				testTunnelStall(t, side == "client", overTLS, writeTimeout, idle)
			})
		}
	}
}

func testTunnelStall(t *testing.T, clientStalls, overTLS bool, writeTimeout, idle time.Duration) {
	pki := testnet.NewCA(t)
	cert, certFile, keyFile := pki.IssueFiles(t, "gw", "127.0.0.1")
	flood := make([]byte, 16<<10)

	// The upstream: a WebSocket handshake, then a flood toward the client (the client stalls)
	// or no read at all (the upstream stalls). upClosed is closed when its connection ends.
	rawLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := rawLn
	if overTLS {
		ln = tls.NewListener(rawLn, &tls.Config{Certificates: []tls.Certificate{cert}})
	}
	upClosed := make(chan struct{})
	upConn := make(chan net.Conn, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			close(upClosed)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		head, err := readHead(br)
		if err != nil {
			close(upClosed)
			return
		}
		if _, err := io.WriteString(c, switchingHead(head)); err != nil {
			close(upClosed)
			return
		}
		if !clientStalls {
			// Stall: read nothing until the test looks (after the tunnel ended).
			upConn <- c
			<-stop
			return
		}
		for {
			if _, err := c.Write(flood); err != nil {
				close(upClosed)
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); _ = ln.Close(); wg.Wait() })

	target := "http://" + rawLn.Addr().String()
	extra := fmt.Sprintf("write_timeout: %s\ntunnel_idle_timeout: %s\n", writeTimeout, idle)
	if overTLS {
		target = "https://" + rawLn.Addr().String()
		extra += "tls_ca_file: " + pki.CAFile + "\n"
	}
	server := ""
	if overTLS {
		server = tlsServerYAML("", certFile, keyFile)
	}
	tg := startGateway(t, server, fmt.Sprintf("- type: upstream\n  prefix: /ws\n  target: %s\n  websocket: true\n%s", target, indent(extra, "  ")))

	var c net.Conn
	c, err = net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	if overTLS {
		c = tls.Client(c, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"})
	}
	defer c.Close()
	if _, err := io.WriteString(c, upgradeRequest("/ws")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	clientDone := make(chan error, 1)
	if !clientStalls {
		go func() {
			for {
				if _, err := c.Write(flood); err != nil {
					clientDone <- err
					return
				}
			}
		}()
	}

	waitTunnels(t, tg.g, 1)
	start, cpu0 := time.Now(), testnet.CPUSeconds(t)
	limit := idle + 4*time.Second
	ended := testnet.WaitUntil(limit, func() bool { return tg.g.tunnels.count.Load() == 0 })
	wall, cpu := time.Since(start), testnet.CPUSeconds(t)-cpu0
	t.Logf("tunnel ended: %v after %s; CPU %.3f s over it, %.3f CPU-s per s", ended, wall.Round(10*time.Millisecond), cpu, cpu/wall.Seconds())
	if !ended {
		t.Fatalf("the stalled tunnel is still open after %s (write_timeout %s, tunnel_idle_timeout %s)", limit, writeTimeout, idle)
	}
	if wall > idle-time.Second {
		t.Errorf("the stalled tunnel ended after %s, want write_timeout %s after the stall, well before tunnel_idle_timeout %s", wall, writeTimeout, idle)
	}
	if per := cpu / wall.Seconds(); per > 0.15 {
		t.Errorf("%.3f CPU-s per s while the tunnel stalled, want next to none", per)
	}
	// Both sides closed: the upstream's connection ends, the client reads its end.
	if clientStalls {
		select {
		case <-upClosed:
		case <-time.After(5 * time.Second):
			t.Error("the upstream connection is still open after the tunnel ended")
		}
	} else {
		uc := <-upConn
		_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, uc); err != nil && socket.IsTimeout(err) {
			t.Errorf("the upstream connection is still open after the tunnel ended: %v", err)
		}
	}
	if clientStalls {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, br); err != nil && socket.IsTimeout(err) {
			t.Errorf("the client connection is still open after the tunnel ended: %v", err)
		}
	} else {
		select {
		case <-clientDone:
		case <-time.After(5 * time.Second):
			t.Error("the client connection is still open after the tunnel ended")
		}
	}
}
