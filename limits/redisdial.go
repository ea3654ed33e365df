package limits

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"
)

// The connections of server.redis are made in the background, never while a decision waits
// (SPEC 17: no request waits longer than timeout). rueidis dials lazily, in the goroutine of the
// first command that finds a connection missing, and makes the commands that arrive meanwhile
// wait for that dial; a dial, a TLS handshake and HELLO cost several round trips, more than a
// decision's timeout, and a Redis that accepts but does not answer would hold every caller for
// the dial's own bound. So the client's dial function (rueidis's DialCtxFn) never dials: it hands
// over a connection made beforehand by redisDialer, one kept ready per address, and when there
// is none it fails at once (ErrRedisReconnecting: the decision follows on_error) and has one
// made. What rueidis still does in the caller's goroutine is HELLO on that connection, one round
// trip, bounded by the caller's deadline, or by Dialer.Timeout (set to the decision timeout) when
// rueidis reconnects on its own (a cluster's topology refresh): a caller that waits for someone
// else's connection waits at most a timeout that began before its own.

// redisDialTimeout bounds one background dial and its TLS handshake. No decision waits for it.
const redisDialTimeout = time.Second

// redisRedialPause is the pause after a failed background dial before the next: a Redis that
// comes back is connected within it, so the breaker's next probe (SPEC 17: within 1 s) finds a
// connection ready.
const redisRedialPause = 100 * time.Millisecond

// ErrRedisReconnecting is the error of a call that found no connection to Redis: one is being
// made in the background, and the call does not wait for it.
var ErrRedisReconnecting = errors.New("limits: redis connection being made, not waited for")

// redisDialer keeps one connection ready per address of the client and hands it to rueidis.
type redisDialer struct {
	tls *tls.Config
	// live reports whether the client is in use; before, dials are made in place (the first
	// connection, made by NewRedis's connector, which no decision waits for).
	live func() bool

	ctx    context.Context // cancelled by close: the background dials stop
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	addrs  map[string]*readyConn
	wg     sync.WaitGroup
}

// readyConn is the connection kept ready for one address.
type readyConn struct {
	conn    chan net.Conn // at most one, dialed and (with TLS) handshaken
	dialing atomic.Bool   // a background dial for this address is running
}

func newRedisDialer(tlsConf *tls.Config, live func() bool) *redisDialer {
	ctx, cancel := context.WithCancel(context.Background())
	return &redisDialer{tls: tlsConf, live: live, ctx: ctx, cancel: cancel, addrs: make(map[string]*readyConn)}
}

// readyOf returns the ready slot of addr, made on first use.
func (d *redisDialer) readyOf(addr string) *readyConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	rc := d.addrs[addr]
	if rc == nil {
		rc = &readyConn{conn: make(chan net.Conn, 1)}
		d.addrs[addr] = rc
	}
	return rc
}

// dial is the client's DialCtxFn: the ready connection of addr when there is one that Redis has
// not closed meanwhile, else ErrRedisReconnecting at once, a background dial started either way.
func (d *redisDialer) dial(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
	rc := d.readyOf(addr)
	for {
		select {
		case c := <-rc.conn:
			d.refill(addr, rc)
			if peerClosed(c) {
				c.Close()
				continue
			}
			return c, nil
		default:
		}
		break
	}
	if !d.live() {
		dctx, cancel := context.WithTimeout(ctx, redisDialTimeout)
		defer cancel()
		c, err := d.connect(dctx, addr)
		if err == nil {
			d.refill(addr, rc) // the spare of the first reconnection
		}
		return c, err
	}
	d.refill(addr, rc)
	return nil, ErrRedisReconnecting
}

// refill starts the background dial of addr unless one is running or the dialer is closed.
func (d *redisDialer) refill(addr string, rc *readyConn) {
	if !rc.dialing.CompareAndSwap(false, true) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		rc.dialing.Store(false)
		return
	}
	d.wg.Add(1)
	go d.dialLoop(addr, rc)
}

// dialLoop dials addr until a connection is made (kept ready) or the dialer is closed.
func (d *redisDialer) dialLoop(addr string, rc *readyConn) {
	defer d.wg.Done()
	defer rc.dialing.Store(false)
	for {
		ctx, cancel := context.WithTimeout(d.ctx, redisDialTimeout)
		c, err := d.connect(ctx, addr)
		cancel()
		if err == nil {
			select {
			case rc.conn <- c:
			default:
				c.Close()
			}
			return
		}
		t := time.NewTimer(redisRedialPause)
		select {
		case <-d.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// connect dials addr, with the TLS handshake when the client speaks TLS.
func (d *redisDialer) connect(ctx context.Context, addr string) (net.Conn, error) {
	nd := &net.Dialer{KeepAlive: rueidis.DefaultTCPKeepAlive}
	if d.tls == nil {
		return nd.DialContext(ctx, "tcp", addr)
	}
	td := tls.Dialer{NetDialer: nd, Config: d.tls}
	return td.DialContext(ctx, "tcp", addr)
}

// close stops the background dials and closes the connections kept ready.
func (d *redisDialer) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, rc := range d.addrs {
		select {
		case c := <-rc.conn:
			c.Close()
		default:
		}
	}
}

// peerClosed reports whether Redis closed c while it was kept ready (a restart, an idle
// timeout): a peek at the socket that reads nothing and does not wait. A connection whose
// socket cannot be looked at is taken as open.
func peerClosed(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (rerr == nil && n == 0) || (rerr != nil && rerr != syscall.EAGAIN && rerr != syscall.EINTR)
		return true
	})
	return closed || err != nil
}
