package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"toron/conf"
	"toron/gateway"
	"toron/internal/testnet"
)

// newBufferedLogger is main's logger with access lines on, writing into a testnet.Buffer
// (each Write is one write(2) on stderr); closeLog runs when the test ends.
func newBufferedLogger(t *testing.T) (*zap.Logger, *testnet.Buffer, func()) {
	t.Helper()
	w := &testnet.Buffer{}
	log, _, closeLog, err := newLogger(conf.Log{Level: "info", Format: "json", Access: true}, w)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeLog)
	return log, w, closeLog
}

// stats returns the writes, the lines and the text that reached w.
func stats(w *testnet.Buffer) (writes, lines int, text string) {
	text = w.String()
	return w.Writes(), strings.Count(text, "\n"), text
}

// TestLogSinkBatchesAccessLines: N access lines cost a handful of writes, not N; all N are out
// after closeLog; another kind of line is written at once.
func TestLogSinkBatchesAccessLines(t *testing.T) {
	log, w, closeLog := newBufferedLogger(t)
	const n = 5000
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range n / 4 {
				log.Info(gateway.AccessLogMessage, zap.Int("worker", g), zap.Int("i", i), zap.String("path", "/api/users"))
			}
		})
	}
	wg.Wait()
	writes, lines, _ := stats(w)
	// About 100 bytes a line: n lines fill the 256 KiB buffer at most twice (plus a timer
	// flush or two on a slow machine).
	if writes > 10 {
		t.Errorf("%d access lines cost %d writes, want a few", n, writes)
	}
	t.Logf("%d access lines: %d writes, %d lines out before close", n, writes, lines)

	closeLog()
	writes, lines, _ = stats(w)
	if lines != n {
		t.Errorf("%d lines after closeLog, want %d", lines, n)
	}
	t.Logf("after close: %d writes for %d lines", writes, lines)
}

// TestLogSinkWritesOtherLinesAtOnce: a line that is not an access line is written at once,
// with the access lines buffered before it.
func TestLogSinkWritesOtherLinesAtOnce(t *testing.T) {
	log, w, _ := newBufferedLogger(t)
	log.Info(gateway.AccessLogMessage, zap.String("path", "/a"))
	log.Warn("configuration reloaded")
	writes, lines, text := stats(w)
	if lines != 2 || writes != 1 || !strings.Contains(text, "configuration reloaded") {
		t.Errorf("after a warning: %d writes, %d lines %q; want both lines in one write", writes, lines, text)
	}
}

// TestLogSinkFlushesWithinInterval: a lone access line is written by the timer, within about
// a second, with nothing else logged.
func TestLogSinkFlushesWithinInterval(t *testing.T) {
	log, w, _ := newBufferedLogger(t)
	log.Info(gateway.AccessLogMessage, zap.String("path", "/a"))
	if _, lines, _ := stats(w); lines != 0 {
		t.Fatalf("the access line was written at once; it should wait for the interval")
	}
	start := time.Now()
	for {
		if _, lines, _ := stats(w); lines == 1 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the access line was not written within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := time.Since(start); d > gateway.LogFlushInterval+time.Second {
		t.Errorf("the access line took %v, want about %v", d, gateway.LogFlushInterval)
	}
}

// TestAccessLogFlushedOnBinary: on the real binary, an access line reaches stderr within about
// a second with no further request, and every line of a burst is there when the process exits
// after SIGTERM (no drain delay, so the exit, not the timer, writes them).
func TestAccessLogFlushedOnBinary(t *testing.T) {
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
	cmd, stderr, base := startGateway(t, "  drain_delay: 0s\n", "  access: true\n", "routes:\n"+upstreamRoute("/", upAddr))
	accessLines := func() int { return strings.Count(stderr.String(), `"msg":"request"`) }

	get := func(path string) { get(t, nil, base+path) }
	get("/first")
	start := time.Now()
	for accessLines() < 1 {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no access line within 5s; stderr:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The sink writes every second; 3 s leaves room for a loaded machine.
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the access line took %v to appear, want about 1 s", d)
	}

	const burst = 50
	for i := range burst {
		get(fmt.Sprintf("/burst/%d", i))
	}
	stopBinary(t, cmd, stderr)
	if got := accessLines(); got != 1+burst {
		t.Errorf("%d access lines after exit, want %d; stderr:\n%s", got, 1+burst, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"msg":"stopped"`) {
		t.Errorf("no stopped line; stderr:\n%s", stderr.String())
	}
}
