// This file owns the exchange (SPEC 3 step 9, SPEC 13): the retry loop over a route's targets
// (Set.Forward), and on one target's pool the lend of a connection, the request head and body
// written, the header timer armed, the response head read, and a reused connection replaced
// once when it failed before a byte left.
package upstream

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// Outbound is what an exchange sends besides the request itself. The caller keeps one per
// client connection and sets it for each request, so that an exchange allocates nothing.
type Outbound struct {
	// Head is the buffer the request head is built in, kept across requests.
	Head []byte
	// Body is the request's streamed body (the request's IsBodyStream); nil otherwise.
	Body io.WriterTo
	// Watch, when not nil, is given each connection lent before a byte is written on it: the
	// connection it aborts (Conn.Abort) when the request's client leaves.
	Watch *Watch
	// Observer, when not nil, hears of each attempt on a target (tracing's client spans).
	Observer AttemptObserver
	// Extra are header lines ("Name: value\r\n" each, values free of CR and LF) written after
	// the request's own headers, as they are: a route's header rules rendered once per
	// request rather than set one by one into the fasthttp header (AppendRequestHead).
	Extra []byte
}

// AppendRequestHead appends the request head of h to dst with the header lines extra (see
// Outbound.Extra) before the blank line that ends it.
func AppendRequestHead(dst []byte, h *fasthttp.RequestHeader, extra []byte) []byte {
	dst = h.AppendBytes(dst)
	if len(extra) == 0 {
		return dst
	}
	dst = append(dst[:len(dst)-2], extra...) // AppendBytes ends with the blank line's CRLF
	return append(dst, '\r', '\n')
}

// AttemptObserver hears of each attempt of Forward: AttemptStart once a slot of the target's
// pool is held, before anything is written (it may still change req's headers: the traceparent
// naming this attempt), AttemptEnd when a response head arrived (err nil) or the attempt failed.
type AttemptObserver interface {
	AttemptStart(addr string, req *fasthttp.Request)
	AttemptEnd(err error, resp *fasthttp.Response)
}

// Judge classifies a failed attempt for passive health with what only the caller knows: a
// client that left or whose body failed is nobody's failure (Neutral, and no other target is
// tried); anything else is the target's, with the status the caller answers.
type Judge interface {
	AttemptOutcome(err error) (Outcome, int)
}

// Attempt is what Forward leaves the caller once a response head arrived.
type Attempt struct {
	// Target answered: the caller gives it its outcome (Done) once the response is done.
	Target *Target
	// Pool is Target's: the caller holds one of its slots, released after Conn is Put back.
	Pool *Pool
	// Conn carries the response body (resp.BodyStream).
	Conn *Conn
	// Addr is the last target tried, answered or not (for the access log).
	Addr string
	// SentAt is when the request was written, for the header wait.
	SentAt time.Time
}

