package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"toron/demo"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The tunnel scenario (SPEC 15): WebSocket tunnels through the gateway, measured three ways in
// one run:
//   - echo throughput through a tunnel against the plain TCP relay (relay.go) in front of the
//     same echo upstream, interleaved rounds, medians (target: tunnel >= 0.9 x relay);
//   - memory per idle tunnel: the gateway's RSS growth over -tunnels open idle tunnels, divided
//     by their number (target: <= 32 KiB);
//   - /api p99 with those tunnels open against none (target: within 1.2 x).
//
// The echo upstream (demo.ServeWSEcho, raw: the demo's echo without framing) answers the
// WebSocket handshake, then echoes raw bytes: a tunnel is byte-transparent, so framing would
// only cost the client and the upstream. The same handshake goes through the relay, which
// parses nothing.
//
// The ws-echo helper is the demo's client: one handshake, one masked text frame, its echo.

const (
	wsKeyExample = "dGhlIHNhbXBsZSBub25jZQ=="
	// tunnelEchoConns is the number of tunnels (or relay connections) of one throughput round.
	tunnelEchoConns = 4
)

// dialWS opens a connection to hostport and completes a WebSocket handshake for path.
func dialWS(hostport, path string) (net.Conn, *bufio.Reader, error) {
	c, err := net.DialTimeout("tcp", hostport, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET " + path + " HTTP/1.1\r\nHost: " + hostport + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + wsKeyExample + "\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, nil, err
	}
	br := bufio.NewReaderSize(c, 64<<10)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, nil, fmt.Errorf("loadtest: handshake answered %s", resp.Status)
	}
	_ = c.SetDeadline(time.Time{})
	return c, br, nil
}

