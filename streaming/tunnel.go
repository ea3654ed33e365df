package streaming

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Tunnel copying both ways (SPEC 15): once a WebSocket handshake succeeded, the gateway hands
// both sockets to a Tunnel, which moves bytes until either side ends, the tunnel is idle in
// both directions for IdleTimeout, or Close is called.
//
// Memory: an idle tunnel must cost little (thousands of chat sockets sit idle), so each
// direction reads into a small buffer of its own and takes a pooled buffer only once bytes
// flow: after a read that filled the small buffer, until a read of at most the small buffer's
// size (light traffic again) or a quiet spell of IdleTimeout in this direction. A direction
// holds at most TunnelSmallBufferSize + TunnelBufferSize, so a tunnel stays within SPEC 6's
// 64 KiB. Measured: giving the pooled buffer back after every read that did not fill it (the
// socket was drained) cost a 1 KiB read and write per burst, and 20-40% of the echo
// throughput of a plain relay on loopback; a tunnel that fell idle right after a bulk transfer
// now keeps its pooled buffer until its read deadline comes around.
//
// Deadlines: no deadline system call per read. Each direction's read deadline is the time of
// the last byte moved in either direction plus IdleTimeout; when it passes, the direction looks
// at that time again and re-arms, or ends the tunnel as idle. Writes run under WriteTimeout,
// armed afresh for each write call (a timer update in the runtime's poller, no system call): a
// peer that takes no byte of a pending write for WriteTimeout ends the tunnel (SPEC 15, the
// slow-read defence), and so does a write that fails at once after a deadline passed: crypto/tls
// keeps a write deadline's error and returns it from every later Write, so retrying would spin.

const (
	// TunnelSmallBufferSize is the buffer each direction reads into while bytes trickle (chat
	// messages, pings) or nothing comes at all.
	TunnelSmallBufferSize = 1 << 10
	// TunnelBufferSize is the pooled buffer a direction takes while bytes flow; with the small
	// one, two directions hold at most 64 KiB.
	TunnelBufferSize = 32<<10 - TunnelSmallBufferSize
)

var tunnelPool = sync.Pool{New: func() any { b := make([]byte, TunnelBufferSize); return &b }}

// ErrTunnelIdle reports a tunnel closed because no byte moved either way for its idle timeout.
var ErrTunnelIdle = errors.New("streaming: tunnel idle timeout")

// ErrTunnelStalled reports a tunnel closed because a side took no byte of a pending write for
// the write timeout.
var ErrTunnelStalled = errors.New("streaming: tunnel peer took no byte for the write timeout")

// Counter receives the bytes a tunnel moves (a metrics counter).
type Counter interface{ Add(n int) }

// TunnelEnd is one side of a tunnel.
type TunnelEnd struct {
	// Conn is the socket: its deadlines are set, the other side's bytes are written to it, and
	// Close closes it.
	Conn net.Conn
	// Reader is what this side's bytes are read from; nil means Conn. A reader that first
	// drains bytes buffered before the tunnel began (fasthttp's hijacked connection) goes here.
	Reader io.Reader
	// Count, when not nil, is given the bytes read from this side (and written to the other).
	Count Counter
}

// Tunnel copies bytes both ways between Client and Upstream. Set the fields, then call Run once.
type Tunnel struct {
	Client, Upstream TunnelEnd
	// IdleTimeout closes the tunnel when no byte moved either way for this long; > 0.
	IdleTimeout time.Duration
	// WriteTimeout closes the tunnel when a side takes no byte of a pending write for this
	// long (the route's write_timeout); zero means IdleTimeout.
	WriteTimeout time.Duration

	last       atomic.Int64 // UnixNano of the last byte read from either side
	stopping   atomic.Bool
	toUpstream atomic.Int64
	toClient   atomic.Int64
	small      [2][TunnelSmallBufferSize]byte
}

// Run copies until one side ends (either direction), then lets the other direction finish the
// write in progress and stops it. It returns nil when a side closed cleanly, ErrTunnelIdle for
// the idle timeout, ErrTunnelStalled for a side that stopped reading, else the first error met
// (a reset, a closed socket). It closes neither connection: the owner
// does, after Run.
func (t *Tunnel) Run() error {
	if t.IdleTimeout <= 0 {
		panic("BUG: streaming: tunnel without an idle timeout")
	}
	if t.WriteTimeout <= 0 {
		t.WriteTimeout = t.IdleTimeout
	}
	t.last.Store(time.Now().UnixNano())
	down := make(chan error, 1)
	go func() {
		err := t.pipe(&t.Upstream, &t.Client, &t.toClient, t.small[1][:])
		t.halt()
		down <- err
	}()
	errUp := t.pipe(&t.Client, &t.Upstream, &t.toUpstream, t.small[0][:])
	t.halt()
	errDown := <-down
	switch {
	case errors.Is(errUp, ErrTunnelStalled) || errors.Is(errDown, ErrTunnelStalled):
		return ErrTunnelStalled
	case errors.Is(errUp, ErrTunnelIdle) || errors.Is(errDown, ErrTunnelIdle):
		return ErrTunnelIdle
	case errUp != nil:
		return errUp
	}
	return errDown
}

