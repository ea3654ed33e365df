// This file owns the socket below a TLS layer and the sliding write window both ends of a
// proxied request write under: Windowed (and Listener, which hands Windowed sockets out at
// the accept), WriteInWindow, and what only the kernel can tell of a socket (Below,
// UnackedBytes).
package socket

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Window is the sliding write window of one connection (timeouts.Window implements it): the
// deadline to arm before a write, the verdict after it, and the verdict of a write whose
// deadline passed, from the bytes the peer has not acknowledged.
type Window interface {
	// Sliding reports whether the window manages deadlines at all (a zero timeout does not).
	Sliding() bool
	Before(now time.Time) (time.Time, bool)
	After(start, end time.Time, n int, err error) error
	Stalled(start, end time.Time, n int, queue int64) error
}

// ErrInterrupted ends a write whose interrupted flag was set (WriteInWindow): the owner of the
// connection aborted it on purpose, with a deadline in the past that is no stall.
var ErrInterrupted = errors.New("socket: write interrupted")

// Below returns the socket below c's wrappers (TLS, the PROXY protocol), for what only the
// kernel can tell: a peer's FIN (Peeker), the bytes it acknowledged (UnackedBytes), the
// half-close of a lingering close. Wrappers expose it as NetConn, as *tls.Conn does.
func Below(c net.Conn) net.Conn {
	for {
		inner := unwrapped(c)
		if inner == nil {
			return c
		}
		c = inner
	}
}

// unwrapped returns the connection c wraps (its NetConn), or nil when it wraps none.
func unwrapped(c net.Conn) net.Conn {
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		if inner := w.NetConn(); inner != c {
			return inner
		}
	}
	return nil
}

// Listener hands out sockets whose writes can be put under a client's sliding write window
// from below the TLS layer (Windowed over a non-blocking Conn).
type Listener struct{ net.Listener }

// Accept returns the next connection as a *Windowed.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &Windowed{Conn: NonBlocking(c)}, nil
}

// Windowed is the socket below a TLS layer, a client's or an upstream connection's. Once the
// connection attached its write window (AttachWriteWindow), every write of TLS records goes
// through WriteInWindow: a write blocked past its deadline is judged by what the peer
// acknowledged and goes on while the peer reads (SPEC 5, the slow-read defence). Above TLS that
// is impossible: after a write timeout crypto/tls's state is corrupt and the connection is
// lost, so a slow but steady reader behind a full send buffer would be cut. crypto/tls sees
// only the window's final verdict (timeouts.ErrSlowClient, ErrStalled), after which the
// connection is closed anyway.
type Windowed struct {
	net.Conn
	win Window // nil until attached: plain writes (the handshake's)
	// interrupted is WriteInWindow's: an upstream connection's abort flag, nil for a client.
	interrupted *atomic.Bool
	// written, when set, counts the bytes the socket took (CountWrites).
	written *int64
}

// Write writes p, under the attached window once there is one.
func (s *Windowed) Write(p []byte) (n int, err error) {
	if s.win == nil {
		n, err = s.Conn.Write(p)
	} else {
		n, err = WriteInWindow(s.Conn, s.win, p, s.interrupted)
	}
	if s.written != nil {
		*s.written += int64(n)
	}
	return n, err
}

// NetConn returns the socket, for Below.
func (s *Windowed) NetConn() net.Conn { return s.Conn }

// windowedBelow returns the *Windowed below c's wrappers, or nil.
func windowedBelow(c net.Conn) *Windowed {
	for c != nil {
		if ws, ok := c.(*Windowed); ok {
			return ws
		}
		c = unwrapped(c)
	}
	return nil
}

// CountWrites makes the Windowed below c, if there is one, count the bytes it writes into n:
// the only count of what reached the socket once TLS frames the writes.
func CountWrites(c net.Conn, n *int64) {
	if ws := windowedBelow(c); ws != nil {
		ws.written = n
	}
}

// AttachWriteWindow puts the writes of the Windowed below c, if there is one, under w
// (interrupted as WriteInWindow's), and reports whether it did: the caller then writes to c
// without a window of its own. Called before the connection's first write of its own (at the
// accept; after the upstream dial).
func AttachWriteWindow(c net.Conn, w Window, interrupted *atomic.Bool) bool {
	ws := windowedBelow(c)
	if ws == nil {
		return false
	}
	ws.win, ws.interrupted = w, interrupted
	return true
}

// IsTLS reports a connection that encrypts: after a write deadline passed, its state is
// corrupt (crypto/tls: "all future writes will return the same error"), so a write that timed
// out cannot be retried the way a plain socket's can.
func IsTLS(c net.Conn) bool {
	_, ok := c.(interface{ ConnectionState() tls.ConnectionState })
	return ok
}

// IsTimeout reports a deadline that passed, in err's chain.
func IsTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// WriteInWindow writes p to conn under the sliding write window w, for both ends of a
// proxied request. A write whose deadline passed is judged by what the peer acknowledged
// meanwhile (w.Stalled, from UnackedBytes) and goes on while the peer reads. The window's
// verdict is returned: ErrStalled, ErrSlowClient or the socket's error. interrupted, when not
// nil, is checked before each write and after a failed one: set, it ends the write with
// ErrInterrupted (an upstream connection's abort sets it together with a deadline in the past,
// which a stall must not be mistaken for).
func WriteInWindow(conn net.Conn, w Window, p []byte, interrupted *atomic.Bool) (int, error) {
	return WriteInWindowV(conn, w, p, nil, interrupted)
}

// WriteInWindowV is WriteInWindow for p, or, when v is not nil, for the buffers of v in one
// writev(2) each attempt (a chunk's size line and its data). v is consumed.
func WriteInWindowV(conn net.Conn, w Window, p []byte, v *net.Buffers, interrupted *atomic.Bool) (int, error) {
	written := 0
	for {
		start := time.Now()
		if d, ok := w.Before(start); ok {
			if err := conn.SetWriteDeadline(d); err != nil {
				return written, err
			}
		}
		if interrupted != nil && interrupted.Load() {
			return written, ErrInterrupted
		}
		var n int
		var err error
		if v != nil {
			var n64 int64
			n64, err = v.WriteTo(conn)
			n = int(n64)
		} else {
			n, err = conn.Write(p[written:])
		}
		written += n
		end := time.Now()
		// A write that timed out on a TLS connection cannot go on (IsTLS): the window's
		// verdict stands. (Both ends run their window below TLS instead, Windowed; this is
		// the safety net for a TLS connection that was not set up that way.)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !w.Sliding() || IsTLS(conn) {
			return written, w.After(start, end, n, err)
		}
		if interrupted != nil && interrupted.Load() {
			return written, ErrInterrupted
		}
		if werr := w.Stalled(start, end, n, UnackedBytes(conn)); werr != nil {
			return written, werr
		}
	}
}

// UnackedBytes returns the bytes written to c that the peer has not acknowledged yet
// (SIOCOUTQ), -1 if the kernel cannot tell.
func UnackedBytes(c net.Conn) int64 {
	sc, ok := Below(c).(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	var queued int32
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&queued)))
	}); err != nil || errno != 0 {
		return -1
	}
	return int64(queued)
}

var (
	_ net.Listener = Listener{}
	_ net.Conn     = (*Windowed)(nil)
)
