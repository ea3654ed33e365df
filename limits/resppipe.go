package limits

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// One pipelined connection to a Redis node, driven by its callers (SPEC 17: concurrent
// decisions pipelined on a few connections; no goroutine per request).
//
// There is no writer or reader goroutine. A caller appends its command to the connection's
// write buffer and its call to the queue of replies expected, in one critical section, so the
// two orders agree. The first caller that finds nobody writing becomes the writer: it writes
// the buffer, and whatever other callers appended meanwhile, then leaves. The first caller
// that finds nobody reading becomes the reader: it reads replies, hands each to its call (a
// wake-up for a call of another goroutine), and when its own has come, passes reading on to
// the oldest call still waiting. A decision made alone so costs one write and one read in the
// caller's goroutine and no hand-off at all; rueidis, measured in the same load test, cost
// three goroutine hand-offs (caller to writer, reader, back to caller) and four more thread
// context switches per request (docs/rate-limits.md, "The Redis client"). Under load, the
// commands of the callers that arrive while one writes go out in its next write, and one read
// brings back the replies of many.
//
// A waiting call ends at its deadline: a reader's read carries the deadline, and a call that
// is not reading waits for its reply or its turn with its context. A reply that comes after
// its caller left is read and dropped, so the connection stays in step. A connection whose
// oldest reply has been awaited for redisReplyTimeout when a read ends at its deadline is closed
// (a Redis that hangs), as is one whose read or write failed; its callers get the error at once.

// Call states, guarded by pipeConn.mu.
const (
	callWaiting   = iota // written or queued, no reply yet
	callReplied          // the reply (or the connection's error) is in the call
	callReading          // the call's goroutine was handed the reader's role
	callAbandoned        // the caller left (deadline); the reply is dropped
	callDiscard          // no caller: a reply to drop (ASKING's +OK)
)

// redisCall is one command in flight: its place in the queue and its reply.
type redisCall struct {
	done  chan struct{} // one signal: replied, or the reader's role
	state uint8
	sent  int64 // unix nanoseconds when queued, for the reply timeout
	reply verdictReply
}

// verdictReply is what a reply said: the script's {allowed, wait}, or an error (Redis's, or the
// connection's).
type verdictReply struct {
	ok   bool
	wait int64 // microseconds
	err  error
}

var callPool = sync.Pool{New: func() any { return &redisCall{done: make(chan struct{}, 1)} }}

func getCall() *redisCall { return callPool.Get().(*redisCall) }

// putCall returns a call whose reply was taken. An abandoned call is never returned: the queue
// may still hold it.
func putCall(c *redisCall) {
	select {
	case <-c.done:
	default:
	}
	c.reply = verdictReply{}
	callPool.Put(c)
}

// errRedisConnLost wraps the error of a connection that Redis (or the network) closed or reset:
// its calls failed at once, without waiting, so they are not the breaker's failures (a Redis
// that is down costs no request any time; the node dials anew in the background).
var errRedisConnLost = errors.New("limits: redis connection lost")

// lost returns err as a lost connection's error, unless it is a timeout (a write that could not
// go out before its deadline waited, and counts).
func lost(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return fmt.Errorf("%w: %w", errRedisConnLost, err)
}

// errRedisClosedConn is the error of calls on a connection that was closed under them.
var errRedisClosedConn = errors.New("limits: redis connection closed")

// errRedisReplyTimeout is the error of the calls of a connection closed because Redis had not
// answered its oldest call within redisReplyTimeout.
var errRedisReplyTimeout = errors.New("limits: redis did not answer within the reply timeout")

// pipeConn is one connection to a Redis node, shared by every caller of the process.
type pipeConn struct {
	nc net.Conn

	mu      sync.Mutex
	wbuf    []byte // commands queued and not yet written
	wspare  []byte // the buffer being written, reused for the next
	writing bool
	writer  *redisCall // the call whose goroutine is writing, never handed the reader's role
	reading bool
	queue   callQueue // calls awaiting replies, in the order of their commands
	dead    error     // set once: the connection is closed

	// Owned by the reader.
	rbuf         []byte
	rstart, rend int

	onDead func(*pipeConn) // told once when the connection dies (its node redials)
	tls    bool            // a TLS connection: a write that timed out cannot be resumed
}

func newPipeConn(nc net.Conn, onDead func(*pipeConn)) *pipeConn {
	_, isTLS := nc.(*tls.Conn)
	return &pipeConn{nc: nc, wbuf: make([]byte, 0, 4096), wspare: make([]byte, 0, 4096),
		rbuf: make([]byte, redisReadBuffer), onDead: onDead, tls: isTLS}
}

// redisReadBuffer is the reader's buffer: a decision's reply is about 12 bytes, so one read
// brings back hundreds.
const redisReadBuffer = 16 << 10

// redisWriteBufferMax is the most a connection queues unwritten: past it a call fails at once
// (Redis or the network cannot keep up, and queueing more would only add waiting).
const redisWriteBufferMax = 1 << 20

