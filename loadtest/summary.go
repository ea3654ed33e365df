package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Summary is one row of a scenario's table: what a series of requests measured.
type Summary struct {
	// Name labels the row, such as "/api saturated".
	Name string
	// Requests is the number of results.
	Requests int
	// OK counts the 2xx and 3xx answers.
	OK int
	// Span runs from the first request's start to the last one's end.
	Span time.Duration
	// Rate is Requests per second of Span.
	Rate float64
	// P50, P90, P99 and Max are latency quantiles over every result, errors included
	// (nearest-rank on the sorted latencies: exact, not estimated).
	P50, P90, P99, Max time.Duration
	// Errors counts the failures by class: the status code ("503") for an answer outside 2xx
	// and 3xx, else a transport class ("timeout", "reset", "refused", "eof", "conn").
	Errors map[string]int
	// Bytes is the body bytes sent and received.
	Bytes uint64
}

// Summarize computes the row of one series.
func Summarize(name string, rs []vegeta.Result) Summary {
	s := Summary{Name: name, Requests: len(rs), Errors: map[string]int{}}
	if len(rs) == 0 {
		return s
	}
	lat := make([]time.Duration, len(rs))
	first, last := rs[0].Timestamp, rs[0].End()
	for i := range rs {
		r := &rs[i]
		lat[i] = r.Latency
		if r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if e := r.End(); e.After(last) {
			last = e
		}
		s.Bytes += r.BytesIn + r.BytesOut
		if class := errorClass(r); class == "" {
			s.OK++
		} else {
			s.Errors[class]++
		}
	}
	slices.Sort(lat)
	s.P50 = quantile(lat, 0.50)
	s.P90 = quantile(lat, 0.90)
	s.P99 = quantile(lat, 0.99)
	s.Max = lat[len(lat)-1]
	s.Span = last.Sub(first)
	if s.Span > 0 {
		s.Rate = float64(s.Requests) / s.Span.Seconds()
	}
	return s
}

// MBps is the body throughput in MB/s (10^6 bytes) over the row's span.
func (s Summary) MBps() float64 {
	if s.Span <= 0 {
		return 0
	}
	return float64(s.Bytes) / 1e6 / s.Span.Seconds()
}

// OKShare is the share of 2xx/3xx answers in percent.
func (s Summary) OKShare() float64 {
	if s.Requests == 0 {
		return 0
	}
	return 100 * float64(s.OK) / float64(s.Requests)
}

// ErrorsText renders Errors as "503:120 timeout:3", largest first, or "-" when there is none.
func (s Summary) ErrorsText() string {
	if len(s.Errors) == 0 {
		return "-"
	}
	keys := slices.Collect(maps.Keys(s.Errors))
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(s.Errors[b], s.Errors[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + strconv.Itoa(s.Errors[k])
	}
	return strings.Join(parts, " ")
}

// quantile is the nearest-rank quantile of sorted latencies.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// errorClass is "" for a 2xx/3xx answer, the status code for another answer, else a transport
// class of the error text.
func errorClass(r *vegeta.Result) string {
	if r.Code >= 200 && r.Code < 400 {
		return ""
	}
	if r.Code != 0 {
		return strconv.Itoa(int(r.Code))
	}
	return transportClass(r.Error)
}

// transportClass names a transport error by what an operator would look for.
func transportClass(msg string) string {
	m := strings.ToLower(msg)
	if class, _, ok := strings.Cut(m, ":"); ok && slices.Contains(explicitClasses, class) {
		return class
	}
	switch {
	case m == "":
		return "no-answer"
	case strings.Contains(m, "timeout"), strings.Contains(m, "deadline"):
		return "timeout"
	case strings.Contains(m, "reset"):
		return "reset"
	case strings.Contains(m, "refused"):
		return "refused"
	case strings.Contains(m, "eof"), strings.Contains(m, "closed"):
		return "eof"
	}
	return "conn"
}

// errorText turns a Go error into the text transportClass reads.
func errorText(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout: " + err.Error()
	case errors.Is(err, syscall.ECONNRESET):
		return "reset: " + err.Error()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof: " + err.Error()
	}
	return err.Error()
}

// WriteTable prints rows as one markdown table; withMBps adds the MB/s column.
func WriteTable(w io.Writer, title string, rows []Summary, withMBps bool) {
	fmt.Fprintf(w, "\n## %s\n\n", title)
	head := "| series | requests | req/s | ok % | p50 | p90 | p99 | max | errors by status |"
	sep := "|---|---:|---:|---:|---:|---:|---:|---:|---|"
	if withMBps {
		head += " MB/s |"
		sep += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, sep)
	for _, s := range rows {
		fmt.Fprintf(w, "| %s | %d | %.1f | %.2f | %s | %s | %s | %s | %s |",
			s.Name, s.Requests, s.Rate, s.OKShare(),
			fmtDuration(s.P50), fmtDuration(s.P90), fmtDuration(s.P99), fmtDuration(s.Max),
			s.ErrorsText())
		if withMBps {
			fmt.Fprintf(w, " %.1f |", s.MBps())
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// fmtDuration prints a latency with three significant digits in ms, or in s above 10 s.
func fmtDuration(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case d == 0:
		return "0"
	case ms >= 10000:
		return fmt.Sprintf("%.1fs", ms/1000)
	case ms >= 100:
		return fmt.Sprintf("%.0fms", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1fms", ms)
	case ms >= 1:
		return fmt.Sprintf("%.2fms", ms)
	}
	return fmt.Sprintf("%.3fms", ms)
}

// median of a few values; 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// explicitClasses are the error texts' prefixes that name their class themselves ("closed:
// ...", "not-cut: ...").
var explicitClasses = []string{"timeout", "reset", "refused", "eof", "closed", "not-cut", "short", "corrupt"}

// SummarizeRounds is the row of a series measured in several phases (rounds): every result
// counts, and the rate is over the sum of the phases' spans, not the time between them.
func SummarizeRounds(name string, rounds [][]vegeta.Result) Summary {
	var all []vegeta.Result
	var span time.Duration
	for _, rs := range rounds {
		all = append(all, rs...)
		span += Summarize("", rs).Span
	}
	s := Summarize(name, all)
	s.Span = span
	s.Rate = 0
	if span > 0 {
		s.Rate = float64(s.Requests) / span.Seconds()
	}
	return s
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// msText prints nanoseconds as milliseconds with three decimals.
func msText(ns float64) string { return strconv.FormatFloat(ns/1e6, 'f', 3, 64) }

// msList prints nanosecond values as comma-separated milliseconds.
func msList(ns []float64) string {
	parts := make([]string, len(ns))
	for i, v := range ns {
		parts[i] = msText(v)
	}
	return strings.Join(parts, ",")
}

// floatList prints values comma-separated with format f.
func floatList(xs []float64, f string) string {
	parts := make([]string, len(xs))
	for i, v := range xs {
		parts[i] = fmt.Sprintf(f, v)
	}
	return strings.Join(parts, ",")
}
