package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"toron/internal/testnet"
)

func startUpstream(t *testing.T) *Upstream {
	t.Helper()
	up, err := StartUpstream("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return up
}

func TestUpstreamAnswersAPIAndReports(t *testing.T) {
	up := startUpstream(t)
	rs := Load{Name: "api", URL: up.URL() + "/api/items", Rate: 50, Workers: 2}.Run(200 * time.Millisecond)
	s := Summarize("api", rs)
	if s.Requests < 5 || s.OK != s.Requests {
		t.Fatalf("api: %d requests, %d ok (%s)", s.Requests, s.OK, s.ErrorsText())
	}
	if got := up.APIRequests.Load(); got != int64(s.Requests) {
		t.Errorf("upstream counted %d API requests, the client sent %d", got, s.Requests)
	}

	start := time.Now()
	resp, err := http.Get(up.URL() + "/legacy/reports?delay=100ms")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"delay":"100ms"`) {
		t.Errorf("report: %d %s", resp.StatusCode, b)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("report answered after %s, before its delay", d)
	}

	resp, err = http.Get(up.URL() + "/api/big?size=100000")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n != 100000 {
		t.Errorf("?size=100000 answered %d bytes", n)
	}
}

func TestUploadsArriveWholeBothFramings(t *testing.T) {
	up := startUpstream(t)
	const size = 3<<20 + 17
	for _, chunked := range []bool{false, true} {
		rs := Uploads(UploadSpec{Name: "upload", URL: up.URL() + "/legacy/upload", N: 3, Size: size, Chunked: chunked, Verify: true, Timeout: 10 * time.Second})
		s := Summarize("upload", rs)
		if s.OK != 3 {
			t.Fatalf("chunked=%v: %d of 3 uploads ok (%s)", chunked, s.OK, s.ErrorsText())
		}
		for _, r := range rs {
			if r.BytesOut != size {
				t.Errorf("chunked=%v: sent %d bytes, want %d", chunked, r.BytesOut, size)
			}
		}
	}
	if got := up.UploadBytes.Load(); got != 6*size {
		t.Errorf("the sink counted %d bytes, want %d", got, 6*size)
	}
}

func TestPatternReaderYieldsExactlyItsLength(t *testing.T) {
	r := &patternReader{left: 200_001}
	n, err := io.Copy(io.Discard, r)
	if err != nil || n != 200_001 || r.sent != 200_001 {
		t.Fatalf("copied %d (sent %d), err %v; want 200001", n, r.sent, err)
	}
}

func TestServerClosedSeesThePeerClose(t *testing.T) {
	client, server := testnet.Pair(t)
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		server.Close()
		t.Skip("no /proc/net/tcp")
	}
	if serverClosed(client) {
		t.Fatal("an open connection reads as closed")
	}
	server.Close()
	if !waitFor(2*time.Second, func() bool { return serverClosed(client) }) {
		t.Fatal("the peer's close was not seen")
	}
}

// TestGeneratedFilesPassCheck validates the generated config and routes with the gateway's
// -check. The gateway is built here from the module root: make test never builds bin/toron, so
// relying on it made the test skip on every CI run.
func TestGeneratedFilesPassCheck(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "toron")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the gateway: %v\n%s", err, out)
	}
	cfg, routes := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "routes.yaml")
	if err := writeTemplate(cfg, configTemplate, map[string]int{"Port": 18999}); err != nil {
		t.Fatal(err)
	}
	if err := writeTemplate(routes, routesTemplate, RouteOptions{Upstream: "127.0.0.1:18998", ReportsMaxConcurrency: 8}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-check", "-config", cfg, "-routes", routes).CombinedOutput()
	if err != nil {
		t.Fatalf("toron -check refused the generated files: %v\n%s", err, out)
	}
	for _, want := range []string{`"api"`, `"reports"`, `"upload"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-check output lacks route %s", want)
		}
	}
}

func TestUploadVerification(t *testing.T) {
	up := startUpstream(t)
	const size = 1<<20 + 3
	// Counted only: the sink answers no hash, and the upload passes on its byte count.
	rs := Uploads(UploadSpec{Name: "count", URL: up.URL() + "/legacy/upload", N: 1, Size: size, Timeout: 10 * time.Second})
	if s := Summarize("", rs); s.OK != 1 {
		t.Fatalf("-verify=false upload failed: %s", s.ErrorsText())
	}
	if !strings.HasSuffix(rs[0].URL, "?verify=none") {
		t.Errorf("a counted-only upload went to %s, want ?verify=none", rs[0].URL)
	}

	// A server that receives every byte but reports another hash: a verified upload fails.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"bytes":`+strconv.FormatInt(n, 10)+`,"sha256":"00"}`)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	rs = Uploads(UploadSpec{Name: "verify", URL: "http://" + ln.Addr().String() + "/legacy/upload", N: 1, Size: size, Verify: true, Timeout: 10 * time.Second})
	if rs[0].Error == "" || !strings.HasPrefix(rs[0].Error, "corrupt") {
		t.Errorf("a wrong hash was not reported: error %q", rs[0].Error)
	}
}

