package timeouts

import (
	"testing"
	"time"
)

// TestWindowCarryKeepsDeadline: requests that follow each other on one socket keep its
// deadline: 1000 requests 1 ms apart re-arm about once per half window, not once each.
func TestWindowCarryKeepsDeadline(t *testing.T) {
	var w Window
	now := t0
	for i := 0; i < 1000; i++ {
		w.Carry(5*time.Second, 1024)
		if d, ok := w.Before(now); ok && !d.Equal(now.Add(5*time.Second)) {
			t.Fatalf("re-armed to %v, want now + window", d)
		}
		if err := w.After(now, now.Add(20*time.Microsecond), 200, nil); err != nil {
			t.Fatal(err)
		}
		if !w.Last().Equal(now.Add(20 * time.Microsecond)) {
			t.Fatalf("Last = %v, want the end of the operation", w.Last())
		}
		now = now.Add(time.Millisecond)
	}
	if w.Rearms < 1 || w.Rearms > 2 {
		t.Errorf("%d re-arms for 1000 requests over 1 s with a 5 s window, want 1", w.Rearms)
	}
	// Reset forgets the deadline: the next operation arms one.
	w.Reset(5*time.Second, 1024)
	if _, ok := w.Before(now); !ok {
		t.Errorf("Reset kept the deadline")
	}
}

// TestWindowCarryShorterWindowRearms: a carried deadline beyond a shorter new window (an
// elevated route's 60 s write window, then a fast route's 5 s) is pulled in at once, so a
// pause longer than the new window is still always cut; one within the tolerance is kept.
func TestWindowCarryShorterWindowRearms(t *testing.T) {
	var w Window
	w.Carry(60*time.Second, 0)
	if _, ok := w.Before(t0); !ok {
		t.Fatal("first operation must arm the deadline")
	}
	w.Carry(5*time.Second, 0)
	now := t0.Add(time.Second)
	d, ok := w.Before(now)
	if !ok || !d.Equal(now.Add(5*time.Second)) {
		t.Fatalf("carried 60 s deadline not pulled in to the 5 s window: %v %v", d, ok)
	}
	// Back to a window barely longer: the deadline is within the tolerance, kept.
	w.Carry(5*time.Second+Tolerance(5*time.Second)/2, 0)
	if _, ok := w.Before(now); ok {
		t.Errorf("a deadline within the tolerance was re-armed")
	}
}

// TestWindowArmedAndNear: a deadline set by someone else is what Near compares with; zero
// deadlines are never near.
func TestWindowArmedAndNear(t *testing.T) {
	var w Window
	d := t0.Add(5 * time.Second)
	if w.Near(d, time.Second) {
		t.Fatal("a window without a deadline is near")
	}
	w.Armed(d)
	tol := Tolerance(5 * time.Second)
	if got := Tolerance(time.Second); got != time.Second/16 {
		t.Fatalf("Tolerance(1s) = %v, want 1/16 s", got)
	}
	if got := Tolerance(time.Minute); got != 250*time.Millisecond {
		t.Fatalf("Tolerance(1m) = %v, want the 250ms cap", got)
	}
	for _, c := range []struct {
		at   time.Time
		near bool
	}{
		{d, true},
		{d.Add(tol), true},
		{d.Add(-tol), true},
		{d.Add(tol + 1), false},
		{d.Add(-tol - 1), false},
		{time.Time{}, false},
	} {
		if got := w.Near(c.at, tol); got != c.near {
			t.Errorf("Near(%v) = %v, want %v", c.at.Sub(d), got, c.near)
		}
	}
	// Before sees the deadline Armed recorded: within the window, nothing to do.
	w.Timeout = 5 * time.Second
	if _, ok := w.Before(t0.Add(time.Second)); ok {
		t.Errorf("Before re-armed a deadline that another caller had just set")
	}
}
