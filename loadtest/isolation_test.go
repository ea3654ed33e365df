package main

import (
	"net/http"
	"testing"
	"time"
)

func TestSlotsFreeAndRejectOnce(t *testing.T) {
	up := startUpstream(t)
	start := time.Now()
	if !slotsFree(up.URL(), 3) {
		t.Fatal("slotsFree: 3 calls to an upstream without a limit did not all get 200")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("slotsFree took %s, want about 100 ms", d)
	}
	if code, ra := rejectOnce(up.URL() + "/legacy/reports?delay=1ms"); code != http.StatusOK || ra != "" {
		t.Errorf("rejectOnce = %d, %q; want 200 without Retry-After", code, ra)
	}
	if code, _ := rejectOnce("http://127.0.0.1:1/"); code != 0 {
		t.Errorf("rejectOnce to a closed port = %d, want 0", code)
	}
}
