package main

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
