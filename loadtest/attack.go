package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
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

// Load is one vegeta attack: GET url at Rate per second (0: as fast as Workers allow), with
// Header on every request when it is not nil.
type Load struct {
	Name    string
	URL     string
	Rate    int
	Workers int
	Timeout time.Duration
	Header  http.Header
}

// maxRateWorkers bounds the workers vegeta may add to keep a constant rate while responses are
// slow: a rate of 200/s with 1 s answers needs about 200.
const maxRateWorkers = 2000

// Run attacks for d and returns every result, bodies and headers dropped to keep memory small.
func (l Load) Run(d time.Duration) []vegeta.Result {
	workers := max(1, l.Workers)
	maxWorkers := uint64(maxRateWorkers)
	if l.Rate == 0 {
		maxWorkers = uint64(workers)
	}
	timeout := l.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	atk := vegeta.NewAttacker(
		vegeta.Workers(uint64(workers)),
		vegeta.MaxWorkers(maxWorkers),
		vegeta.Connections(workers),
		vegeta.Timeout(timeout),
		vegeta.KeepAlive(true),
		vegeta.MaxBody(0),
		vegeta.Redirects(vegeta.NoFollow),
	)
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: l.URL, Header: l.Header})
	var rs []vegeta.Result
	for r := range atk.Attack(tr, vegeta.Rate{Freq: l.Rate, Per: time.Second}, d, l.Name) {
		r.Body, r.Headers = nil, nil
		rs = append(rs, *r)
	}
	return rs
}

// RunLoads runs loads at once for d; the results are in the order of loads.
func RunLoads(d time.Duration, loads ...Load) [][]vegeta.Result {
	out := make([][]vegeta.Result, len(loads))
	var wg sync.WaitGroup
	for i, l := range loads {
		wg.Go(func() { out[i] = l.Run(d) })
	}
	wg.Wait()
	return out
}

// UploadSpec is a batch of concurrent uploads.
type UploadSpec struct {
	Name string
	URL  string
	// N uploads of Size bytes each run at once, generated on the fly (nothing is stored).
	N    int
	Size int64
	// Chunked sends the bodies with Transfer-Encoding: chunked instead of a Content-Length.
	Chunked bool
	// Verify makes each upload byte-exact: the client hashes (SHA-256) what it generates, the
	// upstream what it receives, and an upload whose hashes differ fails. Without it the
	// upstream only counts (?verify=none) and only the byte count is checked.
	Verify  bool
	Timeout time.Duration
}

// Uploads runs the batch. Each result's BytesOut is what was sent; an upload whose upstream
// did not report exactly Size bytes (and, with Verify, the same SHA-256) is an error.
func Uploads(spec UploadSpec) []vegeta.Result {
	tr := &http.Transport{
		DisableCompression: true,
		WriteBufferSize:    256 << 10,
		ReadBufferSize:     64 << 10,
		MaxConnsPerHost:    spec.N,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	url := spec.URL
	if !spec.Verify {
		url += "?verify=none"
	}
	out := make([]vegeta.Result, spec.N)
	var wg sync.WaitGroup
	for i := range spec.N {
		wg.Go(func() { out[i] = upload(client, url, spec, uint64(i)) })
	}
	wg.Wait()
	return out
}

func upload(client *http.Client, url string, spec UploadSpec, seq uint64) vegeta.Result {
	res := vegeta.Result{Attack: spec.Name, Seq: seq, Method: http.MethodPost, URL: url, Timestamp: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), spec.Timeout)
	defer cancel()
	body := &patternReader{left: spec.Size}
	if spec.Verify {
		body.h = sha256.New()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if spec.Chunked {
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
	} else {
		req.ContentLength = spec.Size
	}
	resp, err := client.Do(req)
	res.BytesOut = uint64(body.sent)
	if err != nil {
		res.Latency = time.Since(res.Timestamp)
		res.Error = errorText(err)
		return res
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	res.Latency = time.Since(res.Timestamp)
	res.BytesIn = uint64(len(b))
	res.Code = uint16(resp.StatusCode)
	if err != nil {
		res.Error = errorText(err)
		return res
	}
	if resp.StatusCode != http.StatusOK {
		res.Error = resp.Status
		return res
	}
	var got struct {
		Bytes  int64  `json:"bytes"`
		SHA256 string `json:"sha256"`
	}
	err = json.Unmarshal(b, &got)
	switch {
	case err != nil || got.Bytes != spec.Size:
		// The status was 200 but the body did not arrive whole: count it as a failure.
		res.Code = 0
		res.Error = fmt.Sprintf("short: the upstream received %d of %d bytes (%s)", got.Bytes, spec.Size, strings.TrimSpace(string(b)))
	case body.h != nil && got.SHA256 != hex.EncodeToString(body.h.Sum(nil)):
		res.Code = 0
		res.Error = fmt.Sprintf("corrupt: the upstream received %d bytes with SHA-256 %q, the client sent %x", got.Bytes, got.SHA256, body.h.Sum(nil))
	}
	return res
}

// patternBlock is the content of generated upload bodies.
var patternBlock = []byte(strings.Repeat("toron-loadtest-upload-0123456789abcdefghijklmnopqrstuvwxyz-ABCDEF\n", 1024))

// patternReader yields left bytes of patternBlock repeated, counts what was read and, when h
// is set, hashes it.
type patternReader struct {
	left, sent int64
	off        int
	h          hash.Hash
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(b) && p.left > 0 {
		chunk := patternBlock[p.off:]
		if int64(len(chunk)) > p.left {
			chunk = chunk[:p.left]
		}
		m := copy(b[n:], chunk)
		p.off = (p.off + m) % len(patternBlock)
		n += m
		p.left -= int64(m)
	}
	p.sent += int64(n)
	if p.h != nil {
		p.h.Write(b[:n])
	}
	return n, nil
}

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

var _ io.Reader = (*patternReader)(nil)

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
