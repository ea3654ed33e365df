package gateway

import (
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// forward is Toron's own upstream exchange (SPEC 3 step 9): it lends a connection of the
// route's pool, writes the request head and body on it and reads the response headers into
// resp. The response body stays on the connection (resp.BodyStream) until the exchange
// finishes, which gives the connection back (exchange.finish).
//
// Why not fasthttp's HostClient: it reads each response through a reader it takes from a pool
// and resets afterwards, so bytes an upstream sent past its response are dropped unseen or left
// in the socket for the next request to read as its answer (response queue poisoning, SPEC 7).
// Here every connection keeps its reader, and a connection with anything beyond its response is
// never reused (upstreamConn).
//
// Retries (SPEC 3 step 9): a reused keep-alive connection that fails before any byte of the
// request reached its socket is replaced once by a new connection; nothing else is retried, and
// a request is never sent twice once a byte of it was written. It returns when the request was
// written (sentAt), for the header wait.
func (g *Gateway) forward(x *exchange, req *fasthttp.Request, resp *fasthttp.Response) (sentAt time.Time, err error) {
	p := x.route.pool
	for retried := false; ; retried = true {
		c, reused, err := p.conn()
		if err != nil {
			return time.Time{}, err
		}
		x.upConn = c
		if x.watch != nil {
			x.watch.attach(c)
		}
		c.begin()
		err = x.writeRequest(c, req)
		if err == nil {
			sentAt = time.Now()
			if err = c.forwarded(sentAt); err == nil {
				if err = c.awaitResponse(); err == nil {
					err = readResponseHead(c, resp, req.Header.IsHead())
				}
			}
		}
		if err == nil {
			c.slide.Store(true)
			x.upReusable = resp.Header.IsHTTP11() && !resp.ConnectionClose() &&
				resp.Header.ContentLength() != -2
			return sentAt, nil
		}
		x.upConn = nil
		c.kill()
		if reused && !retried && c.written == 0 && !c.aborted.Load() {
			continue
		}
		return time.Time{}, err
	}
}

// readResponseHead reads the response line and headers (interim 1xx answers skipped); the body
// becomes resp's body stream, read from the connection as the client takes it.
func readResponseHead(c *upstreamConn, resp *fasthttp.Response, head bool) error {
	resp.StreamBody = true
	resp.SkipBody = head
	return resp.ReadLimitBody(c.br, 0)
}

// upstreamHeadInline is the largest buffered body sent in the same write as the request head
// (one system call for a small POST). The buffer is the client connection's and is kept between
// its requests, so it stays small.
const upstreamHeadInline = 4 << 10

// writeRequest writes the request head and body to c: a buffered body with its Content-Length
// in the head's write, a streamed one through x.body (Content-Length kept, or chunked with sizes
// of Toron's choosing).
func (x *exchange) writeRequest(c *upstreamConn, req *fasthttp.Request) error {
	h := &req.Header
	stream := req.IsBodyStream()
	var body []byte
	if !stream {
		body = req.Body()
		if len(body) > 0 || !(h.IsGet() || h.IsHead()) {
			h.SetContentLength(len(body))
		}
	}
	buf := h.AppendBytes(x.head[:0])
	if len(body) > 0 && len(body) <= upstreamHeadInline {
		buf = append(buf, body...)
		body = nil
	}
	x.head = buf
	if _, err := c.Write(buf); err != nil {
		return err
	}
	if len(body) > 0 {
		if _, err := c.Write(body); err != nil {
			return err
		}
	}
	if !stream {
		return nil
	}
	if h.ContentLength() >= 0 {
		_, err := x.body.WriteTo(c)
		return err
	}
	cw := chunkWriter{w: c}
	if _, err := x.body.WriteTo(&cw); err != nil {
		return err
	}
	return cw.close()
}

// chunkWriter frames each write as one chunk (RFC 9112 7.1) in two writes: the size line
// (after the previous chunk's CRLF) and the data, so the data is never copied.
type chunkWriter struct {
	w       io.Writer
	started bool
	line    [24]byte
}

func (cw *chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b := cw.line[:0]
	if cw.started {
		b = append(b, '\r', '\n')
	}
	cw.started = true
	b = strconv.AppendUint(b, uint64(len(p)), 16)
	b = append(b, '\r', '\n')
	if _, err := cw.w.Write(b); err != nil {
		return 0, err
	}
	return cw.w.Write(p)
}

// close writes the last chunk and the empty trailer section.
func (cw *chunkWriter) close() error {
	b := cw.line[:0]
	if cw.started {
		b = append(b, '\r', '\n')
	}
	b = append(b, "0\r\n\r\n"...)
	_, err := cw.w.Write(b)
	return err
}
