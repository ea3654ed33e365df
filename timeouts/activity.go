// Package timeouts decides how long: the sliding activity window that keeps a progressing
// transfer alive and cuts a dripping or stalled peer (SPEC 5), with deadline system calls
// amortised. It imports only the standard library.
package timeouts

import (
	"errors"
	"os"
	"time"
)

var (
	// ErrSlowClient reports a peer that moved fewer than the minimum bytes in a window of time
	// spent waiting on its socket (anti-drip, slow-read defence).
	ErrSlowClient = errors.New("timeouts: peer moved too few bytes in a window")
	// ErrStalled reports a peer that paused longer than the window: the socket deadline passed.
	// It matches os.ErrDeadlineExceeded too.
	ErrStalled error = &stalledError{}
)

type stalledError struct{}

func (*stalledError) Error() string        { return "timeouts: peer paused longer than the window" }
func (*stalledError) Timeout() bool        { return true }
func (*stalledError) Is(target error) bool { return target == os.ErrDeadlineExceeded }

// Window is the sliding activity window of one direction of one connection (SPEC 5):
//
//   - Before each read or write, the socket deadline is pushed to now + Timeout, but only when
//     less than half of the window remains (the re-arm is counted in Rearms): the system call is
//     amortised, a pause longer than Timeout is always cut and one shorter than Timeout/2
//     never is.
//   - Only time spent inside the read or write, waiting on this socket, counts towards the
//     window; each time it adds up to Timeout, the bytes moved in it must be at least
//     MinProgress, or the peer is cut with ErrSlowClient. A trickle of one byte per 0.9 window
//     therefore dies within two windows, while a peer blocked by a slow upstream is never
//     blamed for the upstream's pace.
//
// A Window is owned by one connection's goroutine; it is not safe for concurrent use.
type Window struct {
	// Timeout is the window; zero disables the window (no deadline is managed).
	Timeout time.Duration
	// MinProgress is the minimum number of bytes per window; zero disables the drip check.
	MinProgress int64

	deadline time.Time
	waited   time.Duration
	moved    int64
	// The send-queue mark of a write window (see Stalled): the peer's unacknowledged bytes
	// when the mark was taken, and the bytes written since.
	marked    bool
	mark      int64
	sinceMark int64
	// Rearms counts deadline system calls, for tests and metrics.
	Rearms int64
	// Ops counts reads or writes that went through the window.
	Ops int64
}

// Reset starts a new window with the given limits, e.g. at the start of a request body.
func (w *Window) Reset(timeout time.Duration, minProgress int64) {
	*w = Window{Timeout: timeout, MinProgress: minProgress}
}

// Before prepares an operation starting at now. When less than half of the window remains it
// returns the new deadline and true: the caller sets it on the socket.
func (w *Window) Before(now time.Time) (time.Time, bool) {
	if w.Timeout <= 0 || w.deadline.Sub(now) >= w.Timeout/2 {
		return time.Time{}, false
	}
	w.deadline = now.Add(w.Timeout)
	w.Rearms++
	return w.deadline, true
}

// After accounts an operation that moved n bytes and waited from start to end on the socket,
// and turns its error into the window's verdict: ErrStalled for a passed deadline,
// ErrSlowClient for a window with too little progress.
func (w *Window) After(start, end time.Time, n int, err error) error {
	if w.Timeout <= 0 {
		return err
	}
	w.Ops++
	w.waited += end.Sub(start)
	w.moved += int64(n)
	w.sinceMark += int64(n)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return ErrStalled
		}
		return err
	}
	if w.waited >= w.Timeout {
		if w.moved < w.MinProgress {
			return ErrSlowClient
		}
		w.waited, w.moved = 0, 0
	}
	return nil
}

// Stalled decides for a write whose socket deadline passed after it had written n bytes, from
// queue, the bytes the peer has not acknowledged yet (the kernel's send queue, SIOCOUTQ); -1
// when unknown. A blocked write is a poor measure of a reader: once the socket's send buffer is
// full, the kernel wakes the writer only after a large share of it drained, which at a modest
// but steady rate takes longer than the window. What the peer acknowledged is the measure:
//
//   - the first stall takes a mark of the queue and grants one more window (nil: write on);
//   - a later stall compares: the peer acknowledged at least MinProgress bytes (at least one)
//     since the mark, and the window starts over from a new mark; or it did not, and the peer
//     is cut with ErrSlowClient (some bytes) or ErrStalled (none).
//
// A peer that stops reading is therefore cut within two windows, like a dripping one. After a
// nil answer, the next Before re-arms the deadline.
func (w *Window) Stalled(start, end time.Time, n int, queue int64) error {
	w.Ops++
	w.sinceMark += int64(n)
	if queue < 0 {
		return ErrStalled
	}
	if !w.marked {
		w.marked, w.mark, w.sinceMark = true, queue, 0
		w.deadline = time.Time{}
		return nil
	}
	acked := w.mark + w.sinceMark - queue
	if acked < max(w.MinProgress, 1) {
		if acked > 0 {
			return ErrSlowClient
		}
		return ErrStalled
	}
	w.mark, w.sinceMark = queue, 0
	w.deadline = time.Time{}
	w.waited, w.moved = 0, 0
	return nil
}
