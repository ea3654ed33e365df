package main

import (
	"strings"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// results makes n results one per 10 ms, latencies 1..n ms, with the given codes cycling.
func results(n int, codes ...uint16) []vegeta.Result {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rs := make([]vegeta.Result, n)
	for i := range rs {
		code := codes[i%len(codes)]
		rs[i] = vegeta.Result{
			Code:      code,
			Timestamp: t0.Add(time.Duration(i) * 10 * time.Millisecond),
			Latency:   time.Duration(i+1) * time.Millisecond,
			BytesIn:   100,
		}
		if code == 0 {
			rs[i].Error = "Get \"http://127.0.0.1:1/api\": context deadline exceeded (Client.Timeout exceeded)"
		} else if code >= 400 {
			rs[i].Error = "503 Service Unavailable"
		}
	}
	return rs
}

func TestSummarizeQuantilesErrorsAndRate(t *testing.T) {
	// 100 results: 98 of them 200, one 503, one timeout.
	rs := results(100, 200)
	rs[10].Code, rs[10].Error = 503, "503 Service Unavailable"
	rs[20].Code, rs[20].Error = 0, "dial tcp 127.0.0.1:1: connect: connection refused"
	s := Summarize("/api", rs)

	if s.Requests != 100 || s.OK != 98 {
		t.Fatalf("requests %d ok %d, want 100 and 98", s.Requests, s.OK)
	}
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"p50", s.P50, 50 * time.Millisecond},
		{"p90", s.P90, 90 * time.Millisecond},
		{"p99", s.P99, 99 * time.Millisecond},
		{"max", s.Max, 100 * time.Millisecond},
	} {
		if c.got != c.want {
			t.Errorf("%s = %s, want %s", c.name, c.got, c.want)
		}
	}
	if got, want := s.ErrorsText(), "503:1 refused:1"; got != want {
		t.Errorf("errors %q, want %q", got, want)
	}
	// Starts span 990 ms, the last one ends 100 ms later: 100 requests in 1.09 s.
	if s.Span != 1090*time.Millisecond {
		t.Errorf("span %s, want 1.09s", s.Span)
	}
	if s.Rate < 91.7 || s.Rate > 91.8 {
		t.Errorf("rate %.2f, want 91.74", s.Rate)
	}
	if got := s.MBps(); got < 0.0091 || got > 0.0092 {
		t.Errorf("MB/s %.5f, want 10000 B / 1.09 s", got)
	}
}

func TestSummarizeRoundsRateIgnoresTheGaps(t *testing.T) {
	a := results(10, 200)
	b := results(10, 200)
	for i := range b {
		b[i].Timestamp = b[i].Timestamp.Add(time.Hour)
	}
	s := SummarizeRounds("two rounds", [][]vegeta.Result{a, b})
	if s.Requests != 20 {
		t.Fatalf("requests %d, want 20", s.Requests)
	}
	// Each round spans 90 ms of starts + 10 ms for the last latency = 100 ms: 20 in 200 ms.
	if s.Rate < 99.9 || s.Rate > 100.1 {
		t.Errorf("rate %.2f, want 100 (the hour between the rounds must not count)", s.Rate)
	}
}

func TestErrorClasses(t *testing.T) {
	for msg, want := range map[string]string{
		"Get \"x\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)": "timeout",
		"read tcp 127.0.0.1:5->127.0.0.1:6: read: connection reset by peer":                     "reset",
		"dial tcp 127.0.0.1:1: connect: connection refused":                                     "refused",
		"Get \"x\": EOF":                           "eof",
		"closed: the gateway closed its side":      "closed",
		"not-cut: still open when the phase ended": "not-cut",
		"something else":                           "conn",
	} {
		r := vegeta.Result{Error: msg}
		if got := errorClass(&r); got != want {
			t.Errorf("class of %q = %q, want %q", msg, got, want)
		}
	}
	r := vegeta.Result{Code: 408, Error: "408"}
	if got := errorClass(&r); got != "408" {
		t.Errorf("class of a 408 answer = %q, want 408", got)
	}
}

func TestWriteTableIsOneMarkdownTable(t *testing.T) {
	var b strings.Builder
	rows := []Summary{Summarize("/api idle", results(50, 200)), Summarize("flood", results(20, 503))}
	WriteTable(&b, "isolation", rows, true)
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// Title, blank, header, separator, two rows.
	if len(lines) != 6 {
		t.Fatalf("got %d lines, want 6:\n%s", len(lines), out)
	}
	if !strings.Contains(lines[2], "| p99 |") || !strings.Contains(lines[2], "MB/s") {
		t.Errorf("header %q lacks p99 or MB/s", lines[2])
	}
	if !strings.Contains(lines[5], "| flood | 20 |") || !strings.Contains(lines[5], "503:20") {
		t.Errorf("flood row %q", lines[5])
	}
	for _, l := range lines[2:] {
		if strings.Count(l, "|") != strings.Count(lines[2], "|") {
			t.Errorf("row %q has another column count than the header", l)
		}
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median of 3,1,2 = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of 4,1,3,2 = %v", m)
	}
}