// Dead reports whether the connection was closed.
func (p *pipeConn) Dead() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dead != nil
}

// do sends the command and waits for its reply until deadline (ctx carries
// the same deadline, for the wait of a call that is not reading). asking prefixes the command
// with ASKING (a slot being migrated: Redis Cluster's ASK redirection).
func (p *pipeConn) do(ctx context.Context, deadline time.Time, now int64, asking bool, cmd scriptCmd) verdictReply {
	if !time.Now().Before(deadline) {
		// Out of time before it was queued (a retry late in its window, a caller descheduled):
		// nothing is sent, and nobody else's call is touched.
		return verdictReply{err: context.DeadlineExceeded}
	}
	c := getCall()
	c.state = callWaiting
	c.sent = now
	p.mu.Lock()
	if p.dead != nil {
		err := p.dead
		p.mu.Unlock()
		putCall(c)
		return verdictReply{err: err}
	}
	if len(p.wbuf) > redisWriteBufferMax {
		p.mu.Unlock()
		putCall(c)
		return verdictReply{err: errRedisBacklog}
	}
	if asking {
		p.wbuf = appendCommand(p.wbuf, "ASKING")
		p.queue.push(&redisCall{state: callDiscard, sent: now})
	}
	p.wbuf = cmd.append(p.wbuf)
	p.queue.push(c)
	write := !p.writing
	if write {
		p.writing, p.writer = true, c
	}
	read := !p.reading
	if read {
		p.reading = true
		c.state = callReading
	}
	p.mu.Unlock()

	if write {
		timedOut := p.flush(deadline)
		p.mu.Lock()
		switch {
		case c.state == callReplied:
			p.mu.Unlock()
			r := c.reply
			putCall(c)
			return r
		case timedOut:
			// The write could not go out in time: the call leaves; its command, still queued,
			// goes out with the next caller's write and its reply is dropped.
			if c.state == callReading {
				c.state = callAbandoned
				p.handOffLocked()
			} else {
				c.state = callAbandoned
			}
			p.mu.Unlock()
			return verdictReply{err: context.DeadlineExceeded}
		case !read && c.state == callWaiting && !p.reading:
			// Nobody reads (the reader's role skipped this call while it wrote): take it.
			p.reading = true
			c.state = callReading
			read = true
		case c.state == callReading:
			read = true
		}
		p.mu.Unlock()
	}
	if !read {
		select {
		case <-c.done:
		case <-ctx.Done():
		}
		p.mu.Lock()
		switch c.state {
		case callReplied:
			p.mu.Unlock()
			r := c.reply
			putCall(c)
			return r
		case callReading:
			if ctx.Err() != nil && time.Now().After(deadline) {
				// Handed the role as the deadline came: pass it on.
				c.state = callAbandoned
				p.handOffLocked()
				p.mu.Unlock()
				return verdictReply{err: context.DeadlineExceeded}
			}
			p.mu.Unlock()
		default: // still waiting: the deadline came
			c.state = callAbandoned
			p.mu.Unlock()
			return verdictReply{err: context.DeadlineExceeded}
		}
	}
	return p.read(c, deadline)
}

var errRedisBacklog = errors.New("limits: redis connection backlog full")

// flush writes the queued commands, and what is queued meanwhile, until the writer's deadline,
// then gives up the role; timedOut says the deadline came first. A plain connection's write that
// timed out resumes where it stopped in the next write (nothing is lost, the stream stays whole);
// a TLS connection's cannot be resumed, and another failed write means the connection is lost:
// both are killed, their calls failing at once.
func (p *pipeConn) flush(deadline time.Time) (timedOut bool) {
	for {
		p.mu.Lock()
		if len(p.wbuf) == 0 || p.dead != nil {
			p.writing, p.writer = false, nil
			p.mu.Unlock()
			return false
		}
		if !time.Now().Before(deadline) {
			// What is queued waits for the next caller's write.
			p.writing, p.writer = false, nil
			p.mu.Unlock()
			return true
		}
		out := p.wbuf
		p.wbuf = p.wspare[:0]
		p.mu.Unlock()
		_ = p.nc.SetWriteDeadline(deadline)
		n, err := p.nc.Write(out)
		var ne net.Error
		switch {
		case err == nil:
			p.mu.Lock()
			p.wspare = out[:0]
			p.mu.Unlock()
		case !p.tls && errors.As(err, &ne) && ne.Timeout():
			p.mu.Lock()
			rest := make([]byte, 0, len(out)-n+len(p.wbuf))
			rest = append(append(rest, out[n:]...), p.wbuf...)
			p.wspare, p.wbuf = p.wbuf[:0], rest
			p.writing, p.writer = false, nil
			p.mu.Unlock()
			return true
		default:
			p.kill(fmt.Errorf("%w: %w", errRedisConnLost, err))
			p.mu.Lock()
			p.writing, p.writer = false, nil
			p.mu.Unlock()
			return false
		}
	}
}

