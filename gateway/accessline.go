package gateway

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The access line, encoded by Toron in zap's JSON layout.
//
// Why: the access log is on by default, so its line is on every request's path. Through zap,
// a line costs the Check, thirteen Field values, the encoder's clone and one interface call per
// field; measured in the peer comparison, the access log added 10-16 µs per request (20-30%)
// to a small GET, several times what BenchmarkAccessLine costs in a hot loop (1.5 µs): most of
// it is the encoder's code and data competing with the request path's for the caches. The
// binary's JSON logs have one fixed configuration (JSONEncoderConfig), so the line is appended
// here in the same bytes zap would write: the same keys in the same order, zap's string
// escaping, RFC 3339 times with nanoseconds, durations in seconds.
// TestAccessLineIsZapsLine compares the two byte for byte. Every other log line, and the access
// line of any other logger (console format, tests), goes through zap.

// JSONEncoderConfig is the encoder configuration of Toron's JSON logs.
func JSONEncoderConfig() zapcore.EncoderConfig {
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = "time"
	ec.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	ec.EncodeDuration = zapcore.SecondsDurationEncoder
	return ec
}

// JSONCore returns the sink's core for JSON lines in JSONEncoderConfig; the gateway encodes
// its access lines for it itself (appendAccessLine).
func (s *LogSink) JSONCore(level zapcore.LevelEnabler) zapcore.Core {
	return &flushCore{Core: zapcore.NewCore(zapcore.NewJSONEncoder(JSONEncoderConfig()), s, level), sink: s, accessJSON: true}
}

// accessJSONCore returns the logger's core when the gateway may encode access lines for it.
func accessJSONCore(log *zap.Logger) *flushCore {
	if fc, ok := log.Core().(*flushCore); ok && fc.accessJSON {
		return fc
	}
	return nil
}

// appendAccessLine appends the access line of x at time t, as zap's JSON encoder would encode
// the fields of accessFields for an info entry with the message AccessLogMessage. tc, when not
// nil, keeps the formatted second of the last line (the sink's, used under its lock).
func appendAccessLine(b []byte, t time.Time, x *exchange, tc *lineClock) []byte {
	b = append(b, `{"level":"info","time":"`...)
	b = tc.appendTime(b, t)
	b = append(b, `","msg":"`+AccessLogMessage+`"`...)
	b = appendJSONString(append(b, `,"request_id":"`...), x.reqID)
	b = appendJSONString(append(b, `","route":"`...), x.stats.name)
	b = appendJSONString(append(b, `","method":"`...), x.method)
	b = appendJSONString(append(b, `","path":"`...), x.path)
	b = strconv.AppendInt(append(b, `","status":`...), int64(x.status), 10)
	b = strconv.AppendInt(append(b, `,"bytes_in":`...), x.bytesIn, 10)
	b = strconv.AppendInt(append(b, `,"bytes_out":`...), x.bytesOut, 10)
	b = appendSeconds(append(b, `,"duration":`...), x.elapsed)
	b = appendSeconds(append(b, `,"upstream_header_wait":`...), x.headerWait)
	b = appendJSONString(append(b, `,"reject_reason":"`...), x.reason.String())
	b = appendJSONString(append(b, `","remote":"`...), x.conn.remoteString())
	b = appendJSONString(append(b, `","target":"`...), x.upAddr)
	b = appendJSONString(append(b, `","client_ip":"`...), x.ipTextOf(x.clientIPOf()))
	if x.trace.Active() {
		b = x.trace.AppendTraceID(append(b, `","trace_id":"`...)) // hex: nothing to escape
	}
	return append(b, "\"}\n"...)
}

// lineClock is the time of the last access line formatted to the second: the lines of one
// second share their date, time and zone, and only the nanoseconds differ. Formatting them
// with time.Format took a tenth of the line's cost (profile of issue 32). Its zero value is
// ready; it is not safe for concurrent use (the sink uses it under its lock).
type lineClock struct {
	sec    int64          // Unix second of prefix
	loc    *time.Location // location of prefix
	prefix [19]byte       // "2006-01-02T15:04:05"
	zone   [6]byte        // "Z" or "-07:00"
	zoneN  int            // bytes of zone used; 0 when nothing is cached
}