// Forward sends req to one of s's targets (SPEC 3 step 9, SPEC 13): the balancer picks an
// eligible target (clientIP for client_ip_hash), its pool grants a connection slot within
// wait (connect_timeout), and Pool.Exchange writes the request and reads the response head. An
// attempt that sent nothing to the target (a refused or timed-out dial, a failed TLS
// handshake, a pool whose slots stayed taken) is tried again on another eligible target, up to
// the route's retries; once a byte of the request reached an upstream socket it is never sent
// again. Every picked target is given its outcome (Done): here for a failed attempt, judged by
// judge; by the caller for the one that answered. Every attempt failed: the last one's error.
// A route without any target (DNS discovery found none) is ErrNoTarget, with no attempt.
//
// Each attempt gives its target its peak-EWMA sample (Target.Observe, SPEC 13) here: for the
// one that answered, the time from the last request byte written to the response head (so a
// long upload is not latency), judged by the head's status (a 502, 503 or 504 counts as at
// least FailureSample); for a failed attempt the time waited since the last byte written (0
// if nothing was), at least FailureSample when judge calls it the target's failure, nothing
// when nobody's.
func (s *Set) Forward(clientIP []byte, wait time.Duration, out *Outbound, req *fasthttp.Request, resp *fasthttp.Response, judge Judge, a *Attempt) error {
	var tried [MaxRetries + 1]*Target
	n := 0
	*a = Attempt{}
	var err error
	for {
		t := s.Pick(clientIP, tried[:n]...)
		if t == nil {
			if n == 0 {
				return ErrNoTarget
			}
			return err // every eligible target was tried
		}
		tried[n] = t
		n++
		p, _ := t.Attached().(*Pool)
		a.Addr = t.Addr()
		if p == nil {
			// The target left the route between the pick and now (a DNS refresh or a reload
			// retired it and closed its pool): nothing was sent, another target may serve.
			t.Done(Neutral, fasthttp.StatusBadGateway)
			err = ErrTargetGone
		} else if !p.Acquire(wait) {
			// Toron's own limit, not the target's failure.
			t.Done(Neutral, fasthttp.StatusBadGateway)
			err = ErrPoolExhausted
		} else {
			var c *Conn
			var sentAt time.Time
			if out.Observer != nil {
				out.Observer.AttemptStart(a.Addr, req)
			}
			c, sentAt, err = p.Exchange(out, req, resp)
			if out.Observer != nil {
				out.Observer.AttemptEnd(err, resp)
			}
			if err == nil {
				t.Observe(time.Since(sentAt), OutcomeOf(resp.StatusCode()))
				a.Target, a.Pool, a.Conn, a.SentAt = t, p, c, sentAt
				return nil
			}
			p.Release()
			outcome, code := judge.AttemptOutcome(err)
			var waited time.Duration
			if !sentAt.IsZero() {
				waited = time.Since(sentAt)
			}
			t.Observe(waited, outcome)
			t.Done(outcome, code)
			if !SentNothing(err) || outcome == Neutral {
				return err
			}
		}
		if n > s.Retries() {
			return err
		}
		s.CountRetry()
	}
}

// ErrTargetGone is an attempt on a target that left its route after the balancer picked it
// (its pool closed): no byte was sent, so another target may be tried (SPEC 3 step 9).
var ErrTargetGone = errors.New("upstream: target left the route before the request was sent")

// PoolOf returns the connection pool attached to t (Target.Attach). A target without one is
// a programming error.
func PoolOf(t *Target) *Pool {
	p, _ := t.Attached().(*Pool)
	if p == nil {
		panic("BUG: upstream: target without a connection pool")
	}
	return p
}

// Exchange lends a connection of p, writes req on it (the head, and the body: out.Body when
// streamed) and reads the response headers into resp. The response body stays on the
// connection (resp.BodyStream) until the caller gives the connection back with Put, with
// KeepAlive's verdict and whether the body was read to the end; the caller holds one of p's
// slots (Acquire) meanwhile, and releases it after the Put.
//
// Why not fasthttp's HostClient: it reads each response through a reader it takes from a pool
// and resets afterwards, so bytes an upstream sent past its response are dropped unseen or left
// in the socket for the next request to read as its answer (response queue poisoning, SPEC 7).
// Here every connection keeps its reader, and a connection with anything beyond its response is
// never reused (Conn).
//
// A reused keep-alive connection that fails before any byte of the request reached its socket
// is replaced once by a new connection to the same target (SPEC 13: not counted against
// retries). It returns when the request was written (sentAt), for the header wait and the
// latency sample. On error the connection is closed and c is nil; sentAt is still when the
// request was written, zero if it was not.
func (p *Pool) Exchange(out *Outbound, req *fasthttp.Request, resp *fasthttp.Response) (c *Conn, sentAt time.Time, err error) {
	for retried := false; ; retried = true {
		c, reused, err := p.lend()
		if err != nil {
			return nil, time.Time{}, err
		}
		if out.Watch != nil {
			out.Watch.Attach(c)
		}
		c.begin()
		err = c.writeRequest(out, req)
		if err == nil {
			sentAt = time.Now()
			if err = c.forwarded(sentAt); err == nil {
				err = c.readResponseHead(resp, req)
			}
		}
		if err == nil {
			c.slide.Store(true)
			return c, sentAt, nil
		}
		c.Kill()
		if reused && !retried && c.written == 0 && c.socketWritten == 0 && !c.aborted.Load() {
			continue
		}
		return nil, sentAt, err
	}
}

