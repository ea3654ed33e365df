package testnet

import (
	"bytes"
	"sync"
)

// Buffer collects what another goroutine writes (a child process's output through exec's
// copier, a log sink's flushes) while the test reads it: a bytes.Buffer behind a mutex that
// also counts the writes.
type Buffer struct {
	mu     sync.Mutex
	writes int
	b      bytes.Buffer
}

// Write appends p, as one more write.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Writes returns how many writes reached the buffer.
func (s *Buffer) Writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}
