package main

import (
	"io"
	"net/http"
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
