package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/testnet"
)

// These tests use windows of one second and bounds of several windows: CI machines are noisy.

// TestSteadyUploadLongerThanWindow: an upload lasting 10 × read_timeout at a steady rate
// arrives byte-exact.
func TestSteadyUploadLongerThanWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("10 s upload")
	}
	t.Parallel()
	up := startUpstream(t, sinkHandler(nil))
	gw := startGateway(t, "read_timeout: 1s\n", upstreamRoute("/up", up.addr, "max_body_bytes: 10MiB"))
	const pieces, piece = 50, 8 << 10 // 400 KiB over 10 s: 40 KiB per second
	c := dialRaw(t, gw.addr)
	fmt.Fprintf(c, "POST /up/x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", pieces*piece)
	sent := make([]byte, 0, pieces*piece)
	buf := make([]byte, piece)
	for i := 0; i < pieces; i++ {
		for j := range buf {
			buf[j] = byte(i + j)
		}
		sent = append(sent, buf...)
		if _, err := c.Write(buf); err != nil {
			t.Fatalf("piece %d: %v", i, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	resp := readRawResponse(t, c, "POST")
	if want := sinkAnswer(sent); resp.StatusCode != 200 || string(resp.body) != want {
		t.Fatalf("%d %s, want %s", resp.StatusCode, resp.body, want)
	}
}

// cutAfter writes the headers of an upload and then feeds the body with send, and reports how
// long after the headers the gateway closed the connection, with what it answered.
func cutAfter(t *testing.T, addr string, send func(c net.Conn) error) (time.Duration, string) {
	t.Helper()
	c := dialRaw(t, addr)
	defer c.Close()
	start := time.Now()
	io.WriteString(c, "POST /up/x HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n")
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = send(c)
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, _ := io.ReadAll(c)
	elapsed := time.Since(start)
	c.Close()
	<-done
	return elapsed, string(got)
}

// TestTrickleCutWithinTwoWindows: a body that slows to a trickle after 32 KiB (past fasthttp's
// pre-read, so the upstream request is under way) is cut within two windows, answered 408, and
// the upstream request is aborted: the upstream sees its body end in an error, never a clean end.
func TestTrickleCutWithinTwoWindows(t *testing.T) {
	t.Parallel()
	aborted := make(chan error, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		aborted <- err
	})
	gw := startGateway(t, "read_timeout: 1s\n", upstreamRoute("/up", up.addr, "max_body_bytes: 10MiB"))
	elapsed, got := cutAfter(t, gw.addr, func(c net.Conn) error {
		if _, err := c.Write(make([]byte, 32<<10)); err != nil {
			return err
		}
		for i := 0; i < 30; i++ {
			if _, err := c.Write([]byte{'x'}); err != nil {
				return err
			}
			time.Sleep(900 * time.Millisecond)
		}
		return nil
	})
	if elapsed > 4*time.Second {
		t.Errorf("trickle cut after %v, want within two windows (bound 4 s)", elapsed)
	}
	if !strings.Contains(got, "408") {
		t.Errorf("answer %q, want a best-effort 408", got)
	}
	select {
	case err := <-aborted:
		if err == nil {
			t.Errorf("the upstream read the cut body to a clean end; want it aborted")
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the upstream request was not aborted within 5 s of the cut")
	}
}

func TestPauseCut(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, sinkHandler(nil))
	gw := startGateway(t, "read_timeout: 1s\n", upstreamRoute("/up", up.addr, "max_body_bytes: 10MiB"))
	elapsed, _ := cutAfter(t, gw.addr, func(c net.Conn) error {
		c.Write(make([]byte, 100_000)) // progress, then silence
		time.Sleep(6 * time.Second)
		return nil
	})
	if elapsed < 500*time.Millisecond || elapsed > 4*time.Second {
		t.Errorf("pause cut after %v, want between half a window and a few windows", elapsed)
	}
}

func TestSlowHeadersCut(t *testing.T) {
	t.Parallel()
	gw, up := startProxied(t, "read_timeout: 1s\n", "/", nil)
	c := dialRaw(t, gw.addr)
	start := time.Now()
	go func() {
		for _, b := range []byte("GET / HTTP/1.1\r\nHost: a\r\nX-Drip: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n") {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, _ := io.ReadAll(c)
	if elapsed := time.Since(start); elapsed > 4*time.Second {
		t.Errorf("slow headers cut after %v (read_timeout 1s, absolute)", elapsed)
	}
	if len(got) > 0 && !strings.Contains(string(got), "408") {
		t.Errorf("answer %q", got)
	}
	if up.requests.Load() != 0 {
		t.Errorf("upstream saw the request")
	}
}

// TestSlowUpstreamReaderDoesNotCutClient: an upstream that takes its time to read the body
// stalls our writes, and through them the client; that time is not the client's fault.
func TestSlowUpstreamReaderDoesNotCutClient(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(3 * time.Second) // read_timeout is 1 s
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	})
	gw := startGateway(t, "read_timeout: 1s\nwrite_timeout: 10s\n", upstreamRoute("/up", up.addr, "max_body_bytes: 64MiB\nwrite_timeout: 10s"))
	body := strings.NewReader(strings.Repeat("s", 16<<20))
	resp, err := http.Post("http://"+gw.addr+"/up/x", "application/octet-stream", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != fmt.Sprint(16<<20) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// TestLongReportReachesClient: a report that needs 3 × the server's write_timeout, on a route
// whose response_header_timeout allows it.
func TestLongReportReachesClient(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(3 * time.Second)
		io.WriteString(w, "report")
	})
	gw := startGateway(t, "write_timeout: 1s\nresponse_header_timeout: 1s\n", upstreamRoute("/legacy/reports", up.addr, "response_header_timeout: 10s\nmax_concurrency: 2"))
	s, b, _, err := getStatus(gw.addr, "/legacy/reports/q")
	if err != nil || s != 200 || b != "report" {
		t.Fatalf("%d %q %v", s, b, err)
	}
}

func TestGatewayTimeout(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(10 * time.Second):
		case <-r.Context().Done():
		}
	})
	gw := startGateway(t, "response_header_timeout: 1s\n", upstreamRoute("/", up.addr, ""))
	start := time.Now()
	s, b, _, err := getStatus(gw.addr, "/slow")
	elapsed := time.Since(start)
	if err != nil || s != 504 || b != `{"error":"504 Gateway Timeout: Upstream response header timeout expired"}` {
		t.Fatalf("%d %s %v", s, b, err)
	}
	if elapsed < 900*time.Millisecond || elapsed > 4*time.Second {
		t.Errorf("504 after %v, want response_header_timeout (1 s) plus slack", elapsed)
	}
	if n := up.requests.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want exactly 1 (a timeout is never retried)", n)
	}
}

