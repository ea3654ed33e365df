// This file owns Watch, the client watch of elevated routes: a client that leaves while its
// upstream works aborts the upstream connection (SPEC 5).
package upstream

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"toron/socket"
)

// watchInterval is how often a watched client's socket is checked while its request waits for
// the upstream: SPEC 5 wants a client that left noticed within 1 s.
const watchInterval = 200 * time.Millisecond

// Watch notices, on elevated routes, a client that closes its connection while Toron
// waits for the upstream (a 60 s report whose user gave up), so that the upstream request is
// aborted and the route's slots are freed at once instead of after response_header_timeout.
//
// fasthttp has no per-request cancellation (RequestCtx.Done closes only at shutdown, SPEC 12),
// so the watch is ours: a goroutine polls the client socket every watchInterval without
// consuming bytes, and on a FIN or a reset, behind unread bytes or not, interrupts the upstream
// connection of the request.
// The request's upstream connection is attached to the watch when it is lent (Pool.Exchange,
// through Outbound.Watch): that is how the watch reaches it. A goroutine, a ticker and a small
// allocation per request is why only elevated routes pay for the watch: the small-request path
// has none.
type Watch struct {
	up   atomic.Pointer[Conn]
	gone atomic.Bool
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// WatchClient starts watching the client socket c while its request goes upstream. Halt must
// be called once the response headers arrived or the exchange failed.
func WatchClient(c net.Conn) *Watch {
	w := &Watch{stop: make(chan struct{})}
	w.wg.Add(1)
	go w.run(c)
	return w
}

// Gone reports that the client left (and the attached connection was aborted).
func (w *Watch) Gone() bool { return w.gone.Load() }

// Attach names the upstream connection the request is sent on: the one aborted when the
// client leaves.
func (w *Watch) Attach(c *Conn) {
	w.up.Store(c)
	// gone is stored before the connection is loaded (run), and the connection is stored here
	// before gone is loaded: a connection attached meanwhile is aborted by one side or the other.
	if w.gone.Load() {
		c.Abort()
	}
}

func (w *Watch) run(c net.Conn) {
	defer w.wg.Done()
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	// Left, not Peek: a client that sent a stray CRLF, a pipelined request or a TLS
	// close_notify before its FIN has bytes waiting, and is gone all the same (SPEC 16).
	p := socket.NewPeeker(c)
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			if p.Left() {
				w.gone.Store(true)
				if uc := w.up.Load(); uc != nil {
					uc.Abort()
				}
				return
			}
		}
	}
}

// Halt stops the watch and waits for its goroutine. It may be called more than once.
func (w *Watch) Halt() {
	w.once.Do(func() {
		close(w.stop)
		w.wg.Wait()
	})
}