// appendTime appends t as t.AppendFormat(b, time.RFC3339Nano) does. A nil clock formats
// every time.
func (c *lineClock) appendTime(b []byte, t time.Time) []byte {
	if c == nil {
		return t.AppendFormat(b, time.RFC3339Nano)
	}
	if sec := t.Unix(); c.zoneN == 0 || sec != c.sec || t.Location() != c.loc {
		// A zone's offset changes on a whole second, so that one second's lines share it.
		var tmp [32]byte
		whole := t.AppendFormat(tmp[:0], time.RFC3339) // no fraction
		if y := t.Year(); y < 0 || y > 9999 || len(whole) < 20 || len(whole)-19 > len(c.zone) {
			c.zoneN = 0
			return t.AppendFormat(b, time.RFC3339Nano)
		}
		c.sec, c.loc = sec, t.Location()
		copy(c.prefix[:], whole[:19])
		c.zoneN = copy(c.zone[:], whole[19:])
	}
	b = append(b, c.prefix[:]...)
	b = appendFraction(b, uint64(t.Nanosecond()))
	return append(b, c.zone[:c.zoneN]...)
}

// appendFraction appends ns (below 1e9) as the fraction of a second that RFC 3339 with
// nanoseconds and zap's seconds print: "." and up to nine digits, trailing zeros dropped;
// nothing for 0.
func appendFraction(b []byte, ns uint64) []byte {
	if ns == 0 {
		return b
	}
	var d [10]byte
	d[0] = '.'
	for i := 9; i > 1; i -= 2 {
		q := ns % 100 * 2
		ns /= 100
		d[i-1], d[i] = twoDigits[q], twoDigits[q+1]
	}
	d[1] = byte('0' + ns)
	n := len(d)
	for d[n-1] == '0' {
		n--
	}
	return append(b, d[:n]...)
}

// twoDigits holds 00 to 99, two bytes each.
const twoDigits = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// exactSecondsBelow bounds the durations appendSeconds prints from their integer nanoseconds:
// below 10^15 ns (about 11.6 days) d/1e9 has at most 15 significant digits, and any decimal of
// at most 15 significant digits is the shortest that rounds to its nearest float64 (no two of
// them round to the same one), so it is what strconv's shortest formatting prints.
const exactSecondsBelow = 1_000_000_000_000_000

// appendSeconds appends d in seconds as zap's SecondsDurationEncoder does
// (strconv.AppendFloat(b, d.Seconds(), 'f', -1, 64)); TestAppendSecondsIsStrconvs checks it.
func appendSeconds(b []byte, d time.Duration) []byte {
	if d >= 0 && d < exactSecondsBelow {
		ns := uint64(d)
		return appendFraction(strconv.AppendUint(b, ns/1e9, 10), ns%1e9)
	}
	f := float64(d) / float64(time.Second)
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 0):
		return append(b, `"+Inf"`...)
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}

// appendJSONString appends s escaped as zap escapes JSON strings: backslash and quote escaped,
// \n \r \t, other bytes below 0x20 as \u00XX, each byte of invalid UTF-8 as \ufffd, everything
// else as it is (no HTML escaping).
func appendJSONString[S []byte | string](b []byte, s S) []byte {
	// Most values need no escape at all: one table lookup per byte, then one copy.
	i := 0
	for i < len(s) && jsonPlain[s[i]] {
		i++
	}
	if i == len(s) {
		return append(b, s...)
	}
	return appendJSONEscaped(b, s, i)
}

// jsonPlain marks the bytes zap writes as they are: printable ASCII but the quote and the
// backslash.
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendJSONEscaped is appendJSONString from byte i of s on, the bytes before it plain.
func appendJSONEscaped[S []byte | string](b []byte, s S, i int) []byte {
	const hex = "0123456789abcdef"
	last := 0
	for i < len(s) {
		c := s[i]
		if c >= utf8.RuneSelf {
			var r rune
			var size int
			switch v := any(s).(type) {
			case string:
				r, size = utf8.DecodeRuneInString(v[i:])
			case []byte:
				r, size = utf8.DecodeRune(v[i:])
			}
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			b = append(b, s[last:i]...)
			b = append(b, `\ufffd`...)
			i++
			last = i
			continue
		}
		if c >= 0x20 && c != '\\' && c != '"' {
			i++
			continue
		}
		b = append(b, s[last:i]...)
		switch c {
		case '\\', '"':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		i++
		last = i
	}
	return append(b, s[last:]...)
}