// slowReadClient requests a large body and reads it at the given pace (chunk bytes at most, then
// a pause), with a receive buffer of rcvbuf bytes, small so that loopback buffering does not
// hide a stall. It returns the bytes read and whether the body ended cleanly.
func slowReadClient(t *testing.T, addr string, size, rcvbuf, chunk int, pause time.Duration) (int, bool) {
	t.Helper()
	c := dialRaw(t, addr)
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(rcvbuf)
	fmt.Fprintf(c, "GET /big?size=%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", size)
	buf := make([]byte, chunk)
	total := 0
	for {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := c.Read(buf)
		total += n
		if err != nil {
			return total, err == io.EOF
		}
		time.Sleep(pause)
	}
}

func bigHandler(w http.ResponseWriter, r *http.Request) {
	var size int
	fmt.Sscan(r.URL.Query().Get("size"), &size)
	w.Header().Set("Content-Length", fmt.Sprint(size))
	chunk := make([]byte, 32<<10)
	for size > 0 {
		n := min(size, len(chunk))
		if _, err := w.Write(chunk[:n]); err != nil {
			return
		}
		size -= n
	}
}

func TestSlowReaderAboveMinimumCompletes(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, bigHandler)
	gw := startGateway(t, "write_timeout: 1s\n", upstreamRoute("/", up.addr, ""))
	const size = 1 << 20
	// At most 16 KiB every 10 ms: far above 1 KiB per window, far below loopback.
	n, clean := slowReadClient(t, gw.addr, size, 8<<10, 16<<10, 10*time.Millisecond)
	if !clean || n < size {
		t.Fatalf("slow but live reader got %d of %d bytes (clean end %v)", n, size, clean)
	}
}

func TestStalledReaderCut(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, bigHandler)
	gw := startGateway(t, "write_timeout: 1s\n", upstreamRoute("/", up.addr, ""))
	const size = 64 << 20
	c := dialRaw(t, gw.addr)
	fmt.Fprintf(c, "GET /big?size=%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", size)
	// 100 bytes every 2 s (50 bytes per window, below min_progress_bytes 1024) for 8 s, then
	// everything the gateway still sends, as fast as possible.
	buf := make([]byte, 100)
	total := 0
	for i := 0; i < 4; i++ {
		n, err := c.Read(buf)
		total += n
		if err != nil {
			break
		}
		time.Sleep(2 * time.Second)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, c)
	total += int(n)
	if total >= size {
		t.Fatalf("stalled reader got the whole body (%d bytes)", total)
	}
	m := scrape(t, gw.addr)
	if got := m[`toron_rejected_total{route="/",reason="slow_client"}`]; got != 1 {
		t.Errorf("slow_client rejections %v, want 1 (read %d bytes, %v)", got, total, err)
	}
}

