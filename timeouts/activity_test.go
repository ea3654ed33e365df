package timeouts

import (
	"errors"
	"os"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestWindowRearmsOnlyPastHalf(t *testing.T) {
	var w Window
	w.Reset(10*time.Second, 1024)
	now := t0
	if d, ok := w.Before(now); !ok || !d.Equal(now.Add(10*time.Second)) {
		t.Fatalf("first operation must arm the deadline: %v %v", d, ok)
	}
	armed := now.Add(10 * time.Second)
	// 1000 fast reads of 64 KiB, 20 ms apart, 20 s in all: past half the window four times, so
	// re-armed about once every 5 s, and never left with less than half the window ahead.
	rearms := w.Rearms
	for i := 0; i < 1000; i++ {
		now = now.Add(20 * time.Millisecond)
		if d, ok := w.Before(now); ok {
			if !d.Equal(now.Add(10 * time.Second)) {
				t.Fatalf("re-armed at %v to %v, want a full window ahead", now.Sub(t0), d.Sub(t0))
			}
			armed = d
		}
		if left := armed.Sub(now); left < 5*time.Second {
			t.Fatalf("at %v only %v of the deadline left: it must be re-armed once less than half remains", now.Sub(t0), left)
		}
		if err := w.After(now, now.Add(100*time.Microsecond), 64<<10, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.Rearms - rearms; n < 3 || n > 4 || w.Ops != 1000 {
		t.Errorf("%d re-arms for %d reads over 20 s of a 10 s window, want 3 or 4", n, w.Ops)
	}
}

// oneSecondWindow is a Window that wants 1024 bytes each second.
func oneSecondWindow() *Window {
	var w Window
	w.Reset(time.Second, 1024)
	return &w
}

func TestWindowTrickleCutWithinTwoWindows(t *testing.T) {
	w := oneSecondWindow()
	now := t0
	for i := 1; ; i++ {
		w.Before(now)
		end := now.Add(900 * time.Millisecond) // one byte per 0.9 window
		err := w.After(now, end, 1, nil)
		now = end
		if errors.Is(err, ErrSlowClient) {
			if elapsed := now.Sub(t0); elapsed > 2*time.Second {
				t.Errorf("cut after %v", elapsed)
			}
			return
		}
		if i > 10 {
			t.Fatal("trickle never cut")
		}
	}
}

func TestWindowSteadyProgressNeverCut(t *testing.T) {
	w := oneSecondWindow()
	now := t0
	for i := 0; i < 1000; i++ {
		w.Before(now)
		end := now.Add(100 * time.Millisecond)
		if err := w.After(now, end, 200, nil); err != nil { // 2000 bytes per window
			t.Fatalf("read %d: %v", i, err)
		}
		now = end
	}
}

func TestWindowTimeOutsideReadsDoesNotCount(t *testing.T) {
	w := oneSecondWindow()
	now := t0
	for i := 0; i < 10; i++ {
		w.Before(now)
		if err := w.After(now, now.Add(time.Millisecond), 10, nil); err != nil {
			t.Fatal(err)
		}
		now = now.Add(5 * time.Second) // blocked on a slow upstream, not on the client
	}
}

func TestWindowDeadlineIsStall(t *testing.T) {
	w := oneSecondWindow()
	err := w.After(t0, t0.Add(time.Second), 0, os.ErrDeadlineExceeded)
	if !errors.Is(err, ErrStalled) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
}

func TestWindowDisabled(t *testing.T) {
	var w Window
	if _, ok := w.Before(t0); ok {
		t.Fatal("zero window armed a deadline")
	}
	if err := w.After(t0, t0.Add(time.Hour), 0, nil); err != nil {
		t.Fatal(err)
	}
}

// TestWindowStalledWriteJudgedByAcks: a write blocked past its deadline is judged by what the
// peer acknowledged (the send queue), not by what the write call moved. A steady reader behind
// a full send buffer writes on; one that stopped reading, or reads below MinProgress, is cut
// at the second stall, within two windows.
func TestWindowStalledWriteJudgedByAcks(t *testing.T) {
	const win = time.Second
	stall := func(w *Window, now time.Time, n int, queue int64) (time.Time, error) {
		w.Before(now)
		end := now.Add(win)
		return end, w.Stalled(now, end, n, queue)
	}

	// A reader that drains 300 KB per window while the writer waits for buffer space.
	var w Window
	w.Reset(win, 1024)
	now, queue := t0, int64(4<<20)
	for i := 0; i < 10; i++ {
		var err error
		if now, err = stall(&w, now, 0, queue); err != nil {
			t.Fatalf("stall %d: a steady reader was cut: %v", i, err)
		}
		queue -= 300_000
		// The kernel woke the writer once: it refilled part of the queue.
		if i%3 == 2 {
			w.Before(now)
			if err := w.After(now, now.Add(10*time.Millisecond), 900_000, nil); err != nil {
				t.Fatalf("write after a wake-up: %v", err)
			}
			queue += 900_000
		}
	}
	if _, ok := w.Before(now); !ok {
		t.Error("after a pardoned stall the deadline must be re-armed")
	}

	// A reader that stopped: the first stall takes the mark, the second cuts.
	w.Reset(win, 1024)
	now = t0
	if _, err := stall(&w, now, 0, 4<<20); err != nil {
		t.Fatalf("first stall must take the mark, got %v", err)
	}
	if _, err := stall(&w, now.Add(win), 0, 4<<20); !errors.Is(err, ErrStalled) {
		t.Errorf("a reader that stopped: %v, want ErrStalled", err)
	}

	// A reader of 100 bytes per window, below MinProgress.
	w.Reset(win, 1024)
	stall(&w, t0, 0, 4<<20)
	if _, err := stall(&w, t0.Add(win), 0, 4<<20-100); !errors.Is(err, ErrSlowClient) {
		t.Errorf("a dripping reader: %v, want ErrSlowClient", err)
	}

	// Bytes written between the stalls count as queued, not as progress.
	w.Reset(win, 1024)
	stall(&w, t0, 0, 1<<20)
	w.After(t0, t0.Add(time.Millisecond), 64<<10, nil)
	if _, err := stall(&w, t0.Add(win), 0, 1<<20+64<<10); !errors.Is(err, ErrStalled) {
		t.Errorf("written but not acknowledged: %v, want ErrStalled", err)
	}

	// Without the kernel's answer a stall is a stall.
	w.Reset(win, 1024)
	if _, err := stall(&w, t0, 0, -1); !errors.Is(err, ErrStalled) {
		t.Errorf("unknown queue: %v, want ErrStalled", err)
	}
}