// read is the reader's loop: it reads and hands out replies until c's has come, or c's deadline,
// then passes the role on.
func (p *pipeConn) read(c *redisCall, deadline time.Time) verdictReply {
	for {
		// Hand out the complete replies already read.
		for p.rstart < p.rend {
			r, n, err := parseVerdict(p.rbuf[p.rstart:p.rend])
			if err != nil {
				p.kill(err)
				return p.finish(c)
			}
			if n == 0 {
				break // incomplete
			}
			p.rstart += n
			if p.deliver(c, r) {
				return p.finish(c)
			}
		}
		if p.rstart == p.rend {
			p.rstart, p.rend = 0, 0
		} else if p.rend == len(p.rbuf) {
			if p.rstart == 0 {
				// One reply larger than the buffer: not a verdict.
				p.kill(errBadVerdict)
				return p.finish(c)
			}
			p.rend = copy(p.rbuf, p.rbuf[p.rstart:p.rend])
			p.rstart = 0
		}
		if p.Dead() {
			return p.finish(c)
		}
		_ = p.nc.SetReadDeadline(deadline)
		n, err := p.nc.Read(p.rbuf[p.rend:])
		p.rend += n
		if err != nil && n == 0 {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				p.mu.Lock()
				if c.state == callReplied { // killed meanwhile
					p.mu.Unlock()
					return p.finish(c)
				}
				c.state = callAbandoned
				// Redis has not answered the oldest call for redisReplyTimeout: it hangs.
				stale := time.Now().UnixNano()-p.queue.head().sent > int64(redisReplyTimeout)
				p.handOffLocked()
				p.mu.Unlock()
				if stale {
					p.kill(errRedisReplyTimeout)
				}
				return verdictReply{err: context.DeadlineExceeded}
			}
			p.kill(lost(err))
			return p.finish(c)
		}
	}
}

// deliver gives r to the oldest call and reports whether that was the reader's own; a reply
// nobody asked for (the connection is out of step) kills the connection.
func (p *pipeConn) deliver(self *redisCall, r verdictReply) bool {
	p.mu.Lock()
	c := p.queue.pop()
	switch {
	case c == nil:
		p.mu.Unlock()
		p.kill(errBadVerdict)
		return true
	case c == self:
		c.reply = r
		c.state = callReplied
		p.handOffLocked()
	case c.state == callWaiting:
		c.reply = r
		c.state = callReplied
		c.done <- struct{}{}
	}
	p.mu.Unlock()
	return c == self
}

// handOffLocked passes the reader's role to the oldest call still waiting, or gives it up.
func (p *pipeConn) handOffLocked() {
	for i := range p.queue.len() {
		if c := p.queue.at(i); c.state == callWaiting && c != p.writer {
			c.state = callReading
			c.done <- struct{}{}
			return
		}
	}
	p.reading = false
}

// finish returns c's reply once the connection was killed or c's reply came.
func (p *pipeConn) finish(c *redisCall) verdictReply {
	p.mu.Lock()
	r := c.reply
	if c.state != callReplied {
		r = verdictReply{err: p.dead}
		if r.err == nil {
			r.err = errRedisClosedConn
		}
	}
	p.mu.Unlock()
	putCall(c)
	return r
}

// kill closes the connection: every call waiting gets err, and the node is told.
func (p *pipeConn) kill(err error) {
	p.mu.Lock()
	if p.dead != nil {
		p.mu.Unlock()
		return
	}
	p.dead = err
	for c := p.queue.pop(); c != nil; c = p.queue.pop() {
		switch c.state {
		case callWaiting, callReading:
			c.reply = verdictReply{err: err}
			c.state = callReplied
			select {
			case c.done <- struct{}{}:
			default:
			}
		}
	}
	p.reading = false
	p.mu.Unlock()
	_ = p.nc.Close()
	if p.onDead != nil {
		p.onDead(p)
	}
}

// Close closes the connection; calls waiting fail.
func (p *pipeConn) Close() { p.kill(errRedisClosedConn) }

// callQueue is a ring of calls.
type callQueue struct {
	buf      []*redisCall
	start, n int
}

func (q *callQueue) len() int { return q.n }

func (q *callQueue) at(i int) *redisCall { return q.buf[(q.start+i)%len(q.buf)] }

func (q *callQueue) head() *redisCall {
	if q.n == 0 {
		return nil
	}
	return q.buf[q.start]
}

func (q *callQueue) push(c *redisCall) {
	if q.n == len(q.buf) {
		nb := make([]*redisCall, max(16, 2*len(q.buf)))
		for i := range q.n {
			nb[i] = q.at(i)
		}
		q.buf, q.start = nb, 0
	}
	q.buf[(q.start+q.n)%len(q.buf)] = c
	q.n++
}

func (q *callQueue) pop() *redisCall {
	if q.n == 0 {
		return nil
	}
	c := q.buf[q.start]
	q.buf[q.start] = nil
	q.start = (q.start + 1) % len(q.buf)
	q.n--
	return c
}
