package gateway

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer records what a LogSink writes, and how many writes it made.
type lockedBuffer struct {
	mu     sync.Mutex
	writes int
	b      bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	return w.b.Write(p)
}

// TestLogSinkOrderAndBounds: lines come out whole and in order across size-triggered flushes,
// a line longer than the buffer included; nothing is written before the buffer fills or the
// sink is flushed; Close writes the rest and may be called twice.
func TestLogSinkOrderAndBounds(t *testing.T) {
	w := &lockedBuffer{}
	s := NewLogSink(w, 100, time.Hour)
	var want strings.Builder
	for i := range 50 {
		line := fmt.Sprintf("line %02d\n", i) // 8 bytes: 12 fit in the buffer
		if i == 30 {
			line = strings.Repeat("x", 250) + "\n"
		}
		want.WriteString(line)
		if _, err := s.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if i == 5 && w.writes != 0 {
			t.Fatalf("%d writes before the buffer filled", w.writes)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := w.b.String(); got != want.String() {
		t.Fatalf("sink wrote\n%q\nwant\n%q", got, want.String())
	}
	if w.writes < 4 || w.writes > 8 {
		t.Errorf("%d writes for 400 bytes through a 100-byte buffer", w.writes)
	}
}
