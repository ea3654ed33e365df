package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"toron/internal/testnet"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"toron/tracing"
)

// accessLineExchange returns an exchange on a real connection, with a gateway whose logger
// is the binary's JSON one.
func accessLineExchange(t testing.TB) (*Gateway, *exchange) {
	t.Helper()
	g, x := accessExchange(t, func(s *LogSink) zapcore.Core { return s.JSONCore(zap.InfoLevel) })
	if g.accessJSON == nil {
		t.Fatal("the JSON core of the binary's logger is not encoded by the gateway")
	}
	return g, x
}

// accessExchange returns an exchange on a real connection, with a gateway that logs through
// core on a sink that writes to nowhere.
func accessExchange(t testing.TB, core func(*LogSink) zapcore.Core) (*Gateway, *exchange) {
	t.Helper()
	cfg := loadConfig(t, "", upstreamRoute("/api", "127.0.0.1:1", ""))
	cfg.Log.Access = true
	sink := NewLogSink(io.Discard, LogBufferBytes, LogFlushInterval)
	t.Cleanup(func() { _ = sink.Close() })
	g, err := New(cfg, zap.New(core(sink)))
	if err != nil {
		t.Fatal(err)
	}
	_, server := testnet.Pair(t)
	cc := &clientConn{Conn: server}
	x := cc.ex()
	x.conn, x.g, x.stats = cc, g, g.none
	return g, x
}

