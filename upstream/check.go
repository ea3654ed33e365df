package upstream

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"time"
)

// healthUserAgent is the User-Agent of active checks (SPEC 13), so upstream logs can tell them
// from traffic.
const healthUserAgent = "toron-health"

// checker runs the active checks of one target in its own goroutine, outside the worker pool
// and the bulkheads. It lives as long as the target stays in a route with health_check; a
// reload swaps its parameters without restarting it, so its counts in a row carry over.
type checker struct {
	st     *state
	params atomic.Pointer[checkParams]
	cancel context.CancelFunc
	done   chan struct{}
}

// checkParams are one configuration of a target's checks, precomputed.
type checkParams struct {
	interval, timeout  time.Duration
	healthy, unhealthy int
	dial               DialFunc
	tls                *tls.Config
	request            []byte
}

// newCheckParams precomputes the check request and the TLS settings of a target.
func newCheckParams(addr, serverName string, c *CheckConfig) *checkParams {
	p := &checkParams{
		interval:  c.Interval,
		timeout:   c.Timeout,
		healthy:   max(c.HealthyThreshold, 1),
		unhealthy: max(c.UnhealthyThreshold, 1),
		dial:      c.Dial,
	}
	if p.dial == nil {
		var d net.Dialer
		p.dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	if c.TLS != nil {
		p.tls = c.TLS.Clone()
		if p.tls.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			p.tls.ServerName = cmp.Or(serverName, host)
		}
	}
	// Connection: close: a check is one request, and the upstream frees its side at once.
	p.request = []byte("GET " + c.Path + " HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: " + healthUserAgent + "\r\nConnection: close\r\n\r\n")
	return p
}

// startOrUpdateChecker starts the target's checker, or gives the running one new parameters.
func (st *state) startOrUpdateChecker(c *CheckConfig) {
	p := newCheckParams(st.addr, st.serverName, c)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.checker != nil {
		st.checker.params.Store(p)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ck := &checker{st: st, cancel: cancel, done: make(chan struct{})}
	ck.params.Store(p)
	st.checker = ck
	go ck.run(ctx)
}

// stopChecker ends the target's checker, if any, and waits for it; without checks a target is
// never down.
func (st *state) stopChecker() {
	st.mu.Lock()
	ck := st.checker
	st.checker = nil
	st.mu.Unlock()
	if ck == nil {
		return
	}
	ck.cancel()
	<-ck.done
	st.down.Store(false)
}

// jitter returns a random duration in [0, d/10): SPEC 13's "up to 10% jitter", so the checks
// of many targets (and of many gateway replicas) do not arrive in step.
func jitter(d time.Duration) time.Duration {
	if n := int64(d / 10); n > 0 {
		return time.Duration(rand.Int64N(n))
	}
	return 0
}

// run checks the target every interval (plus jitter) until ctx ends. The target starts up:
// the first check comes within a tenth of an interval, and it takes unhealthy failures in a
// row to take it down, healthy passes in a row to bring it back.
func (ck *checker) run(ctx context.Context) {
	defer close(ck.done)
	timer := time.NewTimer(jitter(ck.params.Load().interval))
	defer timer.Stop()
	passes, fails := 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		p := ck.params.Load()
		ok := probe(ctx, ck.st.addr, p)
		if ctx.Err() != nil {
			return // stopped mid-check: the verdict is not the target's
		}
		st := ck.st
		if ok {
			fails = 0
			passes++
			if passes >= p.healthy && st.down.Load() {
				st.down.Store(false)
				st.event(EventUp)
			}
		} else {
			passes = 0
			fails++
			if fails >= p.unhealthy && !st.down.Load() {
				st.down.Store(true)
				st.event(EventDown)
			}
		}
		timer.Reset(p.interval + jitter(p.interval))
	}
}

// event reports a change of the target to the Set currently serving it.
func (st *state) event(k EventKind) {
	if o := st.owner.Load(); o != nil {
		o.event(Event{Kind: k, Target: st.addr})
	}
}

// probe sends one check and reports whether a 2xx or 3xx status line arrived within the
// timeout. Only the status line is read: the connection is closed after it.
func probe(ctx context.Context, addr string, p *checkParams) bool {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	conn, err := p.dial(ctx, addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// A Stop (reload, shutdown) must not wait for the timeout of a check under way.
	unblock := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer unblock()
	var c net.Conn = conn
	if p.tls != nil {
		tc := tls.Client(conn, p.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			return false
		}
		c = tc
	}
	if _, err := c.Write(p.request); err != nil {
		return false
	}
	line, err := bufio.NewReaderSize(c, 256).ReadSlice('\n')
	if err != nil {
		return false
	}
	code, ok := statusCode(line)
	return ok && code >= 200 && code < 400
}

// statusCode parses the status of "HTTP/1.x NNN reason".
func statusCode(line []byte) (int, bool) {
	if !bytes.HasPrefix(line, []byte("HTTP/1.")) || len(line) < 12 || line[8] != ' ' {
		return 0, false
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, false // strconv.Atoi would take "-20" or "+99"
		}
		code = code*10 + int(c-'0')
	}
	if len(line) > 12 && line[12] != ' ' && line[12] != '\r' && line[12] != '\n' {
		return 0, false
	}
	return code, true
}
