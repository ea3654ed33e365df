package gateway

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sinkHandler reads the body, answering what it saw: bytes, sha256, Content-Length and
// Transfer-Encoding.
func sinkHandler(got *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, io.TeeReader(r.Body, countWriter{got}))
		status := 200
		if err != nil {
			status = 400
		}
		w.Header().Set("X-Seen-CL", fmt.Sprint(r.ContentLength))
		w.Header().Set("X-Seen-TE", strings.Join(r.TransferEncoding, ","))
		w.WriteHeader(status)
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	}
}

// sinkAnswer is what sinkHandler answers for the body b: its length and SHA-256.
func sinkAnswer(b []byte) string {
	h := sha256.Sum256(b)
	return fmt.Sprintf("%d %s", len(b), hex.EncodeToString(h[:]))
}

type countWriter struct{ n *atomic.Int64 }

func (c countWriter) Write(p []byte) (int, error) {
	if c.n != nil {
		c.n.Add(int64(len(p)))
	}
	return len(p), nil
}

// patternReader generates size pseudo-random bytes on the fly and hashes them as it goes.
type patternReader struct {
	left int64
	rng  *rand.Rand
	sum  hashWriter
}

type hashWriter interface {
	io.Writer
	Sum([]byte) []byte
}

func newPatternReader(size int64) *patternReader {
	return &patternReader{left: size, rng: rand.New(rand.NewSource(size)), sum: sha256.New()}
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	p.rng.Read(b)
	p.left -= int64(len(b))
	p.sum.Write(b)
	return len(b), nil
}

func (p *patternReader) hex() string { return hex.EncodeToString(p.sum.Sum(nil)) }

func TestUpload200MBByteExact(t *testing.T) {
	if testing.Short() {
		t.Skip("200 MB upload")
	}
	up := startUpstream(t, sinkHandler(nil))
	gw := startGateway(t, "", upstreamRoute("/legacy/upload", up.addr, "max_body_bytes: 209715200\nmax_concurrency: 16\nread_timeout: 10s\nstream_request_body: true"))
	const size = 200_000_000
	src := newPatternReader(size)
	req, _ := http.NewRequest("POST", "http://"+gw.addr+"/legacy/upload/file.bin", src)
	req.ContentLength = size
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != fmt.Sprintf("%d %s", size, src.hex()) {
		t.Fatalf("status %d, upstream saw %q, sent %d %s", resp.StatusCode, b, size, src.hex())
	}
	if resp.Header.Get("X-Seen-CL") != fmt.Sprint(size) {
		t.Errorf("upstream saw Content-Length %s", resp.Header.Get("X-Seen-CL"))
	}
}

// chunkedUpload sends body as chunked over a raw connection and returns the response.
func chunkedUpload(t *testing.T, addr, path string, chunks []string) rawResponse {
	t.Helper()
	c := dialRaw(t, addr)
	defer c.Close()
	w := bufio.NewWriter(c)
	fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", path)
	for _, ch := range chunks {
		fmt.Fprintf(w, "%x\r\n%s\r\n", len(ch), ch)
	}
	io.WriteString(w, "0\r\n\r\n")
	w.Flush()
	return readRawResponse(t, c, "POST")
}