// The line the gateway appends is the one zap's JSON encoder writes for the same fields, byte
// for byte, whatever the values: escapes, invalid UTF-8, zero and odd durations, times in and
// out of UTC, every reject reason.
func TestAccessLineIsZapsLine(t *testing.T) {
	g, x := accessLineExchange(t)
	enc := zapcore.NewJSONEncoder(JSONEncoderConfig())
	strs := []string{"", "5f2a9c1e0b7d-1a2b", `q"uo\te`, "line\nbreak\r\ttab\x00\x01\x1f\x7f",
		"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "bad\xffutf8\xc3", "\xe2\x82", "</script>&<>", "/api/users/42?x=1"}
	durs := []time.Duration{0, 1, 999, 180 * time.Microsecond, 1500 * time.Millisecond, 3 * time.Hour, -5}
	times := []time.Time{
		time.Date(2026, 12, 1, 11, 45, 0, 0, time.UTC),
		time.Date(2026, 12, 1, 11, 45, 0, 123456789, time.UTC),
		time.Date(2026, 12, 1, 11, 45, 0, 120000000, time.FixedZone("X", 5*3600+30*60)),
		time.Now(),
	}
	ips := []netip.Addr{{}, netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::1")}
	var clock lineClock // shared by the cases, as the sink's: hits and misses both
	// Half the lines carry a trace_id (tracing on, the request unsampled: ratio 0).
	tr, err := tracing.New(tracing.Options{Endpoint: "http://127.0.0.1:9/v1/traces"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	testnet.ShutdownAtEnd(t, tr.Shutdown)
	n, traced := 0, 0
	defer x.trace.Begin(nil, nil, nil, false, time.Time{})
	for i, s := range strs {
		for j, d := range durs {
			x.reqID = append(x.reqID[:0], s...)
			x.method = append(x.method[:0], strs[(i+1)%len(strs)]...)
			x.path = append(x.path[:0], strs[(i+2)%len(strs)]...)
			x.upAddr = strs[(i+j)%len(strs)]
			x.status = []int{200, 101, 499, 503, 0}[j%5]
			x.bytesIn, x.bytesOut = int64(i*1000003), int64(-j)
			x.elapsed, x.headerWait = d, durs[(j+3)%len(durs)]
			x.reason = reason((i + j) % int(numReasons))
			x.clientIP = ips[(i+j)%len(ips)]
			tm := times[(i+j)%len(times)]
			if (i+j)%2 == 1 {
				x.trace.Begin(tr, nil, nil, true, tm)
			} else {
				x.trace.Begin(nil, nil, nil, false, tm)
			}
			want, err := enc.EncodeEntry(zapcore.Entry{Level: zapcore.InfoLevel, Time: tm, Message: AccessLogMessage}, g.accessFields(x))
			if err != nil {
				t.Fatal(err)
			}
			got := appendAccessLine(nil, tm, x, nil)
			if !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("case %d/%d:\n got %s\nwant %s", i, j, got, want.Bytes())
			}
			if got := appendAccessLine([]byte("prev\n"), tm, x, &clock); !bytes.Equal(got[5:], want.Bytes()) {
				t.Fatalf("case %d/%d, with the sink's clock:\n got %s\nwant %s", i, j, got[5:], want.Bytes())
			}
			if json.Valid(got) != json.Valid(want.Bytes()) {
				t.Fatalf("case %d/%d: validity differs", i, j)
			}
			if bytes.Contains(got, []byte(`"trace_id":"`)) {
				traced++
			}
			want.Free()
			n++
		}
	}
	if traced == 0 || traced == n {
		t.Fatalf("%d of %d lines have a trace_id, want some", traced, n)
	}
	if n < 50 {
		t.Fatalf("only %d cases", n)
	}
}

// appendSeconds prints what strconv's shortest formatting of the seconds prints, on both sides
// of exactSecondsBelow and for the awkward values (powers of ten, nines, one nanosecond).
func TestAppendSecondsIsStrconvs(t *testing.T) {
	durs := []time.Duration{0, 1, 9, 10, 99, 100, 999_999_999, time.Second, time.Second + 1, 1_234_567_891,
		exactSecondsBelow - 1, exactSecondsBelow, exactSecondsBelow + 1, 1<<53 - 1, 1 << 62, -1, -1_500_000_000, math.MaxInt64, math.MinInt64}
	for p := time.Duration(1); p < exactSecondsBelow; p *= 10 {
		durs = append(durs, p-1, p, p+1, 3*p, 7*p+1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		durs = append(durs, time.Duration(rng.Int64N(exactSecondsBelow)), time.Duration(rng.Int64N(1e10)), time.Duration(rng.Int64N(1e6)))
	}
	for _, d := range durs {
		want := strconv.AppendFloat(nil, float64(d)/float64(time.Second), 'f', -1, 64)
		if got := appendSeconds(nil, d); !bytes.Equal(got, want) {
			t.Fatalf("appendSeconds(%d ns) = %s, strconv %s", int64(d), got, want)
		}
	}
}

// The sink's clock prints every time as time.RFC3339Nano does, whatever the order of the times:
// within one second, across seconds, zones and a zone's offset change, years outside 0-9999.
func TestLineClockIsRFC3339Nano(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		ny = time.FixedZone("EST", -5*3600)
	}
	// 2026-03-08 07:00 UTC is 03:00 EDT: New York's offset changes at that second.
	dst := time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC)
	base := time.Date(2026, 12, 1, 11, 45, 0, 0, time.UTC)
	var times []time.Time
	for _, ns := range []int{0, 1, 10, 120_000_000, 123_456_789, 999_999_999, 500_000_000} {
		times = append(times, base.Add(time.Duration(ns)), base.Add(time.Second+time.Duration(ns)))
	}
	times = append(times,
		base.In(time.FixedZone("X", 5*3600+30*60)), base.Add(7).In(time.FixedZone("X", 5*3600+30*60)),
		base.Add(7).In(time.FixedZone("Y", -(3*3600+15))), base.In(time.FixedZone("Z0", 0)),
		dst.Add(-time.Nanosecond).In(ny), dst.Add(-time.Second).In(ny), dst.In(ny), dst.Add(1).In(ny),
		time.Date(10000, 1, 1, 0, 0, 0, 5, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 5, time.UTC), base.Add(3),
		time.Date(1969, 12, 31, 23, 59, 59, 999_000_000, time.UTC), time.Date(1969, 12, 31, 23, 59, 59, 1, time.UTC),
		time.Now(), time.Now().Add(1500*time.Millisecond))
	var clock lineClock
	for i, tm := range times {
		want := tm.AppendFormat(nil, time.RFC3339Nano)
		if got := clock.appendTime(nil, tm); !bytes.Equal(got, want) {
			t.Errorf("time %d: clock %s, time.Format %s", i, got, want)
		}
		if got := (*lineClock)(nil).appendTime(nil, tm); !bytes.Equal(got, want) {
			t.Errorf("time %d: nil clock %s, time.Format %s", i, got, want)
		}
	}
}

// What logAccess writes to the sink is that line: one JSON object per request.
func TestLogAccessWritesTheLine(t *testing.T) {
	var out bytes.Buffer
	cfg := loadConfig(t, "", upstreamRoute("/api", "127.0.0.1:1", ""))
	cfg.Log.Access = true
	sink := NewLogSink(&out, LogBufferBytes, LogFlushInterval)
	g, err := New(cfg, zap.New(sink.JSONCore(zap.InfoLevel)))
	if err != nil {
		t.Fatal(err)
	}
	_, x := accessLineExchange(t)
	x.g = g
	x.reqID = append(x.reqID[:0], "id-1"...)
	x.status, x.start, x.elapsed = 200, time.Now(), 2*time.Millisecond
	g.logAccess(x)
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	var line map[string]any
	if err := json.Unmarshal(out.Bytes(), &line); err != nil {
		t.Fatalf("%q: %v", out.Bytes(), err)
	}
	if line["msg"] != AccessLogMessage || line["request_id"] != "id-1" || line["status"] != float64(200) || line["duration"] != 0.002 || line["level"] != "info" {
		t.Fatalf("line %v", line)
	}
}

// BenchmarkAccessLineJSON is BenchmarkAccessLine for the binary's JSON logger: the line
// appended by the gateway (beside zap's own encoding in BenchmarkAccessLine).
func BenchmarkAccessLineJSON(b *testing.B) {
	g, x := accessLineExchange(b)
	benchmarkAccessLine(b, g, x)
}
