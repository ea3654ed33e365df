package main

import (
	"net"
	"strconv"
	"testing"
	"time"
)

func TestNaiveProxyForwardsUploads(t *testing.T) {
	up := startUpstream(t)
	addr, done := startHelperForTest(t, "the naive proxy", serveNaiveProxy, up.Addr(), 3*time.Second)
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

// startHelperForTest runs the helper scenario serve (named what in the failure), in front of
// upstream, in this process for lifetime and waits until it listens; done reports how it ended.
func startHelperForTest(t *testing.T, what string, serve func(options) error, upstream string, lifetime time.Duration) (string, <-chan error) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	done := make(chan error, 1)
	go func() { done <- serve(options{listen: addr, upstream: upstream, lifetime: lifetime}) }()
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, done
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not listen: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
