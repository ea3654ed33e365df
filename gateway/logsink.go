package gateway

import (
	"io"
	"sync"
	"time"
	"unsafe"

	"go.uber.org/zap/zapcore"
)

// AccessLogMessage is the message of every access line (SPEC 8). The log sink tells access
// lines from the rest by it: access lines are buffered and written at least every second,
// every other line is written at once.
const AccessLogMessage = "request"

// The log sink's bounds (SPEC 8: the access log must not cost a system call per request; it
// is buffered and flushed at least every second and at exit).
const (
	LogBufferBytes   = 256 << 10
	LogFlushInterval = time.Second
)

// LogSink is the writer under the logger: lines collect in a buffer that is written to w when
// it would exceed its size, every flush interval, on Flush and on Close. A write is one
// append under a mutex; the write(2) of a full buffer happens outside that mutex, on a second
// buffer, so requests do not wait for the terminal or pipe behind stderr while a flush is in
// progress (only when the next buffer fills too).
//
// Unlike zapcore.BufferedWriteSyncer it never calls fsync: that one syncs the file every
// interval while holding the mutex every log line needs, so a slow disk under a redirected
// stderr would stall every request that logs.
type LogSink struct {
	w    io.Writer
	size int

	mu    sync.Mutex // guards buf, spare and clock
	buf   []byte
	spare []byte // nil while a flush writes it
	clock lineClock

	flushMu sync.Mutex // one flush at a time, so lines reach w in order

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewLogSink starts a sink of size bytes over w, flushed every interval; Close stops it.
func NewLogSink(w io.Writer, size int, interval time.Duration) *LogSink {
	s := &LogSink{
		w: w, size: size,
		buf: make([]byte, 0, size), spare: make([]byte, 0, size),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go s.flushEvery(interval)
	return s
}

// Write buffers p, one whole log line: zap's core writes each entry with one call.
func (s *LogSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	for len(s.buf) > 0 && len(s.buf)+len(p) > s.size {
		s.mu.Unlock()
		if err := s.Flush(); err != nil {
			return 0, err
		}
		s.mu.Lock()
	}
	// A line longer than the buffer goes out alone, with the next flush.
	s.buf = append(s.buf, p...)
	s.mu.Unlock()
	return len(p), nil
}

// accessLineRoom is the room writeAccess wants left in the buffer before it encodes a line in
// place: a typical line is 300-400 bytes. A longer line than the room left grows the buffer
// (once: the grown buffer is kept).
const accessLineRoom = 2 << 10

// writeAccess encodes the access line of x at time t straight into the buffer, under the
// sink's lock: no copy of the line, no per-connection buffer for it, and the sink's lineClock
// formats the second once for all of its lines (issue 32: the copy and the time format were a
// fifth of the line's cost). A line takes the lock for about half a microsecond.
func (s *LogSink) writeAccess(t time.Time, x *exchange) {
	s.mu.Lock()
	for len(s.buf) > 0 && len(s.buf)+accessLineRoom > s.size {
		s.mu.Unlock()
		_ = s.Flush()
		s.mu.Lock()
	}
	s.buf = appendAccessLine(s.buf, t, x, &s.clock)
	s.mu.Unlock()
}

// Flush writes what is buffered.
func (s *LogSink) Flush() error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	out := s.buf
	if len(out) == 0 {
		s.mu.Unlock()
		return nil
	}
	s.buf, s.spare = s.spare, nil
	s.mu.Unlock()
	_, err := s.w.Write(out)
	s.mu.Lock()
	s.spare = out[:0]
	s.mu.Unlock()
	return err
}

// Sync is Flush, for zapcore.WriteSyncer (log.Sync and zap's own sync after a panic-level
// entry).
func (s *LogSink) Sync() error { return s.Flush() }

// Close stops the timer and writes what is left. Lines written after Close are written by
// the next Flush only; main closes the sink after its last line.
func (s *LogSink) Close() error {
	s.once.Do(func() {
		close(s.stop)
		<-s.done
	})
	return s.Flush()
}

func (s *LogSink) flushEvery(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			_ = s.Flush()
		case <-s.stop:
			return
		}
	}
}

// Core returns a core that encodes entries with enc at level into the sink, and flushes the
// sink after every entry that is not an access line.
func (s *LogSink) Core(enc zapcore.Encoder, level zapcore.LevelEnabler) zapcore.Core {
	return &flushCore{Core: zapcore.NewCore(enc, s, level), sink: s}
}

// flushCore writes through the sink like the core it wraps, and flushes after every line that
// is not an access line: those are rare (startup, reloads, errors) and someone is waiting for
// them, while access lines wait for the interval.
type flushCore struct {
	zapcore.Core
	sink *LogSink
	// accessJSON: the core encodes JSON in JSONEncoderConfig, with no fields of its own, so
	// the gateway may append access lines to the sink itself (accessline.go).
	accessJSON bool
}

func (c *flushCore) With(fields []zapcore.Field) zapcore.Core {
	return &flushCore{Core: c.Core.With(fields), sink: c.sink}
}

func (c *flushCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *flushCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	err := c.Core.Write(e, fields)
	if e.Message != AccessLogMessage {
		if ferr := c.sink.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

// logString returns b as a string field value for the access line. The sink's core encodes an
// entry into its buffer before Write returns, and nothing else keeps the fields, so there b is
// used in place, without a copy (its buffers are the connection's, reused only by its next
// request, after the line was written). Any other core (zaptest's observer keeps fields to be
// read later; a sampler or a tee may) gets a copy.
func (g *Gateway) logString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if _, ok := g.log.Core().(*flushCore); ok {
		return unsafe.String(&b[0], len(b))
	}
	return string(b)
}