func TestChunkedModes(t *testing.T) {
	up := startUpstream(t, sinkHandler(nil))
	gw := startGateway(t, "stream_threshold_bytes: 1000\n",
		upstreamRoute("/norm", up.addr, "inbound_chunked_mode: normalize")+
			upstreamRoute("/pass", up.addr, "inbound_chunked_mode: passthrough"))
	small := []string{"hello ", "world"}
	large := []string{strings.Repeat("a", 700), strings.Repeat("b", 700)}
	sum := func(chunks []string) string { return sinkAnswer([]byte(strings.Join(chunks, ""))) }
	for _, tc := range []struct {
		path     string
		chunks   []string
		wantCL   string
		wantTE   string
		wantBody string
	}{
		{"/norm/x", small, "11", "", sum(small)},
		{"/norm/x", large, "-1", "chunked", sum(large)},
		{"/pass/x", small, "-1", "chunked", sum(small)},
		{"/pass/x", large, "-1", "chunked", sum(large)},
	} {
		resp := chunkedUpload(t, gw.addr, tc.path, tc.chunks)
		if resp.StatusCode != 200 || string(resp.body) != tc.wantBody {
			t.Errorf("%s (%d bytes): %d %q, want %q", tc.path, len(strings.Join(tc.chunks, "")), resp.StatusCode, resp.body, tc.wantBody)
		}
		if cl, te := resp.Header.Get("X-Seen-CL"), resp.Header.Get("X-Seen-TE"); cl != tc.wantCL || te != tc.wantTE {
			t.Errorf("%s (%d bytes): upstream saw Content-Length %s, Transfer-Encoding %q; want %s %q", tc.path, len(strings.Join(tc.chunks, "")), cl, te, tc.wantCL, tc.wantTE)
		}
	}
}

func TestTier2CutChunked(t *testing.T) {
	var got atomic.Int64
	up := startUpstream(t, sinkHandler(&got))
	const limit = 300_000
	gw := startGateway(t, "", upstreamRoute("/up", up.addr, fmt.Sprintf("max_body_bytes: %d\ninbound_chunked_mode: passthrough", limit)))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "POST /up/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk := strings.Repeat("z", 10_000)
	go func() {
		// Keep sending well past the limit; the gateway cuts us off.
		for i := 0; i < 200; i++ {
			if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
				return
			}
		}
	}()
	resp := readRawResponse(t, c, "POST")
	if resp.StatusCode != 413 || !strings.HasPrefix(string(resp.body), `{"error":"413 Payload Too Large: `) {
		t.Fatalf("status %d %s", resp.StatusCode, resp.body)
	}
	if !resp.Close {
		t.Errorf("no Connection: close")
	}
	time.Sleep(200 * time.Millisecond)
	if n := got.Load(); n > limit+64<<10 {
		t.Errorf("upstream received %d bytes, limit %d plus one buffer", n, limit)
	}
}

func TestTier2CutNormalizeBuffered(t *testing.T) {
	up := startUpstream(t, sinkHandler(nil))
	gw := startGateway(t, "", upstreamRoute("/up", up.addr, "max_body_bytes: 100"))
	resp := chunkedUpload(t, gw.addr, "/up/x", []string{strings.Repeat("q", 80), strings.Repeat("r", 80)})
	if resp.StatusCode != 413 {
		t.Fatalf("status %d %s", resp.StatusCode, resp.body)
	}
	if up.requests.Load() != 0 {
		t.Errorf("upstream got the request")
	}
}

func TestClientAbortMidUploadCancelsUpstream(t *testing.T) {
	aborted := make(chan time.Time, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			aborted <- time.Now()
		}
	})
	gw := startGateway(t, "", upstreamRoute("/up", up.addr, "max_body_bytes: 100MiB"))
	c := dialRaw(t, gw.addr)
	io.WriteString(c, "POST /up/x HTTP/1.1\r\nHost: a\r\nContent-Length: 10000000\r\n\r\n")
	c.Write(make([]byte, 1_000_000))
	time.Sleep(200 * time.Millisecond)
	closedAt := time.Now()
	c.Close()
	select {
	case at := <-aborted:
		// At once on an idle machine; the bound is generous for -race on loaded cores, and far
		// below read_timeout (5 s), which a missed abort would wait for.
		if d := at.Sub(closedAt); d > 3*time.Second {
			t.Errorf("upstream saw the abort after %v, want at once (bound 3 s)", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("upstream never saw the client abort")
	}
	waitIdle(t, gw.g)
}

func TestUpstreamAbortTruncatesClient(t *testing.T) {
	// The upstream sends 100 KB of its body (of 1 MB declared when length is set, else
	// chunked), then closes the connection.
	truncated := func(length string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if length != "" {
				w.Header().Set("Content-Length", length)
			}
			w.WriteHeader(200)
			w.Write(make([]byte, 100_000))
			w.(http.Flusher).Flush()
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		}
	}
	up := startUpstream(t, truncated("1000000"))
	chunkedUp := startUpstream(t, truncated(""))
	gw := startGateway(t, "", upstreamRoute("/fixed", up.addr, "")+upstreamRoute("/chunked", chunkedUp.addr, ""))
	for _, path := range []string{"/fixed", "/chunked"} {
		resp, err := http.Get("http://" + gw.addr + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Errorf("%s: client saw a clean end of a truncated response", path)
		}
	}
	waitIdle(t, gw.g)
}

