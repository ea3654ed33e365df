package demo

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

const (
	// defaultReportDelay is how long a report takes when ?delay= is absent: long enough to see
	// that the route waits, short enough for a first try.
	defaultReportDelay = 2 * time.Second
	// maxReportDelay caps ?delay=: above the reports route's 60s response_header_timeout (to
	// show the 504), yet no request holds a goroutine for long.
	maxReportDelay = 5 * time.Minute
	// maxReportSizeBytes caps ?size=, the padding streamed after the report (1 GiB).
	maxReportSizeBytes = 1 << 30
	// copyBufferBytes is the buffer one body copy uses: memory per upload stays constant.
	copyBufferBytes = 32 << 10
)

// copyBuffers pools the body-copy buffers.
var copyBuffers = sync.Pool{New: func() any {
	b := make([]byte, copyBufferBytes)
	return &b
}}

// reportPadding is one block of the filler streamed after a report: readable text lines, so a
// curl without -o shows what it is.
var reportPadding = bytes.Repeat([]byte("toron demo report padding: streamed in constant memory ....\n"), 1024)

// apiReply is the fast API's answer: what the upstream saw.
type apiReply struct {
	Service   string `json:"service"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	RequestID string `json:"request_id"`
	BodyBytes int64  `json:"body_bytes"`
	// Instance is the API instance that answered, api-1 or api-2 (failover.go).
	Instance string `json:"instance"`
	// User is the X-User header the gateway set from a verified token (auth.go); Authorization
	// tells whether a credential reached the upstream (the basic route removes it).
	User          string `json:"user,omitempty"`
	Authorization bool   `json:"authorization_forwarded,omitempty"`
}

// reportReply is the report service's answer, before any padding.
type reportReply struct {
	Report    string `json:"report"`
	Delay     string `json:"delay"`
	SizeBytes int64  `json:"size,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// uploadReply is the upload sink's answer: the body it received and how it was framed.
type uploadReply struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// TransferEncoding is "chunked" when the request arrived chunked, else "".
	TransferEncoding string `json:"transfer_encoding"`
	// ContentLength is the request's Content-Length as fasthttp parsed it: -1 when chunked.
	ContentLength int    `json:"content_length"`
	Method        string `json:"method"`
	Path          string `json:"path"`
	RequestID     string `json:"request_id,omitempty"`
}

// errorReply is the body of every demo error, shaped like the gateway's.
type errorReply struct {
	Error string `json:"error"`
}

// serveAPI answers any path under /api at once with what it saw; a body is read and counted.
func (u *Upstreams) serveAPI(ctx *fasthttp.RequestCtx) {
	if !underPrefix(ctx.Path(), "/api") {
		writeError(ctx, fasthttp.StatusNotFound, "the demo API serves /api and paths under it")
		return
	}
	if string(ctx.Path()) == failoverPath {
		u.serveFailover(ctx)
		return
	}
	n, err := u.drainBody(ctx, io.Discard)
	if err != nil {
		writeBodyError(ctx, err)
		return
	}
	if serveCatalog(ctx) { // ?items=N (traffic.go)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, apiReply{
		Service:       "api",
		Method:        string(ctx.Method()),
		Path:          string(ctx.URI().PathOriginal()),
		RequestID:     string(ctx.Request.Header.Peek("X-Request-Id")),
		BodyBytes:     n,
		Instance:      u.instanceOf(ctx),
		User:          string(ctx.Request.Header.Peek("X-User")),
		Authorization: len(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)) > 0,
	})
}

// serveReports answers /legacy/reports after ?delay= (default 2s), then streams ?size= bytes
// of padding after the JSON line. A waiting report answers 503 as soon as Close begins.
func (u *Upstreams) serveReports(ctx *fasthttp.RequestCtx) {
	if !underPrefix(ctx.Path(), "/legacy/reports") {
		writeError(ctx, fasthttp.StatusNotFound, "the demo report service serves /legacy/reports")
		return
	}
	args := ctx.QueryArgs()
	delay := defaultReportDelay
	if v := args.Peek("delay"); v != nil {
		d, err := time.ParseDuration(string(v))
		if err != nil || d < 0 || d > maxReportDelay {
			writeError(ctx, fasthttp.StatusBadRequest,
				fmt.Sprintf("delay must be a Go duration from 0s to %s, such as 15s", maxReportDelay))
			return
		}
		delay = d
	}
	var size int64
	if v := args.Peek("size"); v != nil {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < 0 || n > maxReportSizeBytes {
			writeError(ctx, fasthttp.StatusBadRequest,
				fmt.Sprintf("size must be a byte count from 0 to %d", maxReportSizeBytes))
			return
		}
		size = n
	}

	if delay > 0 {
		u.reportsWaiting.Add(1)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-u.done:
		}
		t.Stop()
		u.reportsWaiting.Add(-1)
		if u.shuttingDown() {
			ctx.SetConnectionClose()
			writeError(ctx, fasthttp.StatusServiceUnavailable, "the demo report service is shutting down")
			return
		}
	}

	head, err := json.Marshal(reportReply{
		Report:    "ready",
		Delay:     delay.String(),
		SizeBytes: size,
		RequestID: string(ctx.Request.Header.Peek("X-Request-Id")),
	})
	if err != nil {
		panic("BUG: demo: cannot encode a report reply: " + err.Error())
	}
	if size == 0 {
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("application/json")
		ctx.SetBody(head)
		return
	}
	head = append(head, '\n')
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/plain; charset=utf-8")
	// A generated reader with a known length: fasthttp copies it to the socket in the handler's
	// goroutine with a Content-Length, so memory stays constant whatever the size.
	ctx.SetBodyStream(&reportBody{slide: slidingDeadline{done: u.done, set: ctx.SetWriteDeadline}, head: head, left: size}, len(head)+int(size))
}

