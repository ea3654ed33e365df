package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		rs := Uploads(up.URL()+"/legacy/upload", 3, size, chunked, 10*time.Second, "upload")
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
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
// -check, when a built gateway is at hand (make build).
func TestGeneratedFilesPassCheck(t *testing.T) {
	bin, err := filepath.Abs(filepath.Join("..", "bin", "toron"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skip("no ../bin/toron: run make build first")
	}
	dir := t.TempDir()
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
