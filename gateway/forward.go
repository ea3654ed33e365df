package gateway

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	up "toron/upstream"
)

// forward sends the request to one of the route's targets (SPEC 3 step 9, SPEC 13): the
// balancer picks an eligible target, its pool grants a connection slot, and exchangeOn writes
// the request and reads the response head. An attempt that sent nothing to the target (a
// refused or timed-out dial, a failed TLS handshake, a pool whose slots stayed taken) is
// tried again on another eligible target, up to the route's retries; once a byte of the
// request reached an upstream socket it is never sent again. Every picked target is given its
// outcome (Done): here for a failed attempt, by exchange.finish for the one that answered.
func (g *Gateway) forward(x *exchange, req *fasthttp.Request, resp *fasthttp.Response) (time.Time, error) {
	r := x.route
	var tried [up.MaxRetries + 1]*up.Target
	n := 0
	var err error
	// client_ip_hash hashes the client IP of SPEC 16, the one every consumer sees.
	ip := x.clientIPOf().As16()
	for {
		t := r.set.Pick(ip[:], tried[:n]...)
		if t == nil {
			return time.Time{}, err // every eligible target was tried
		}
		tried[n] = t
		n++
		p := poolOf(t)
		x.upAddr = t.Addr()
		if !p.acquire(r.eff.ConnectTimeout) {
			// Toron's own limit, not the target's failure.
			t.Done(up.Neutral, fasthttp.StatusBadGateway)
			err = errPoolExhausted
		} else {
			x.upTarget, x.upPool, x.upSlot = t, p, true
			var sentAt time.Time
			sentAt, err = g.exchangeOn(x, p, req, resp)
			if err == nil {
				x.upStatus = resp.StatusCode()
				return sentAt, nil
			}
			x.upTarget, x.upPool, x.upSlot = nil, nil, false
			p.release()
			outcome, code := x.attemptOutcome(err)
			t.Done(outcome, code)
			if !sentNothing(err) || outcome == up.Neutral {
				return time.Time{}, err
			}
		}
		if n > r.set.Retries() {
			return time.Time{}, err
		}
		r.set.CountRetry()
	}
}

// sentNothing reports a failed attempt that wrote no byte of the request to the target: the
// only kind another target may be tried after (SPEC 3 step 9).
func sentNothing(err error) bool {
	return errors.As(err, new(*dialError)) || errors.As(err, new(*tlsHandshakeError)) ||
		errors.Is(err, errPoolExhausted)
}

// attemptOutcome classifies a failed attempt for passive health (SPEC 13): the target failed
// (a refused or timed-out dial, a failed handshake, a reset or close before the response
// headers, the header timeout), or nobody did (the client left, its body failed).
func (x *exchange) attemptOutcome(err error) (up.Outcome, int) {
	switch {
	case x.body.err != nil && !errors.Is(x.body.err, io.EOF),
		errors.Is(err, errClientLeft),
		x.watch != nil && x.watch.gone.Load():
		return up.Neutral, statusClientClosed
	}
	return up.Failure, upstreamRejection(err).status
}

// exchangeOn lends a connection of the target's pool, writes the request head and body on it
// and reads the response headers into resp. The response body stays on the connection
// (resp.BodyStream) until the exchange finishes, which gives the connection back
// (exchange.finish).
//
// Why not fasthttp's HostClient: it reads each response through a reader it takes from a pool
// and resets afterwards, so bytes an upstream sent past its response are dropped unseen or left
// in the socket for the next request to read as its answer (response queue poisoning, SPEC 7).
// Here every connection keeps its reader, and a connection with anything beyond its response is
// never reused (upstreamConn).
//
// A reused keep-alive connection that fails before any byte of the request reached its socket
// is replaced once by a new connection to the same target (SPEC 13: not counted against
// retries). It returns when the request was written (sentAt), for the header wait.
func (g *Gateway) exchangeOn(x *exchange, p *upstreamPool, req *fasthttp.Request, resp *fasthttp.Response) (sentAt time.Time, err error) {
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
				err = readResponseHead(c, resp, req.Header.IsHead())
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
		if reused && !retried && c.written == 0 && c.socketWritten == 0 && !c.aborted.Load() {
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
	if !stream && len(body) == 0 && c.deferWrite(buf) {
		// Written by the response head's first read, which then waits for the answer
		// (upstreamraw.go).
		return nil
	}
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
	cw := chunkWriter{c: c}
	if _, err := x.body.WriteTo(&cw); err != nil {
		return err
	}
	return cw.close()
}

// chunkWriter frames each write as one chunk (RFC 9112 7.1): the size line (after the previous
// chunk's CRLF) and the data go out in one writev, so the data is never copied and a chunk
// costs one system call (upstreamConn.writeChunk).
type chunkWriter struct {
	c       *upstreamConn
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
	if err := cw.c.writeChunk(b, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// close writes the last chunk and the empty trailer section.
func (cw *chunkWriter) close() error {
	b := cw.line[:0]
	if cw.started {
		b = append(b, '\r', '\n')
	}
	b = append(b, "0\r\n\r\n"...)
	_, err := cw.c.Write(b)
	return err
}
