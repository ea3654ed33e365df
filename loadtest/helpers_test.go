package main

import (
	"net"
	"strconv"
	"testing"
	"time"

	"toron/internal/testnet"
)

// TestReferencesForwardUploads: the upload scenario's references, the naive proxy and the tcp
// relay, pass uploads of both framings byte-exact, and at the end of their lifetime they return
// and no longer listen.
func TestReferencesForwardUploads(t *testing.T) {
	for _, tc := range []struct {
		name     string
		serve    func(options) error
		lifetime time.Duration
	}{
		{"the naive proxy", serveNaiveProxy, 3 * time.Second},
		{"the tcp relay", serveTCPRelay, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t)
			addr, done := startHelperForTest(t, tc.name, tc.serve, up.Addr(), tc.lifetime)
			for _, chunked := range []bool{false, true} {
				rs := Uploads(UploadSpec{Name: "reference", URL: "http://" + addr + "/legacy/upload", N: 2, Size: 2<<20 + 1, Chunked: chunked, Verify: true, Timeout: 10 * time.Second})
				if s := Summarize("", rs); s.OK != 2 {
					t.Errorf("chunked=%v: %d of 2 uploads through %s arrived byte-exact (%s)", chunked, s.OK, tc.name, s.ErrorsText())
				}
			}
			waitHelper(t, tc.name, done)
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Errorf("%s still accepts connections after its lifetime", tc.name)
			}
		})
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

// waitHelper waits for the helper scenario started by startHelperForTest to end, failing the
// test if it hangs or ends with an error.
func waitHelper(t *testing.T, what string, done <-chan error) {
	t.Helper()
	if err := testnet.Ended(t, what, 10*time.Second, done); err != nil {
		t.Errorf("%s ended with %v", what, err)
	}
}
