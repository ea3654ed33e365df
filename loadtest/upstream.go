package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The load test's own upstream: a small fasthttp server on loopback, so a scenario measures the
// gateway and not the demo. It answers
//
//	/legacy/reports?delay=D            after D (default 0), a small JSON line
//	/legacy/upload, /legacy/stream-upload, /upload
//	                                   reads the body in constant memory, hashes (SHA-256) and
//	                                   counts it, answers {"bytes":N,"sha256":"..."}; with
//	                                   ?verify=none it only counts (sha256 is then "")
//	anything else (/api/...)           at once, a small JSON object; ?size=N streams N bytes
//	                                   instead (slow-read targets)
//
// It has no timeouts of its own: every request it serves ends with the process, and the
// scenarios bound their own clients.

const (
	// maxReportDelay caps ?delay=: long enough for any scenario phase, never a stuck goroutine.
	maxReportDelay = 10 * time.Minute
	// maxResponseBytes caps ?size= (1 GiB).
	maxResponseBytes = 1 << 30
	// sinkBufferBytes is the copy buffer of one upload: memory stays constant per upload.
	sinkBufferBytes = 64 << 10
)

// apiBody is the fast API's answer: about the size of a small JSON API response.
var apiBody = []byte(`{"service":"api","status":"ok","items":[{"id":1,"name":"alpha"},{"id":2,"name":"beta"}]}`)

// fillBlock is the filler of ?size= responses.
var fillBlock = bytes.Repeat([]byte("toron loadtest response filler .................................\n"), 1024)

var sinkBuffers = sync.Pool{New: func() any {
	b := make([]byte, sinkBufferBytes)
	return &b
}}

// Upstream is the load test's upstream server and its counters.
type Upstream struct {
	srv  *fasthttp.Server
	ln   net.Listener
	done chan struct{}
	wg   sync.WaitGroup

	// APIRequests counts answers of the fast API.
	APIRequests atomic.Int64
	// Reports counts the report requests that arrived.
	Reports atomic.Int64
	// ReportsWaiting is the number of reports currently waiting for their delay.
	ReportsWaiting atomic.Int64
	// UploadBytes counts body bytes received by the upload sink.
	UploadBytes atomic.Int64
	// Uploads counts completed uploads.
	Uploads atomic.Int64

	// released is closed by ReleaseReports to end the reports waiting at that moment.
	releaseMu sync.Mutex
	released  chan struct{}
}

// StartUpstream listens on addr (such as 127.0.0.1:0) and serves until Close.
func StartUpstream(addr string) (*Upstream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("loadtest: upstream cannot listen on %s: %w", addr, err)
	}
	u := &Upstream{ln: ln, done: make(chan struct{}), released: make(chan struct{})}
	u.srv = &fasthttp.Server{
		Handler:                      u.handle,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           1 << 40,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		CloseOnShutdown:              true,
		Name:                         "loadtest-upstream",
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		_ = u.srv.Serve(ln)
	}()
	return u, nil
}

// Addr is the upstream's host:port.
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

// URL is the upstream's base URL.
func (u *Upstream) URL() string { return "http://" + u.Addr() }

// ReleaseReports answers every report waiting for its delay now, at once; later reports wait
// for theirs again.
func (u *Upstream) ReleaseReports() {
	u.releaseMu.Lock()
	defer u.releaseMu.Unlock()
	close(u.released)
	u.released = make(chan struct{})
}

func (u *Upstream) releaseChan() <-chan struct{} {
	u.releaseMu.Lock()
	defer u.releaseMu.Unlock()
	return u.released
}

// Close ends waiting reports and stops the server.
func (u *Upstream) Close() error {
	close(u.done)
	err := u.srv.Shutdown()
	u.wg.Wait()
	return err
}

