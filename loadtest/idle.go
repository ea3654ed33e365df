package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// The idle-connection measurement of issue 32 (SPEC 22, make bench-idle): the memory a server
// keeps for each keep-alive client connection that sent one small GET and then waits. The
// client opens -connections connections, each sends one GET -paths (the first path) and reads
// the whole answer, and then all of them stay open and silent; the RSS of the server's process
// tree (-pid, with its children: nginx's and HAProxy's workers) is read before the first
// connection and again once every connection answered and -duration has passed, so that the
// server's own timers and a garbage collection have run. The figure is the RSS growth divided
// by the connections held. Beyond the ~28,000 ephemeral ports of one source address the client
// spreads its connections over 127.0.0.2, 127.0.0.3, ... (all loopback on Linux).

// idleConns is the idle helper scenario: it prints one line,
// "idle: <label> conns=N rss_before_kib=A rss_after_kib=B kib_per_conn=X".
func idleConns(o options) error {
	if o.target == "" && o.tlsTarget == "" {
		return fmt.Errorf("loadtest: idle needs -target http://127.0.0.1:PORT or -tls-target 127.0.0.1:PORT")
	}
	if o.pid <= 0 {
		return fmt.Errorf("loadtest: idle needs -pid of the server to measure")
	}
	addr := strings.TrimPrefix(o.target, "http://")
	if o.tlsTarget != "" {
		addr = o.tlsTarget
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("loadtest: idle target %q: %w", addr, err)
	}
	path := strings.Split(o.paths, ",")[0]
	req := []byte("GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: toron-loadtest-idle\r\n\r\n")
	before := treeStatusBytes(o.pid, "VmRSS:") / 1024
	conns := make([]net.Conn, 0, o.connections)
	defer func() {
		for _, c := range conns {
			// A reset, not a FIN: no TIME_WAIT left behind to use up the ephemeral ports of the
			// next server's run.
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			} else if tc, ok := c.(*tls.Conn); ok {
				if nc, ok := tc.NetConn().(*net.TCPConn); ok {
					nc.SetLinger(0)
				}
			}
			c.Close()
		}
	}()
	dst := netip.MustParseAddr(host)
	src := netip.MustParseAddr("127.0.0.1")
	perSource := 20000
	for i := 0; i < o.connections; i++ {
		if i > 0 && i%perSource == 0 {
			src = src.Next()
		}
		d := net.Dialer{Timeout: 5 * time.Second}
		if i >= perSource {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		c, err := d.Dial("tcp", net.JoinHostPort(dst.String(), port))
		if err != nil {
			return fmt.Errorf("loadtest: idle: connection %d: %w", i, err)
		}
		if o.tlsTarget != "" {
			tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, ServerName: "127.0.0.1"}) //nolint:gosec // a self-signed benchmark certificate
			if err := tc.Handshake(); err != nil {
				c.Close()
				return fmt.Errorf("loadtest: idle: TLS handshake %d: %w", i, err)
			}
			c = tc
		}
		conns = append(conns, c)
		if err := oneGET(c, req); err != nil {
			return fmt.Errorf("loadtest: idle: request %d: %w", i, err)
		}
	}
	time.Sleep(o.duration)
	after := treeStatusBytes(o.pid, "VmRSS:") / 1024
	// The connections must still be open: a server that closed them would look cheap.
	open := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				open++
			}
		}
	}
	label := o.label
	if label == "" {
		label = addr
	}
	fmt.Printf("idle: %s conns=%d open=%d rss_before_kib=%d rss_after_kib=%d kib_per_conn=%.2f\n",
		label, len(conns), open, before, after, float64(after-before)/float64(len(conns)))
	if open < len(conns)*99/100 {
		return fmt.Errorf("loadtest: idle: the server closed %d of %d idle connections during the measurement (raise its keep-alive timeout)", len(conns)-open, len(conns))
	}
	return nil
}

// oneGET writes req and reads one whole answer (headers and a Content-Length body).
func oneGET(c net.Conn, req []byte) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(req); err != nil {
		return err
	}
	var resp fasthttp.Response
	br := bufio.NewReaderSize(c, 4096)
	if err := resp.Read(br); err != nil {
		return err
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("status %d", resp.StatusCode())
	}
	if br.Buffered() != 0 {
		return fmt.Errorf("%d bytes past the answer", br.Buffered())
	}
	return nil
}

// serveBareServer is the bare-server helper scenario: a fasthttp Server that answers every
// request with a fixed JSON body, with ReduceMemoryUsage (fasthttp's own way to hold less per
// idle connection), unbounded connections and no timeouts that would close an idle
// connection during the measurement. It is the floor of issue 32: what fasthttp's Server
// itself keeps per idle connection, measured the same way as Toron. -bare-stream (default on)
// sets StreamRequestBody as Toron's server must (SPEC 6): fasthttp then keeps the connection's
// read buffer while it waits (server.go: "When StreamRequestBody is set to true, we cannot
// safely release br"), so the two settings give the two floors. -cert/-key serve TLS.
func serveBareServer(o options) error {
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"status":"ok"}`)
		},
		ReduceMemoryUsage:            true,
		StreamRequestBody:            o.bareStream,
		Concurrency:                  1 << 20,
		ReadBufferSize:               8192,
		DisablePreParseMultipartForm: true,
		Name:                         "loadtest-bare-server",
	}
	ln, err := o.listenHelper("bare server")
	if err != nil {
		return err
	}
	serve := func() error { return srv.Serve(ln) }
	if o.certFile != "" {
		serve = func() error { return srv.ServeTLS(ln, o.certFile, o.keyFile) }
	}
	fmt.Printf("loadtest bare fasthttp server on %s (pid %d)\n", ln.Addr(), os.Getpid())
	return serveUntilStop(srv, serve, o.lifetime)
}