// echoRound sends bytesPerConn on each of conns tunnels at once, reads every byte back, and
// returns the echoed MB/s (both directions counted once: the bytes that went there and back).
func echoRound(hostport, path string, conns int, bytesPerConn int64) (float64, error) {
	type end struct {
		n   int64
		err error
	}
	ends := make(chan end, conns)
	start := time.Now()
	for range conns {
		go func() {
			c, br, err := dialWS(hostport, path)
			if err != nil {
				ends <- end{err: err}
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 64<<10)
				for left := bytesPerConn; left > 0; {
					n, err := c.Write(buf[:min(int64(len(buf)), left)])
					left -= int64(n)
					if err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			got, err := io.CopyN(io.Discard, br, bytesPerConn)
			if werr := <-done; err == nil {
				err = werr
			}
			ends <- end{n: got, err: err}
		}()
	}
	var total int64
	var firstErr error
	for range conns {
		e := <-ends
		total += e.n
		if e.err != nil && firstErr == nil {
			firstErr = e.err
		}
	}
	return float64(total) / 1e6 / time.Since(start).Seconds(), firstErr
}

// tunnelScenario runs the three measurements.
func tunnelScenario(o options) error {
	dir, err := o.subdir("tunnel-toron")
	if err != nil {
		return err
	}
	// The echo upstream is a process of its own: 2,000 idle tunnels hold 2,000 of its
	// connections, which must not weigh on the client that measures /api here.
	echo, err := startHelper(dir, "ws-upstream")
	if err != nil {
		return err
	}
	defer echo.Stop()
	echoAddr := echo.Addr()
	api, gw, err := startBehindUpstream(func(upstream string) (*Toron, error) {
		return StartToron(o.toron, dir, RouteOptions{Upstream: upstream, ReportsMaxConcurrency: o.bulkhead, WSUpstream: echoAddr, MaxTunnels: o.tunnels + 64})
	})
	if err != nil {
		return err
	}
	defer api.Close()
	stopped := false
	defer func() {
		if !stopped {
			gw.Stop()
		}
	}()
	rl, err := startTCPRelay(dir, echoAddr)
	if err != nil {
		return err
	}
	defer rl.Stop()
	gwHost := gw.Addr()
	rlHost := rl.Addr()
	fmt.Printf("loadtest tunnel: echo upstream %s, gateway %s (pid %d), tcp relay %s (files in %s)\n", echoAddr, gw.URL(), gw.PID(), rl.URL(), dir)

	// 1. Throughput, interleaved rounds.
	var toronMBps, relayMBps []float64
	for round := 1; round <= o.rounds; round++ {
		t, err := echoRound(gwHost, "/ws/echo", tunnelEchoConns, o.tunnelBytes)
		if err != nil {
			return fmt.Errorf("loadtest: tunnel round %d: %w", round, err)
		}
		r, err := echoRound(rlHost, "/ws/echo", tunnelEchoConns, o.tunnelBytes)
		if err != nil {
			return fmt.Errorf("loadtest: relay round %d: %w", round, err)
		}
		toronMBps, relayMBps = append(toronMBps, t), append(relayMBps, r)
		fmt.Printf("  round %d: tunnel %.0f MB/s, relay %.0f MB/s (%.2f)\n", round, t, r, t/r)
	}
	tm, rm := median(toronMBps), median(relayMBps)
	ratio := tm / rm

	// 2. /api p99 without tunnels and with o.tunnels idle ones, interleaved rounds (the
	// tunnels opened and closed each round); the memory is measured in the first round.
	apiLoad := Load{Name: "/api", URL: gw.URL() + "/api/users", Rate: o.apiRate, Workers: 16, Timeout: 5 * time.Second}
	warmup(o, gw.URL()+"/api/users")
	var noneRounds, withRounds [][]vegeta.Result
	var noneP99, withP99 []float64
	var rssBefore, rssAfter int64
	var active []string
	idle := make([]net.Conn, 0, o.tunnels)
	closeIdle := func() {
		for _, c := range idle {
			c.Close()
		}
		idle = idle[:0]
	}
	defer closeIdle()
	for round := 1; round <= o.rounds; round++ {
		rs := apiLoad.Run(o.duration)
		noneRounds = append(noneRounds, rs)
		noneP99 = append(noneP99, float64(Summarize("", rs).P99))
		time.Sleep(time.Second)
		before := procStatusBytes(gw.PID(), "VmRSS:")
		for i := range o.tunnels {
			c, _, err := dialWS(gwHost, "/ws/idle")
			if err != nil {
				return fmt.Errorf("loadtest: idle tunnel %d: %w", i, err)
			}
			idle = append(idle, c)
		}
		time.Sleep(2 * time.Second)
		if round == 1 {
			rssBefore, rssAfter = before, procStatusBytes(gw.PID(), "VmRSS:")
			active = gw.Metrics("toron_tunnels_active")
		}
		rs = apiLoad.Run(o.duration)
		withRounds = append(withRounds, rs)
		withP99 = append(withP99, float64(Summarize("", rs).P99))
		closeIdle()
		fmt.Printf("  round %d: /api p99 %s without tunnels, %s with %d\n", round,
			fmtDuration(time.Duration(noneP99[round-1])), fmtDuration(time.Duration(withP99[round-1])), o.tunnels)
		time.Sleep(time.Second)
	}
	none := SummarizeRounds("/api, no tunnels", noneRounds)
	with := SummarizeRounds(fmt.Sprintf("/api, %d idle tunnels", o.tunnels), withRounds)
	perTunnel := float64(rssAfter-rssBefore) / float64(o.tunnels)
	// The p99 of every round's results together: at 200/s a round of a few seconds has too
	// few requests for a p99 of its own.
	p99Ratio := float64(with.P99) / float64(max(none.P99, time.Microsecond))

	stopped = true
	stopErr := gw.Stop()

	notes := []string{
		fmt.Sprintf("echo through a tunnel: %.0f MB/s, through the TCP relay: %.0f MB/s, ratio %.2f (medians of %d rounds, %d connections x %s each way)",
			tm, rm, ratio, o.rounds, tunnelEchoConns, mib(o.tunnelBytes)),
		fmt.Sprintf("memory per idle tunnel: %.1f KiB (gateway RSS %s -> %s over %d tunnels; %s)",
			perTunnel/1024, mib(rssBefore), mib(rssAfter), o.tunnels, strings.Join(active, ", ")),
		fmt.Sprintf("/api p99: %s without tunnels, %s with %d idle tunnels, ratio %.2f (%d interleaved rounds at %d/s, the p99 of all their requests)",
			fmtDuration(none.P99), fmtDuration(with.P99), o.tunnels, p99Ratio, o.rounds, o.apiRate),
	}
	checks := []check{
		{fmt.Sprintf("tunnel echo >= 0.9 x relay (%.2f)", ratio), ratio >= 0.9},
		{fmt.Sprintf("memory per idle tunnel <= 32 KiB (%.1f KiB)", perTunnel/1024), perTunnel <= 32<<10},
		{fmt.Sprintf("/api p99 with %d idle tunnels <= 1.2 x none (%.2f)", o.tunnels, p99Ratio), p99Ratio <= 1.2},
	}
	return conclude(o, "tunnel", "WebSocket tunnels: echo throughput, idle memory, /api p99", nil, []Summary{none, with}, notes, checks, stopErr)
}

// serveWSUpstream is the ws-upstream helper: the echo upstream on -listen until SIGINT, SIGTERM
// or -lifetime.
func serveWSUpstream(o options) error {
	ln, err := o.listenHelper("ws upstream")
	if err != nil {
		return err
	}
	e := demo.ServeWSEcho(ln, true)
	fmt.Printf("loadtest ws upstream on %s (pid %d)\n", ln.Addr(), os.Getpid())
	_ = waitStop(nil, o.lifetime) // a signal or the lifetime: nothing else ends it
	_ = e.Close()
	return nil
}

// wsEchoClient is the ws-echo helper: a handshake with -target (a ws URL path on the gateway,
// e.g. http://127.0.0.1:8080/ws/), one masked text frame, and the echo printed.
func wsEchoClient(o options) error {
	if o.target == "" {
		return errors.New("loadtest: ws-echo needs -target http://127.0.0.1:PORT/ws/")
	}
	u, err := url.Parse(o.target)
	if err != nil {
		return err
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	c, br, err := dialWS(u.Host, path)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("101 Switching Protocols from %s%s\n", u.Host, path)
	msg := []byte("hello through the tunnel")
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask[:]...)
	for i, b := range msg {
		frame = append(frame, b^mask[i%4])
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(frame); err != nil {
		return err
	}
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return fmt.Errorf("loadtest: no echo: %w", err)
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(br, ext[:]); err != nil {
			return err
		}
		n = int(binary.BigEndian.Uint16(ext[:]))
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(br, p); err != nil {
		return err
	}
	fmt.Printf("sent %q, echoed %q (opcode %d)\n", msg, p, h[0]&0x0f)
	// A close frame, as a polite client ends a WebSocket.
	closeFrame := append([]byte{0x88, 0x80}, mask[:]...)
	_, _ = c.Write(closeFrame)
	if !slices.Equal(p, msg) {
		return errors.New("loadtest: the echo differs from the message")
	}
	return nil
}