func TestNaiveProxyForwardsUploads(t *testing.T) {
	up := startUpstream(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	done := make(chan error, 1)
	go func() { done <- serveNaiveProxy(options{listen: addr, upstream: up.Addr(), lifetime: 3 * time.Second}) }()
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the naive proxy does not listen: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, chunked := range []bool{false, true} {
		rs := Uploads(UploadSpec{Name: "naive", URL: "http://" + addr + "/legacy/upload", N: 2, Size: 2<<20 + 1, Chunked: chunked, Verify: true, Timeout: 10 * time.Second})
		if s := Summarize("", rs); s.OK != 2 {
			t.Errorf("chunked=%v: %d of 2 uploads through the naive proxy arrived byte-exact (%s)", chunked, s.OK, s.ErrorsText())
		}
	}
	if err := <-done; err != nil {
		t.Errorf("the naive proxy ended with %v", err)
	}
}

func TestTCPRelayForwardsUploads(t *testing.T) {
	up := startUpstream(t)
	addr, done := startTCPRelayForTest(t, up.Addr(), 2*time.Second)
	for _, chunked := range []bool{false, true} {
		rs := Uploads(UploadSpec{Name: "relay", URL: "http://" + addr + "/legacy/upload", N: 2, Size: 2<<20 + 1, Chunked: chunked, Verify: true, Timeout: 10 * time.Second})
		if s := Summarize("", rs); s.OK != 2 {
			t.Errorf("chunked=%v: %d of 2 uploads through the tcp relay arrived byte-exact (%s)", chunked, s.OK, s.ErrorsText())
		}
	}
	waitRelay(t, done)
	// Once it ended, it no longer listens.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the tcp relay still accepts connections after its lifetime")
	}
}

// TestTCPRelayHalfCloseAndShutdown: a half-close travels through the relay (the upstream sees
// EOF and its answer still comes back), and at the end of its lifetime the relay closes the
// connections still open and returns.
func TestTCPRelayHalfCloseAndShutdown(t *testing.T) {
	// An upstream that answers everything it read, once the client half-closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, ln, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		c.Write(b)
	})
	addr, done := startTCPRelayForTest(t, ln.Addr().String(), 1500*time.Millisecond)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "half-closed")
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err != nil || string(b) != "half-closed" {
		t.Errorf("after a half-close got %q, %v; want the echo and EOF", b, err)
	}

	// A connection left open is closed by the relay at the end of its lifetime.
	open, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	io.WriteString(open, "still here")
	waitRelay(t, done)
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(open); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a connection left open was not closed by the relay's shutdown: %v", err)
	}
}

// startTCPRelayForTest runs the tcp-relay helper in this process for lifetime and waits until it
// listens; done reports how it ended.
func startTCPRelayForTest(t *testing.T, upstream string, lifetime time.Duration) (string, <-chan error) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	done := make(chan error, 1)
	go func() { done <- serveTCPRelay(options{listen: addr, upstream: upstream, lifetime: lifetime}) }()
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, done
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tcp relay does not listen: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitRelay waits for the relay to end, failing the test if it hangs.
func waitRelay(t *testing.T, done <-chan error) {
	t.Helper()
	if err := testnet.Ended(t, "the tcp relay", 10*time.Second, done); err != nil {
		t.Errorf("the tcp relay ended with %v", err)
	}
}

func TestReleaseReportsEndsTheWaitingOnes(t *testing.T) {
	up := startUpstream(t)
	wait := holdReports(up.URL(), 3, 10*time.Minute)
	if !waitFor(5*time.Second, func() bool { return up.ReportsWaiting.Load() == 3 }) {
		t.Fatalf("%d reports waiting, want 3", up.ReportsWaiting.Load())
	}
	start := time.Now()
	up.ReleaseReports()
	for _, r := range wait() {
		if r.Code != http.StatusOK || r.Error != "" {
			t.Errorf("a released report: %d %s", r.Code, r.Error)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the released reports took %s to answer", d)
	}
	// A report after the release waits for its own delay again.
	start = time.Now()
	if code, _ := rejectOnce(up.URL() + "/legacy/reports?delay=150ms"); code != http.StatusOK {
		t.Errorf("a report after the release: %d", code)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("a report after the release answered after %s, before its delay", d)
	}
}
