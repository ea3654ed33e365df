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
	// 1000 fast reads of 64 KiB, 1 ms apart: re-armed once every ~5 s of wall time.
	for i := 0; i < 1000; i++ {
		now = now.Add(time.Millisecond)
		w.Before(now)
		if err := w.After(now, now.Add(100*time.Microsecond), 64<<10, nil); err != nil {
			t.Fatal(err)
		}
	}
	if w.Rearms > 2 || w.Ops != 1000 {
		t.Errorf("%d re-arms for %d reads", w.Rearms, w.Ops)
	}
}

func TestWindowTrickleCutWithinTwoWindows(t *testing.T) {
	var w Window
	w.Reset(time.Second, 1024)
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
	var w Window
	w.Reset(time.Second, 1024)
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
	var w Window
	w.Reset(time.Second, 1024)
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
	var w Window
	w.Reset(time.Second, 1024)
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