func (u *Upstream) handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch {
	case hasPathPrefix(path, "/legacy/reports"):
		u.serveReport(ctx)
	case hasPathPrefix(path, "/legacy/upload"), hasPathPrefix(path, "/legacy/stream-upload"),
		hasPathPrefix(path, "/upload"):
		u.serveSink(ctx)
	default:
		u.serveAPI(ctx)
	}
}

func (u *Upstream) serveAPI(ctx *fasthttp.RequestCtx) {
	u.APIRequests.Add(1)
	if stream := ctx.RequestBodyStream(); stream != nil {
		_, _ = drain(stream)
	}
	size := ctx.QueryArgs().Peek("size")
	if size == nil {
		ctx.SetContentType("application/json")
		ctx.SetBody(apiBody)
		return
	}
	n, err := strconv.Atoi(string(size))
	if err != nil || n < 0 || n > maxResponseBytes {
		ctx.Error(`{"error":"400 Bad Request: size must be a byte count up to 1 GiB"}`, fasthttp.StatusBadRequest)
		return
	}
	ctx.SetContentType("text/plain")
	ctx.SetBodyStream(&fillReader{left: n}, n)
}

func (u *Upstream) serveReport(ctx *fasthttp.RequestCtx) {
	u.Reports.Add(1)
	var delay time.Duration
	if v := ctx.QueryArgs().Peek("delay"); v != nil {
		d, err := time.ParseDuration(string(v))
		if err != nil || d < 0 || d > maxReportDelay {
			ctx.Error(`{"error":"400 Bad Request: delay must be a Go duration up to 10m"}`, fasthttp.StatusBadRequest)
			return
		}
		delay = d
	}
	if delay > 0 {
		release := u.releaseChan()
		u.ReportsWaiting.Add(1)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-u.done:
		case <-release:
		}
		t.Stop()
		u.ReportsWaiting.Add(-1)
	}
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"report":"ready","delay":"` + delay.String() + `"}`)
}

func (u *Upstream) serveSink(ctx *fasthttp.RequestCtx) {
	var h hash.Hash
	if string(ctx.QueryArgs().Peek("verify")) != "none" {
		h = sha256.New()
	}
	var n int64
	if stream := ctx.RequestBodyStream(); stream != nil {
		var err error
		n, err = drainInto(h, stream)
		u.UploadBytes.Add(n)
		if err != nil {
			ctx.Error(`{"error":"400 Bad Request: body read failed"}`, fasthttp.StatusBadRequest)
			return
		}
	} else {
		body := ctx.PostBody()
		n = int64(len(body))
		if h != nil {
			h.Write(body)
		}
		u.UploadBytes.Add(n)
	}
	u.Uploads.Add(1)
	sum := ""
	if h != nil {
		sum = hex.EncodeToString(h.Sum(nil))
	}
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"bytes":` + strconv.FormatInt(n, 10) + `,"sha256":"` + sum + `"}`)
}

// drain reads r to its end through a pooled buffer and returns the byte count.
func drain(r io.Reader) (int64, error) { return drainInto(nil, r) }

// drainInto reads r to its end through a pooled buffer, writes what it read to h unless h is
// nil, and returns the byte count.
func drainInto(h hash.Hash, r io.Reader) (int64, error) {
	bp := sinkBuffers.Get().(*[]byte)
	defer sinkBuffers.Put(bp)
	var n int64
	for {
		m, err := r.Read(*bp)
		n += int64(m)
		if h != nil {
			h.Write((*bp)[:m])
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

func hasPathPrefix(path []byte, prefix string) bool {
	if !bytes.HasPrefix(path, []byte(prefix)) {
		return false
	}
	return len(path) == len(prefix) || path[len(prefix)] == '/'
}

// fillReader yields left bytes of filler.
type fillReader struct{ left int }

func (f *fillReader) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, io.EOF
	}
	n := min(len(p), f.left, len(fillBlock))
	copy(p, fillBlock[:n])
	f.left -= n
	return n, nil
}

var _ io.Reader = (*fillReader)(nil)
