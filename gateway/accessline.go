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
// the fields of accessFields for an info entry with the message AccessLogMessage.
func appendAccessLine(b []byte, t time.Time, x *exchange) []byte {
	b = append(b, `{"level":"info","time":"`...)
	b = t.AppendFormat(b, time.RFC3339Nano)
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
	x.ipText = x.clientIPOf().AppendTo(x.ipText[:0])
	b = appendJSONString(append(b, `","client_ip":"`...), x.ipText)
	return append(b, "\"}\n"...)
}

// appendSeconds appends d in seconds as zap's SecondsDurationEncoder does.
func appendSeconds(b []byte, d time.Duration) []byte {
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
	const hex = "0123456789abcdef"
	last := 0
	for i := 0; i < len(s); {
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