// KeepAlive reports whether the connection that read resp's head may carry another request
// once the body is read to the end.
func KeepAlive(resp *fasthttp.Response) bool {
	return resp.Header.IsHTTP11() && !resp.ConnectionClose() && resp.Header.ContentLength() != -2
}

// SentNothing reports a failed attempt that wrote no byte of the request to the target: the
// only kind another target may be tried after (SPEC 3 step 9).
func SentNothing(err error) bool {
	return errors.As(err, new(*DialError)) || errors.As(err, new(*TLSHandshakeError)) ||
		errors.Is(err, ErrPoolExhausted) || errors.Is(err, ErrTargetGone)
}

// ErrUnexpectedUpgrade reports a 101 Switching Protocols to a request that asked no upgrade
// (RFC 9110 15.2.2): what follows on the connection is another protocol, so it is answered 502
// and the connection closed, never pooled.
var ErrUnexpectedUpgrade = errors.New("upstream: 101 Switching Protocols to a request that asked no upgrade")

// readResponseHead reads the response line and headers (interim 1xx answers skipped; fasthttp
// returns a 101); the body becomes resp's body stream, read from the connection as the client
// takes it.
func (c *Conn) readResponseHead(resp *fasthttp.Response, req *fasthttp.Request) error {
	resp.StreamBody = true
	resp.SkipBody = req.Header.IsHead()
	if err := resp.ReadLimitBody(c.br, 0); err != nil {
		return err
	}
	if resp.StatusCode() == fasthttp.StatusSwitchingProtocols && len(req.Header.Peek(fasthttp.HeaderUpgrade)) == 0 {
		return ErrUnexpectedUpgrade
	}
	return nil
}

// headInline is the largest buffered body sent in the same write as the request head (one
// system call for a small POST). The buffer is the client connection's and is kept between
// its requests, so it stays small.
const headInline = 4 << 10

// writeRequest writes the request head and body to c: a buffered body with its Content-Length
// in the head's write, a streamed one through out.Body (Content-Length kept, or chunked with
// sizes of Toron's choosing).
func (c *Conn) writeRequest(out *Outbound, req *fasthttp.Request) error {
	h := &req.Header
	stream := req.IsBodyStream()
	var body []byte
	if !stream {
		body = req.Body()
		if len(body) > 0 || !(h.IsGet() || h.IsHead()) {
			h.SetContentLength(len(body))
		}
	}
	buf := AppendRequestHead(out.Head[:0], h, out.Extra)
	if len(body) > 0 && len(body) <= headInline {
		buf = append(buf, body...)
		body = nil
	}
	out.Head = buf
	if !stream && len(body) == 0 && c.deferWrite(buf) {
		// Written by the response head's first read, which then waits for the answer
		// (socket.RawPath).
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
		_, err := out.Body.WriteTo(c)
		return err
	}
	cw := chunkWriter{c: c}
	if _, err := out.Body.WriteTo(&cw); err != nil {
		return err
	}
	return cw.close()
}

// chunkWriter frames each write as one chunk (RFC 9112 7.1): the size line (after the previous
// chunk's CRLF) and the data go out in one writev, so the data is never copied and a chunk
// costs one system call (Conn.writeChunk).
type chunkWriter struct {
	c       *Conn
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
