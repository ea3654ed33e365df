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
	// last is the end of the last operation (see Last).
	last time.Time
}

// Reset starts a new window with the given limits, e.g. at the start of a request body. The
// next Before arms a deadline.
func (w *Window) Reset(timeout time.Duration, minProgress int64) {
	*w = Window{Timeout: timeout, MinProgress: minProgress}
}

// Carry starts a new window with the given limits on the same socket, e.g. for the next
// request of a keep-alive connection: the counts start over, but the deadline armed on the
// socket is kept, so that the next Before re-arms only when that deadline is not within the
// new window (less than half of it left, or further out than Timeout plus Tolerance when the
// window shrank). Back-to-back requests then cost no deadline update at all. Rearms keeps
// counting.
func (w *Window) Carry(timeout time.Duration, minProgress int64) {
	*w = Window{Timeout: timeout, MinProgress: minProgress, deadline: w.deadline, last: w.last, Rearms: w.Rearms}
}

// Tolerance is how far a deadline may sit from the one wanted before it is worth moving, for
// a window or timeout of d: 1/16 of it, at most 250 ms (nginx leaves a timer alone when it
// would move by less than 300 ms). Re-arming a socket deadline takes the runtime's timer lock
// and a clock read; a deadline a few milliseconds off changes nothing anybody can tell.
func Tolerance(d time.Duration) time.Duration {
	return min(d/16, 250*time.Millisecond)
}

// Before prepares an operation starting at now. When less than half of the window remains,
// or the deadline armed is beyond the window (a carried one, see Carry), it returns the new
// deadline and true: the caller sets it on the socket.
func (w *Window) Before(now time.Time) (time.Time, bool) {
	if w.Timeout <= 0 {
		return time.Time{}, false
	}
	if left := w.deadline.Sub(now); left >= w.Timeout/2 && left <= w.Timeout+Tolerance(w.Timeout) {
		return time.Time{}, false
	}
	w.deadline = now.Add(w.Timeout)
	w.Rearms++
	return w.deadline, true
}

// Armed records a deadline set on the socket by someone else than Before (a header
// deadline, an idle deadline, fasthttp's own), so that the window knows what the socket has.
func (w *Window) Armed(deadline time.Time) { w.deadline = deadline }

// Sliding reports whether the window manages deadlines: a zero Timeout disables it.
func (w *Window) Sliding() bool { return w.Timeout > 0 }

// Near reports whether the deadline armed on the socket is within tol of d, so that arming d
// can be skipped. No deadline is never near.
func (w *Window) Near(d time.Time, tol time.Duration) bool {
	if w.deadline.IsZero() || d.IsZero() {
		return false
	}
	diff := w.deadline.Sub(d)
	return diff <= tol && diff >= -tol
}

// Last is when the last operation through the window ended (After or Stalled), zero before
// the first: a timestamp the caller can reuse instead of reading the clock again.
func (w *Window) Last() time.Time { return w.last }

// After accounts an operation that moved n bytes and waited from start to end on the socket,
// and turns its error into the window's verdict: ErrStalled for a passed deadline,
// ErrSlowClient for a window with too little progress.
func (w *Window) After(start, end time.Time, n int, err error) error {
	w.last = end
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
	w.last = end
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