// Close ends a running tunnel at once, bytes in flight or not (the end of a shutdown): both
// connections are closed. It may be called from any goroutine, more than once.
func (t *Tunnel) Close() {
	t.stopping.Store(true)
	_ = t.Client.Conn.Close()
	_ = t.Upstream.Conn.Close()
}

// ToUpstream returns the bytes copied from the client to the upstream so far.
func (t *Tunnel) ToUpstream() int64 { return t.toUpstream.Load() }

// ToClient returns the bytes copied from the upstream to the client so far.
func (t *Tunnel) ToClient() int64 { return t.toClient.Load() }

// pastDeadline is a deadline already passed: it wakes a blocked read at once.
var pastDeadline = time.Unix(1, 0)

// halt stops the direction still running once the other ended: its blocked read wakes up (a
// write in progress completes first, so the bytes in flight are delivered, within the write
// timeout).
func (t *Tunnel) halt() {
	t.stopping.Store(true)
	_ = t.Client.Conn.SetReadDeadline(pastDeadline)
	_ = t.Upstream.Conn.SetReadDeadline(pastDeadline)
}

// pipe copies src to dst until src ends (nil at EOF), the tunnel stops or is idle, or a
// socket fails.
func (t *Tunnel) pipe(src, dst *TunnelEnd, moved *atomic.Int64, small []byte) error {
	r := src.Reader
	if r == nil {
		r = src.Conn
	}
	var big *[]byte
	defer func() {
		if big != nil {
			tunnelPool.Put(big)
		}
	}()
	if err := t.armRead(src.Conn, time.Now()); err != nil {
		return err
	}
	if t.stopping.Load() {
		return nil
	}
	for {
		buf := small
		if big != nil {
			buf = *big
		}
		n, err := r.Read(buf)
		if n > 0 {
			now := time.Now()
			t.last.Store(now.UnixNano())
			if werr := t.write(dst.Conn, buf[:n], now); werr != nil {
				return werr
			}
			moved.Add(int64(n))
			if src.Count != nil {
				src.Count.Add(n)
			}
			switch {
			case big == nil && n == len(small):
				big = tunnelPool.Get().(*[]byte)
			case big != nil && n <= len(small):
				tunnelPool.Put(big)
				big = nil
			}
		}
		switch {
		case err == nil:
			continue
		case t.stopping.Load():
			return nil
		case errors.Is(err, io.EOF):
			return nil
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return err
		}
		// The read deadline passed: idle, or bytes moved meanwhile (either way) and the
		// deadline moves on from the last of them. This direction was quiet for a while: its
		// pooled buffer goes back.
		if big != nil {
			tunnelPool.Put(big)
			big = nil
		}
		last := time.Unix(0, t.last.Load())
		if time.Since(last) >= t.IdleTimeout {
			return ErrTunnelIdle
		}
		if err := t.armRead(src.Conn, last); err != nil {
			return err
		}
		if t.stopping.Load() {
			// halt may have set its past deadline before ours: stop here, not at our deadline.
			return nil
		}
	}
}

func (t *Tunnel) armRead(c net.Conn, from time.Time) error {
	return c.SetReadDeadline(from.Add(t.IdleTimeout))
}

// write writes p whole, each write call under a deadline WriteTimeout after it starts; now is
// the time of the call. A call that timed out having written nothing ends the tunnel
// (ErrTunnelStalled), as does one that failed before its deadline (a TLS connection that keeps
// the error of an earlier timeout); one that wrote some bytes before its deadline passed goes on
// with the rest (the peer reads, slowly).
func (t *Tunnel) write(c net.Conn, p []byte, now time.Time) error {
	for len(p) > 0 {
		dl := now.Add(t.WriteTimeout)
		if err := c.SetWriteDeadline(dl); err != nil {
			return err
		}
		n, err := c.Write(p)
		p = p[n:]
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		now = time.Now()
		if n == 0 || now.Before(dl) {
			return ErrTunnelStalled
		}
	}
	return nil
}
