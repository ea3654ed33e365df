package main

import (
	"net"
	"strconv"
	"testing"
	"time"
)

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