// TestAbandonedElevatedReportsFreeBulkhead: eight clients that give up on an elevated report
// free its bulkhead within a second.
func TestAbandonedElevatedReportsFreeBulkhead(t *testing.T) {
	t.Parallel()
	var upstreamAborts atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(30 * time.Second):
		case <-r.Context().Done():
			upstreamAborts.Add(1)
		}
	})
	gw := startGateway(t, "", upstreamRoute("/legacy/reports", up.addr, "max_concurrency: 8\nresponse_header_timeout: 60s"))
	var conns []net.Conn
	for i := 0; i < 8; i++ {
		c := dialRaw(t, gw.addr)
		io.WriteString(c, "GET /legacy/reports/q HTTP/1.1\r\nHost: a\r\n\r\n")
		conns = append(conns, c)
	}
	bh := gw.g.stats.get("/legacy/reports").bulkhead
	deadline := time.Now().Add(5 * time.Second)
	for (bh.InFlight() < 8 || up.inflight.Load() < 8) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if bh.InFlight() != 8 {
		t.Fatalf("bulkhead holds %d", bh.InFlight())
	}
	closed := time.Now()
	for _, c := range conns {
		c.Close()
	}
	for bh.InFlight() > 0 && time.Since(closed) < 5*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	// SPEC 5 wants about a second on an idle machine; under -race on loaded cores the bound is
	// three (the slots are still freed long before response_header_timeout, 60 s).
	if d := time.Since(closed); bh.InFlight() > 0 || d > 3*time.Second {
		t.Errorf("bulkhead freed after %v (in flight %d), want within about a second (bound 3 s)", d, bh.InFlight())
	}
	if !testnet.WaitUntil(5*time.Second, func() bool { return upstreamAborts.Load() == 8 }) {
		t.Errorf("%d of the 8 upstream requests were aborted", upstreamAborts.Load())
	}
	waitIdle(t, gw.g)
}

// TestSlowReaderWithFullSendBufferCompletes: once the gateway's socket send buffer is full, the
// kernel wakes a blocked write only after a large share of it drained, which at a modest but
// steady client rate takes longer than the write window. The client is reading, so it must not
// be cut: its progress is what the kernel's send queue lost, not what one write call moved.
func TestSlowReaderWithFullSendBufferCompletes(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, bigHandler)
	gw := startGateway(t, "write_timeout: 1s\n", upstreamRoute("/", up.addr, ""))
	const size = 8 << 20
	// At most 32 KiB every 30 ms, about 1 MB/s, through a 64 KiB receive buffer: a blocked write
	// waits for about half of a 4 MiB send buffer to drain, two seconds, twice the window.
	start := time.Now()
	n, clean := slowReadClient(t, gw.addr, size, 64<<10, 32<<10, 30*time.Millisecond)
	if !clean || n < size {
		t.Fatalf("a steady reader (%.0f KB/s) was cut after %d of %d bytes",
			float64(n)/time.Since(start).Seconds()/1e3, n, size)
	}
}

// TestHeaderTimeoutDuration: a request cut for slow headers lasted read_timeout, from its first
// byte; its duration is not the instant of the answer.
func TestHeaderTimeoutDuration(t *testing.T) {
	gw, _ := startProxied(t, "read_timeout: 1s\n", "/", nil)
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n") // and never the blank line
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.ReadAll(c)
	m := scrape(t, gw.addr)
	if n := m[`toron_request_duration_seconds_count{route="none"}`]; n != 1 {
		t.Fatalf("%v requests counted under route none, want the one cut", n)
	}
	if d := m[`toron_request_duration_seconds_sum{route="none"}`]; d < 0.8 {
		t.Errorf("the header timeout lasted %.3fs by the metrics, want about read_timeout (1s)", d)
	}
}

// steadyReader is an upstream handler that reads the body bufBytes at a time with a pause
// after each read, and answers the byte count.
func steadyReader(bufBytes int, pause time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, bufBytes)
		n := 0
		for {
			m, err := r.Body.Read(buf)
			n += m
			if err != nil {
				break
			}
			time.Sleep(pause)
		}
		fmt.Fprint(w, n)
	}
}

// TestSteadyUpstreamReaderBehindFullBufferNotCut: the same rule upstream: an upstream that reads
// a large body slowly but steadily behind a full send buffer has not stopped reading.
func TestSteadyUpstreamReaderBehindFullBufferNotCut(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	// At most about 1 MB/s: longer than the window per drained half buffer.
	up := startUpstream(t, steadyReader(32<<10, 30*time.Millisecond))
	gw := startGateway(t, "", upstreamRoute("/up", up.addr, "max_body_bytes: 64MiB\nwrite_timeout: 1s\nread_timeout: 30s"))
	postWhole(t, "a steady upstream reader", "http://"+gw.addr+"/up/x", size)
}

// postWhole POSTs size bytes to url and fails the test unless the answer is a 200 whose body
// is the byte count (steadyReader's); who names the upstream in the failure.
func postWhole(t *testing.T, who, url string, size int) {
	t.Helper()
	resp, err := http.Post(url, "application/octet-stream", strings.NewReader(strings.Repeat("s", size)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != fmt.Sprint(size) {
		t.Fatalf("%s got %d %s, want 200 %d", who, resp.StatusCode, b, size)
	}
}