func TestStreamRequestBodyFalseBuffers(t *testing.T) {
	up := startUpstream(t, sinkHandler(nil))
	gw := startGateway(t, "", upstreamRoute("/buf", up.addr, "stream_request_body: false"))
	c := dialRaw(t, gw.addr)
	body := strings.Repeat("m", 200_000) // above the stream threshold
	io.WriteString(c, fmt.Sprintf("POST /buf/x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", len(body)))
	io.WriteString(c, body[:100_000])
	time.Sleep(300 * time.Millisecond)
	if n := up.requests.Load(); n != 0 {
		t.Fatalf("upstream saw the request before the body was complete")
	}
	io.WriteString(c, body[100_000:])
	resp := readRawResponse(t, c, "POST")
	if resp.StatusCode != 200 || string(resp.body) != sinkAnswer([]byte(body)) {
		t.Fatalf("%d %s", resp.StatusCode, resp.body)
	}
}

// TestUpstreamFailureDuringChunkedBodyIs502: an upstream that closes or stops reading while a
// chunked body streams to it is the upstream's failure, not the client's.
func TestUpstreamFailureDuringChunkedBodyIs502(t *testing.T) {
	closer := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.CopyN(io.Discard, r.Body, 100_000)
		hj := w.(http.Hijacker)
		if c, _, err := hj.Hijack(); err == nil {
			resetConn(c)
		}
	})
	// The staller never reads the body and never answers on its own: only the gateway's
	// upstream write window can end the request (before, it returned after 3 s and net/http's
	// close produced the 502 even with that window broken).
	release := make(chan struct{})
	staller := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // before the upstream's shutdown (cleanups run last first)
	gw := startGateway(t, "", upstreamRoute("/close", closer.addr, "max_body_bytes: 1GiB\nmax_concurrency: 4\ninbound_chunked_mode: passthrough")+
		upstreamRoute("/stall", staller.addr, "max_body_bytes: 1GiB\nmax_concurrency: 4\nwrite_timeout: 1s\ninbound_chunked_mode: passthrough"))
	for _, tc := range []struct{ path, body string }{
		{"/close/x", `{"error":"502 Bad Gateway: `},
		{"/stall/x", `{"error":"502 Bad Gateway: upstream stopped reading the request"}`},
	} {
		path := tc.path
		c := dialRaw(t, gw.addr)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", path)
		go func() {
			chunk := strings.Repeat("c", 32<<10)
			for i := 0; i < 2000; i++ {
				if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
					return
				}
			}
		}()
		start := time.Now()
		resp := readRawResponse(t, c, "POST")
		c.Close()
		if resp.StatusCode != 502 || !strings.HasPrefix(string(resp.body), tc.body) {
			t.Errorf("%s: %d %s, want %s", path, resp.StatusCode, resp.body, tc.body)
		}
		if d := time.Since(start); d > 8*time.Second {
			t.Errorf("%s: the 502 came after %v; the upstream write window is 1s", path, d)
		}
	}
}
