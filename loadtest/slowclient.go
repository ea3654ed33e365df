package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The slow-client scenario (SPEC 5): /api and /health measured idle, then while crowds of slow
// clients attack the gateway, which must cut every one of them.
//
// A slow client is a raw connection doing one of three things the gateway must cut: dripping a
// body, dripping headers, reading a large response slowly. Each attacker repeats its attack on a
// new connection until the phase ends; one result is one connection: its latency is the time
// until the gateway closed it, its status the status the gateway sent (408 expected for drips),
// and its error "closed" (cut without a status) or "not-cut" (still open when the phase ended).

// SlowClient is one kind of slow-client attack.
type SlowClient struct {
	Name string
	// Addr is the gateway's host:port.
	Addr string
	// Conns is how many attackers run at once.
	Conns int
	// Interval is the pause between two drips or two reads.
	Interval time.Duration
	// Kind is "body", "headers" or "read".
	Kind string
	// ReadBytes is what a slow reader reads per Interval.
	ReadBytes int
	// ResponseBytes is the size a slow reader asks for.
	ResponseBytes int
}

// maxAttacksPerConn bounds how often one attacker reconnects, whatever the timings.
const maxAttacksPerConn = 1000

// Run opens new connections until d has passed, each kept open at most cutLimit, and returns
// one result per connection.
func (s SlowClient) Run(d, cutLimit time.Duration) []vegeta.Result {
	deadline := time.Now().Add(d)
	var mu sync.Mutex
	var out []vegeta.Result
	var wg sync.WaitGroup
	for i := range s.Conns {
		wg.Go(func() {
			// Spread the connects over the first second, as a crowd arrives.
			time.Sleep(time.Duration(i) * time.Second / time.Duration(max(1, s.Conns)))
			for n := 0; n < maxAttacksPerConn && time.Now().Before(deadline); n++ {
				r := s.once(time.Now().Add(cutLimit))
				r.Seq = uint64(i)
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
				if strings.HasPrefix(r.Error, "dial: ") {
					// Refused or timed out: do not spin.
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return out
}

func (s SlowClient) once(deadline time.Time) vegeta.Result {
	res := vegeta.Result{Attack: s.Name, Method: http.MethodGet, URL: "http://" + s.Addr, Timestamp: time.Now()}
	d := net.Dialer{Timeout: 2 * time.Second}
	if s.Kind == "read" {
		// A small receive window before connect, so the gateway's writes block early.
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	conn, err := d.Dial("tcp", s.Addr)
	if err != nil {
		res.Latency = time.Since(res.Timestamp)
		res.Error = "dial: " + errorText(err)
		return res
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)

	var status int
	var closedErr error
	switch s.Kind {
	case "read":
		status, res.BytesIn, closedErr = s.slowRead(conn, deadline)
		if errors.Is(closedErr, errCutAtDrain) || errors.Is(closedErr, errServerClosed) {
			// The gateway cut the response; its kernel may still hold bytes for us.
			res.Latency = time.Since(res.Timestamp)
			res.Error = "closed: " + closedErr.Error()
			return res
		}
	default:
		status, res.BytesOut, closedErr = s.drip(conn, deadline)
	}
	res.Latency = time.Since(res.Timestamp)
	switch {
	case closedErr == nil:
		// The response completed: the gateway did not treat it as slow.
		res.Code = uint16(status)
	case isTimeout(closedErr) || !time.Now().Before(deadline):
		res.Error = "not-cut: still open when the phase ended"
	case status != 0 && s.Kind != "read":
		res.Code = uint16(status)
		if status < 200 || status >= 400 {
			res.Error = strconv.Itoa(status)
		}
	default:
		res.Error = "closed: " + closedErr.Error()
	}
	return res
}

// drip sends a request whose body (Kind "body") or headers (Kind "headers") never finish, one
// small piece per Interval, until the gateway answers or closes. It returns the status the
// gateway sent, 0 if none, and the error that ended the connection.
func (s SlowClient) drip(conn net.Conn, deadline time.Time) (int, uint64, error) {
	var head string
	if s.Kind == "body" {
		head = "POST /api/slow-body HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n"
	} else {
		head = "GET /api/slow-headers HTTP/1.1\r\nHost: 127.0.0.1\r\n"
	}
	type answer struct {
		status int
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		status, err := readStatusThenEOF(conn)
		done <- answer{status, err}
	}()
	sent := uint64(0)
	if _, err := io.WriteString(conn, head); err != nil {
		a := <-done
		return a.status, sent, err
	}
	sent += uint64(len(head))
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case a := <-done:
			return a.status, sent, closedOr(a.err)
		case <-t.C:
		}
		piece := "x"
		if s.Kind == "headers" {
			piece = "X-Drip-" + strconv.Itoa(i) + ": x\r\n"
		}
		if _, err := io.WriteString(conn, piece); err != nil {
			// The gateway closed its side; the reader reports what it sent before.
			a := <-done
			return a.status, sent, closedOr(a.err)
		}
		sent += uint64(len(piece))
		if !time.Now().Before(deadline) {
			conn.Close()
			<-done
			return 0, sent, errPhaseEnded
		}
	}
}

// slowRead asks for a large response and reads it ReadBytes per Interval until deadline.
//
// A gateway that cuts a slow reader closes its socket, but what its kernel had already queued
// is still delivered before the end of the stream: at 64 B/s that can take hours. So the cut is
// seen in one of three ways: the stream ends (or is reset) while reading slowly; the gateway
// side of the connection leaves ESTABLISHED in /proc/net/tcp (Linux, same machine), checked
// after every read; or, at deadline, the rest is read at full speed and ends before the whole
// body (errCutAtDrain). A gateway that did not cut sends the whole body then: "not-cut".
func (s SlowClient) slowRead(conn net.Conn, deadline time.Time) (int, uint64, error) {
	req := "GET /api/slow-read?size=" + strconv.Itoa(s.ResponseBytes) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return 0, 0, err
	}
	buf := make([]byte, max(s.ReadBytes, 64<<10))
	var got uint64
	for time.Now().Add(s.Interval).Before(deadline) {
		n, err := io.ReadFull(conn, buf[:s.ReadBytes])
		got += uint64(n)
		if err != nil {
			if got >= uint64(s.ResponseBytes) {
				return http.StatusOK, got, nil
			}
			return 0, got, closedOr(err)
		}
		time.Sleep(s.Interval)
		if serverClosed(conn) {
			return 0, got, errServerClosed
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(drainLimit))
	for {
		n, err := conn.Read(buf)
		got += uint64(n)
		if got >= uint64(s.ResponseBytes) {
			// The whole body (and more: the headers) arrived.
			return http.StatusOK, got, nil
		}
		if err != nil {
			if isTimeout(err) {
				return 0, got, errPhaseEnded
			}
			return 0, got, fmt.Errorf("%w after %d bytes (%v)", errCutAtDrain, got, err)
		}
	}
}

// drainLimit bounds the fast read at the end of a slow read.
const drainLimit = 3 * time.Second

var errCutAtDrain = errors.New("response cut by the gateway, seen when draining")

var errPhaseEnded = fmt.Errorf("loadtest: phase ended: %w", context.DeadlineExceeded)

// readStatusThenEOF reads the status line, then everything until the connection ends.
func readStatusThenEOF(conn net.Conn) (int, error) {
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	status := 0
	if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") {
		status, _ = strconv.Atoi(f[1])
	}
	if err != nil {
		return status, err
	}
	_, err = io.Copy(io.Discard, br)
	if err == nil {
		err = io.EOF
	}
	return status, err
}

func closedOr(err error) error {
	if err == nil {
		return io.EOF
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, errPhaseEnded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

var errServerClosed = errors.New("the gateway closed its side of the connection")

// tcpEstablished is the state column of an ESTABLISHED socket in /proc/net/tcp.
const tcpEstablished = "01"

// serverClosed reports whether the peer's side of a loopback connection has left ESTABLISHED
// (FIN_WAIT1 while its unsent bytes drain, or gone), from /proc/net/tcp. It is false when that
// cannot be told (not Linux, not IPv4).
func serverClosed(conn net.Conn) bool {
	local, ok1 := conn.LocalAddr().(*net.TCPAddr)
	remote, ok2 := conn.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || local.IP.To4() == nil || remote.IP.To4() == nil {
		return false
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return false
	}
	// The peer's row has its address as local_address and ours as rem_address.
	want := procTCPAddr(remote) + " " + procTCPAddr(local) + " "
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[1]+" "+f[2]+" " != want {
			continue
		}
		return f[3] != tcpEstablished
	}
	return true
}

// procTCPAddr formats an IPv4 address as /proc/net/tcp does: the address as a little-endian
// 32-bit hex number, the port as hex.
func procTCPAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
}

// slowClient attacks the gateway with trickled bodies, slow headers and slow reads while /api
// and /health are measured, after an idle phase of the same length.
func slowClient(o options) error {
	if o.target != "" {
		return fmt.Errorf("loadtest: slow-client starts its own gateway and upstream; -target is not supported")
	}
	e, err := setup(o, o.bulkhead)
	if err != nil {
		return err
	}
	addr := e.gw.Addr()
	measured := func(tag string) []Load {
		return []Load{
			{Name: "/api " + tag, URL: e.gw.URL() + "/api/items", Rate: o.apiRate, Workers: 8, Timeout: 5 * time.Second},
			{Name: "/health " + tag, URL: e.gw.URL() + "/health", Rate: o.healthRate, Workers: 2, Timeout: 5 * time.Second},
		}
	}
	warmup(o, e.gw.URL()+"/api/items")
	idle := RunLoads(o.duration, measured("idle")...)

	attacks := []SlowClient{
		{Name: "attack: trickled bodies (1 B/s)", Addr: addr, Conns: o.attackers, Interval: time.Second, Kind: "body"},
		{Name: "attack: slow headers (1 line/s)", Addr: addr, Conns: o.attackers, Interval: time.Second, Kind: "headers"},
		{Name: "attack: slow reads (64 B/s of 16 MiB)", Addr: addr, Conns: o.attackers, Interval: time.Second, Kind: "read", ReadBytes: 64, ResponseBytes: 16 << 20},
	}
	attackResults := make([][]vegeta.Result, len(attacks))
	var wg sync.WaitGroup
	for i, a := range attacks {
		wg.Go(func() { attackResults[i] = a.Run(o.duration, slowCutLimit) })
	}
	// Measure while the crowd is at full size: after its first second, for the phase.
	time.Sleep(time.Second)
	under := RunLoads(o.duration, measured("under attack")...)
	wg.Wait()

	rss := e.gw.PeakRSSBytes()
	rejects := e.gw.Metrics("toron_rejected_total")
	runErr := e.close()

	series := []Series{
		{"/api idle", idle[0]}, {"/health idle", idle[1]},
		{"/api under attack", under[0]}, {"/health under attack", under[1]},
	}
	for i, a := range attacks {
		series = append(series, Series{a.Name, attackResults[i]})
	}
	rows := summarizeAll(series)
	notes := []string{
		fmt.Sprintf("attack rows: one request per connection; latency = time until the gateway closed it; an attacker reconnects at once for %s; not-cut = still open after %s", o.duration, slowCutLimit),
		fmt.Sprintf("/api p99 under attack / idle: %.2fx; toron peak RSS %s; rejects: %s",
			float64(rows[2].P99)/float64(rows[0].P99), mib(rss), strings.Join(nonZero(rejects), ", ")),
	}
	checks := []check{
		{fmt.Sprintf("/api under attack: no errors (%s)", rows[2].ErrorsText()), len(rows[2].Errors) == 0},
		{fmt.Sprintf("/health under attack: no errors (%s)", rows[3].ErrorsText()), len(rows[3].Errors) == 0},
	}
	for _, r := range rows[4:] {
		checks = append(checks, check{fmt.Sprintf("%s: every connection cut by the gateway (%s)", r.Name, r.ErrorsText()),
			r.Requests > 0 && r.OK == 0 && r.Errors["not-cut"] == 0})
	}
	title := fmt.Sprintf("slow-client: %d connections of each attack; /api %d req/s, /health %d req/s; %s idle + %s under attack",
		o.attackers, o.apiRate, o.healthRate, o.duration, o.duration)
	return conclude(o, "slow-client", title, series, rows, notes, checks, runErr)
}

// slowCutLimit is how long the slow-client scenario gives a slow connection to be cut: three
// default read_timeout windows (SPEC 5 promises a cut within two).
const slowCutLimit = 15 * time.Second
