package streaming

import (
	"bytes"
	"io"
	"testing"

	andybrotli "github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	brotli "github.com/molecule-man/go-brrr"
)

// byteCounter counts and discards.
type byteCounter struct{ n int64 }

func (c *byteCounter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// BenchmarkCompress64KiB is the throughput per core of each coding on a 64 KiB JSON body, as
// CopyCompressed runs it (units of 32 KiB), with the ratio (input/output). The br-andybalholm
// and gzip-level1 rows are the alternatives measured against the choices (docs/traffic-rules.md).
func BenchmarkCompress64KiB(b *testing.B) {
	body := jsonBody(64 << 10)
	for _, e := range allEncodings {
		b.Run(e.String(), func(b *testing.B) {
			var w byteCounter
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := CopyCompressed(&w, bytes.NewReader(body), e); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(int64(len(body))*int64(b.N))/float64(w.n), "ratio")
		})
	}
	b.Run("br-andybalholm", func(b *testing.B) {
		benchWriter(b, body, compressUnitBytes, func(w io.Writer) resetWriter {
			return andybrotli.NewWriterOptions(w, andybrotli.WriterOptions{Quality: brotliQuality, LGWin: brotliLGWin})
		})
	})
	b.Run("br-go-brrr-direct", func(b *testing.B) {
		benchWriter(b, body, compressUnitBytes, func(w io.Writer) resetWriter {
			zw, _ := brotli.NewWriterOptions(w, brotliQuality, brotli.WriterOptions{LGWin: brotliLGWin})
			return zw
		})
	})
	b.Run("gzip-level1", func(b *testing.B) {
		benchWriter(b, body, len(body), func(w io.Writer) resetWriter {
			zw, _ := gzip.NewWriterLevel(w, 1)
			return zw
		})
	})
}

// resetWriter is a compressor that a benchmark reuses, as a pool would.
type resetWriter interface {
	io.WriteCloser
	Reset(io.Writer)
}

// benchWriter runs the compressor that open makes over body, written in units of unit bytes,
// once per iteration (Reset, the writes, Close), and reports the ratio (input/output).
func benchWriter(b *testing.B, body []byte, unit int, open func(io.Writer) resetWriter) {
	var w byteCounter
	zw := open(&w)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		zw.Reset(&w)
		for u := body; len(u) > 0; u = u[min(len(u), unit):] {
			zw.Write(u[:min(len(u), unit)])
		}
		zw.Close()
	}
	b.ReportMetric(float64(int64(len(body))*int64(b.N))/float64(w.n), "ratio")
}

// BenchmarkCompress2KiB is the CPU of a 2 KiB JSON answer compressed against copying it as it
// is (the identity row), the per-request cost a compress route adds.
func BenchmarkCompress2KiB(b *testing.B) {
	body := jsonBody(2 << 10)
	b.Run("identity", func(b *testing.B) {
		var w byteCounter
		buf := make([]byte, BufferSize)
		b.ReportAllocs()
		for b.Loop() {
			CopyBuffer(&w, bytes.NewReader(body), buf)
		}
	})
	for _, e := range allEncodings {
		b.Run(e.String(), func(b *testing.B) {
			var w byteCounter
			b.ReportAllocs()
			for b.Loop() {
				if _, err := CopyCompressed(&w, bytes.NewReader(body), e); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(int64(len(body))*int64(b.N))/float64(w.n), "ratio")
		})
	}
}

var _ io.Writer = (*byteCounter)(nil)