// serveUpload reads the body of any path in constant memory and answers its length, its
// SHA-256 and the framing it arrived with.
func (u *Upstreams) serveUpload(ctx *fasthttp.RequestCtx) {
	h := sha256.New()
	n, err := u.drainBody(ctx, h)
	if err != nil {
		writeBodyError(ctx, err)
		return
	}
	contentLength := ctx.Request.Header.ContentLength()
	te := ""
	if contentLength == -1 {
		// fasthttp parses "Transfer-Encoding: chunked" into a Content-Length of -1.
		te = "chunked"
	}
	writeJSON(ctx, fasthttp.StatusOK, uploadReply{
		Bytes:            n,
		SHA256:           hex.EncodeToString(h.Sum(nil)),
		TransferEncoding: te,
		ContentLength:    contentLength,
		Method:           string(ctx.Method()),
		Path:             string(ctx.URI().PathOriginal()),
		RequestID:        string(ctx.Request.Header.Peek("X-Request-Id")),
	})
}

// drainBody copies the request body to w and returns its length. A streamed body is read
// through a pooled buffer under a read deadline that slides by bodyIdleTimeout, so a slow but
// live upload completes whatever its size.
func (u *Upstreams) drainBody(ctx *fasthttp.RequestCtx, w io.Writer) (int64, error) {
	stream := ctx.RequestBodyStream()
	if stream == nil {
		n, err := w.Write(ctx.PostBody())
		return int64(n), err
	}
	bufp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bufp)
	// onlyWriter hides io.Discard's ReaderFrom, which would bypass the pooled buffer.
	return io.CopyBuffer(onlyWriter{w}, &slidingReader{r: stream, slide: slidingDeadline{done: u.done, set: ctx.SetReadDeadline}}, *bufp)
}

// shuttingDown reports whether Close began.
func (u *Upstreams) shuttingDown() bool {
	select {
	case <-u.done:
		return true
	default:
		return false
	}
}

// slidingDeadline is one of a connection's deadlines (set: its read or its write deadline),
// re-armed to bodyIdleTimeout whenever less than half of the window remains, so that a large
// body to or from a slow but live client completes; once done is closed (Close began), it
// fails instead.
type slidingDeadline struct {
	done  <-chan struct{}
	set   func(time.Time) error
	armed time.Time
}

// next is called before each read of a body: errShuttingDown once Close began, else the
// deadline re-armed when due.
func (d *slidingDeadline) next() error {
	select {
	case <-d.done:
		return errShuttingDown
	default:
	}
	if now := time.Now(); now.Sub(d.armed) > bodyIdleTimeout/2 {
		if err := d.set(now.Add(bodyIdleTimeout)); err != nil {
			return err
		}
		d.armed = now
	}
	return nil
}

// slidingReader reads a request body stream, sliding the connection's read deadline.
type slidingReader struct {
	r     io.Reader
	slide slidingDeadline
}

// Read reads from the stream, or fails once Close began.
func (s *slidingReader) Read(p []byte) (int, error) {
	if err := s.slide.next(); err != nil {
		return 0, err
	}
	return s.r.Read(p)
}

// reportBody is a report's streamed body: the JSON line, then left bytes of padding. It slides
// the connection's write deadline, so a large download to a slow but live client completes.
type reportBody struct {
	slide slidingDeadline
	head  []byte
	left  int64
	off   int
}

// Read fills p with the next bytes of the report, or fails once Close began (the client then
// sees a truncated body, never a clean end).
func (r *reportBody) Read(p []byte) (int, error) {
	if err := r.slide.next(); err != nil {
		return 0, err
	}
	if r.off < len(r.head) {
		n := copy(p, r.head[r.off:])
		r.off += n
		return n, nil
	}
	if r.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n := 0
	for n < len(p) {
		n += copy(p[n:], reportPadding)
	}
	r.left -= int64(n)
	return n, nil
}

// onlyWriter hides every method of its writer but Write.
type onlyWriter struct{ w io.Writer }

// Write writes p to the wrapped writer.
func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

// underPrefix reports whether path is prefix or lies under it, segment-wise as the gateway
// matches (/api matches /api and /api/users, never /apix).
func underPrefix(path []byte, prefix string) bool {
	rest, ok := bytes.CutPrefix(path, []byte(prefix))
	return ok && (len(rest) == 0 || rest[0] == '/')
}

// writeBodyError answers a body that could not be read and closes the connection, since the
// rest of the body was not read.
func writeBodyError(ctx *fasthttp.RequestCtx, err error) {
	ctx.SetConnectionClose()
	switch {
	case errors.Is(err, errShuttingDown):
		writeError(ctx, fasthttp.StatusServiceUnavailable, "the demo upstream is shutting down")
	case errors.Is(err, os.ErrDeadlineExceeded):
		writeError(ctx, fasthttp.StatusRequestTimeout,
			fmt.Sprintf("no body bytes for %s", bodyIdleTimeout))
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "cannot read the request body: "+err.Error())
	}
}

// writeError answers status with the gateway's error shape: {"error":"<code> <reason>: <msg>"}.
func writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	writeJSON(ctx, status, errorReply{Error: fmt.Sprintf("%d %s: %s", status, fasthttp.StatusMessage(status), msg)})
}

// writeJSON answers status with v encoded as JSON.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		panic("BUG: demo: cannot encode a reply: " + err.Error())
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

var (
	_ io.Reader = (*slidingReader)(nil)
	_ io.Reader = (*reportBody)(nil)
	_ io.Writer = onlyWriter{}
)
