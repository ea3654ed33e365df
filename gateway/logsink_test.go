package gateway

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"toron/internal/testnet"
)

// TestLogSinkOrderAndBounds: lines come out whole and in order across size-triggered flushes,
// a line longer than the buffer included; nothing is written before the buffer fills or the
// sink is flushed; Close writes the rest and may be called twice.
func TestLogSinkOrderAndBounds(t *testing.T) {
	w := &testnet.Buffer{}
	s := NewLogSink(w, 100, time.Hour)
	var want strings.Builder
	for i := range 50 {
		line := fmt.Sprintf("line %02d\n", i) // 8 bytes: 12 fit in the buffer
		if i == 30 {
			line = strings.Repeat("x", 250) + "\n"
		}
		want.WriteString(line)
		if _, err := s.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if i == 5 && w.Writes() != 0 {
			t.Fatalf("%d writes before the buffer filled", w.Writes())
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := w.String(); got != want.String() {
		t.Fatalf("sink wrote\n%q\nwant\n%q", got, want.String())
	}
	if w.Writes() < 4 || w.Writes() > 8 {
		t.Errorf("%d writes for 400 bytes through a 100-byte buffer", w.Writes())
	}
}

// TestAccessLinesThroughSink: through the LogSink's core, the access line's strings are the
// connection's buffers, used in place; consecutive requests on one keep-alive connection each
// get their own values (the line is encoded before the buffers are reused), and a logger
// with another core still gets copies (TestAccessLogLine, with zaptest's observer).
func TestAccessLinesThroughSink(t *testing.T) {
	up := startUpstream(t, nil)
	cfg := loadConfig(t, "", upstreamRoute("/api", up.addr, ""))
	cfg.Log.Access = true
	w := &testnet.Buffer{}
	sink := NewLogSink(w, LogBufferBytes, time.Hour)
	g, err := New(cfg, zap.New(sink.Core(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zap.InfoLevel)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGateway(t, g)
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1}
	defer hc.CloseIdleConnections()
	paths := []string{"/api/first-request-path", "/api/b", "/api/third"}
	for i, p := range paths {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + addr + p)
		req.Header.Set("X-Request-Id", fmt.Sprintf("rid-%d-%s", i, strings.Repeat("x", 3-i)))
		req.Header.SetMethod([]string{"GET", "DELETE", "PUT"}[i])
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("request %d: %v %d", i, err, resp.StatusCode())
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_ = sink.Flush()
		n := strings.Count(w.String(), `"msg":"request"`)
		if n == len(paths) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d access lines, want %d", n, len(paths))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	out := w.String()
	i := 0
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var got struct {
			Msg, Path, Method string
			RequestID         string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if got.Msg != AccessLogMessage {
			continue
		}
		want := struct{ path, method, id string }{paths[i], []string{"GET", "DELETE", "PUT"}[i], fmt.Sprintf("rid-%d-%s", i, strings.Repeat("x", 3-i))}
		if got.Path != want.path || got.Method != want.method || got.RequestID != want.id {
			t.Errorf("line %d: path %q method %q id %q, want %q %q %q", i, got.Path, got.Method, got.RequestID, want.path, want.method, want.id)
		}
		i++
	}
}

// BenchmarkAccessLine is the cost of one access line through the sink's core (encoding and
// buffering; the sink writes to io.Discard), on a real connection's exchange.
func BenchmarkAccessLine(b *testing.B) {
	g, x := accessExchange(b, func(s *LogSink) zapcore.Core {
		return s.Core(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zap.InfoLevel)
	})
	benchmarkAccessLine(b, g, x)
}

// benchmarkAccessLine logs one typical request's line per iteration.
func benchmarkAccessLine(b *testing.B, g *Gateway, x *exchange) {
	x.reqID = append(x.reqID[:0], "5f2a9c1e0b7d-1a2b"...)
	x.method = append(x.method[:0], "GET"...)
	x.path = append(x.path[:0], "/api/users/42"...)
	x.status, x.bytesOut, x.start, x.elapsed = 200, 27, time.Now(), 180*time.Microsecond
	b.ReportAllocs()
	for b.Loop() {
		g.logAccess(x)
	}
}

// BenchmarkAccessLineToFile is the access line of requests on two cores at once, each on its
// own connection, through a sink writing to a file, as the binary does with its stderr
// redirected: encoding, the sink's lock, and the write(2) of a full buffer into the page cache,
// per line; for the binary's buffer size (LogBufferBytes) and others beside it.
func BenchmarkAccessLineToFile(b *testing.B) {
	for _, size := range []int{16 << 10, 64 << 10, LogBufferBytes, 1 << 20} {
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) { benchmarkAccessLineToFile(b, size) })
	}
}

func benchmarkAccessLineToFile(b *testing.B, size int) {
	f, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	cfg := loadConfig(b, "", upstreamRoute("/api", "127.0.0.1:1", ""))
	cfg.Log.Access = true
	sink := NewLogSink(f, size, LogFlushInterval)
	defer sink.Close()
	g, err := New(cfg, zap.New(sink.JSONCore(zap.InfoLevel)))
	if err != nil {
		b.Fatal(err)
	}
	xs := make([]*exchange, 8)
	for i := range xs {
		_, server := testnet.Pair(b)
		cc := &clientConn{Conn: server}
		x := cc.ex()
		x.conn, x.g, x.stats = cc, g, g.none
		x.reqID = append(x.reqID[:0], "5f2a9c1e0b7d-1a2b"...)
		x.method = append(x.method[:0], "GET"...)
		x.path = append(x.path[:0], "/api/users/42"...)
		x.status, x.bytesOut, x.start, x.elapsed = 200, 27, time.Now(), 180*time.Microsecond
		xs[i] = x
	}
	var next atomic.Int32
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		x := xs[int(next.Add(1)-1)%len(xs)]
		for pb.Next() {
			g.logAccess(x)
		}
	})
}
