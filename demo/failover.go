package demo

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// The /api route of the demo is served by two instances of the demo API (SPEC 13), so that the
// balancer, passive health and the retry on another target can be watched from a terminal.
const (
	// instanceAPI1 and instanceAPI2 name the two API instances in their answers.
	instanceAPI1 = "api-1"
	instanceAPI2 = "api-2"
	// failoverPath stops the second instance: POST /api/failover.
	failoverPath = "/api/failover"
	// failoverStop is how long a stopped instance refuses connections: as long as passive
	// health's first ejection (eject_time 30s), so both the failover and the return are seen.
	failoverStop = 30 * time.Second
)

// instanceOf names the API instance that received ctx, from the address it arrived on.
func (u *Upstreams) instanceOf(ctx *fasthttp.RequestCtx) string {
	if ctx.LocalAddr().String() == u.API2 {
		return instanceAPI2
	}
	return instanceAPI1
}

// wrapListener makes the second API instance's listener stoppable; the others are unchanged.
func (u *Upstreams) wrapListener(name string, l net.Listener) net.Listener {
	if name != instanceAPI2 {
		return l
	}
	return &pausableListener{current: l, addr: l.Addr(), resumed: closedChan()}
}

// failoverReply is the answer of POST /api/failover.
type failoverReply struct {
	Stopped    string `json:"stopped"`
	For        string `json:"for"`
	AnsweredBy string `json:"answered_by"`
}

// serveFailover stops api-2 for failoverStop: its listener closes (new connections are
// refused) and its open connections are cut before the answer leaves, as when an instance
// crashes; then it listens on the same port again. Either instance may receive the request.
func (u *Upstreams) serveFailover(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "POST /api/failover stops api-2 for 30s")
		return
	}
	var srv *server
	for _, s := range u.servers {
		if s.name == instanceAPI2 {
			srv = s
		}
	}
	pl, ok := srv.ln.Listener.(*pausableListener)
	if !ok {
		panic("BUG: demo: api-2 has no pausable listener")
	}
	if err := pl.pause(failoverStop, u.done, &u.wg); err != nil {
		writeError(ctx, fasthttp.StatusConflict, err.Error())
		return
	}
	// The open connections are cut now, as a crash would, so that the very next request through
	// the gateway already finds api-2 gone; when api-2 itself received this request, its own
	// connection closes after this answer instead (Connection: close).
	var keep net.Conn
	if u.instanceOf(ctx) == instanceAPI2 {
		keep = ctx.Conn()
		ctx.SetConnectionClose()
	}
	srv.ln.closeConnsExcept(keep)
	writeJSON(ctx, fasthttp.StatusOK, failoverReply{Stopped: instanceAPI2, For: failoverStop.String(), AnsweredBy: u.instanceOf(ctx)})
}

// pausableListener is a listener that can stop listening for a while and then listen on the
// same address again, under one fasthttp Serve loop that never sees the gap: while paused,
// Accept waits, and the kernel refuses connections (nothing listens on the port).
type pausableListener struct {
	addr net.Addr

	mu      sync.Mutex
	current net.Listener  // nil while paused
	resumed chan struct{} // closed when listening again
	closed  bool
	done    chan struct{} // closed by Close, created lazily
}

// closedChan returns a closed channel: "not paused".
func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Accept returns the next connection, waiting out a pause.
func (l *pausableListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, net.ErrClosed
		}
		cur, resumed, done := l.current, l.resumed, l.doneChan()
		l.mu.Unlock()
		if cur == nil {
			select {
			case <-resumed:
			case <-done:
			}
			continue
		}
		c, err := cur.Accept()
		if err == nil {
			return c, nil
		}
		l.mu.Lock()
		paused := !l.closed && l.current != cur
		l.mu.Unlock()
		if !paused {
			return nil, err
		}
	}
}

// doneChan returns the channel Close closes; l.mu must be held.
func (l *pausableListener) doneChan() chan struct{} {
	if l.done == nil {
		l.done = make(chan struct{})
	}
	return l.done
}

// errAlreadyStopped answers a second stop during a pause.
var errAlreadyStopped = errors.New("api-2 is already stopped; it listens again within 30s")

// pause stops listening now and listens again after d, unless stop closes first. The
// goroutine that resumes runs under wg.
func (l *pausableListener) pause(d time.Duration, stop <-chan struct{}, wg *sync.WaitGroup) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return net.ErrClosed
	}
	if l.current == nil {
		return errAlreadyStopped
	}
	_ = l.current.Close()
	l.current = nil
	l.resumed = make(chan struct{})
	done := l.doneChan()
	wg.Go(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-stop:
			return
		case <-done:
			return
		}
		l.resume()
	})
	return nil
}

// resume listens on the address again; a port taken meanwhile is retried for a few seconds.
func (l *pausableListener) resume() {
	var nl net.Listener
	var err error
	for range 50 {
		if nl, err = net.Listen("tcp", l.addr.String()); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || l.closed {
		if nl != nil {
			_ = nl.Close()
		}
		return
	}
	l.current = nl
	close(l.resumed)
}

// Close stops listening for good and ends a waiting Accept.
func (l *pausableListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.doneChan())
	if l.current != nil {
		return l.current.Close()
	}
	return nil
}

// Addr is the address the listener serves, paused or not.
func (l *pausableListener) Addr() net.Addr { return l.addr }

var _ net.Listener = (*pausableListener)(nil)
