package streaming

import (
	"bytes"
	"io"
	"testing"
	"time"

	"toron/internal/testnet"

	andybrotli "github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	brotli "github.com/molecule-man/go-brrr"
)

// byteCounter counts and discards.
type byteCounter struct{ n int64 }

func (c *byteCounter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// BenchmarkCompress64KiB is the throughput per core of each coding on a 64 KiB JSON body, as
// CopyCompressed runs it (units of 32 KiB), with the ratio (input/output). cpu-MB/s is the
// input per second of the process's CPU time, the throughput of one core however loaded the
// machine (MB/s is per second of wall time). The br-andybalholm and gzip-level1 rows are the
// alternatives measured against the choices (docs/traffic-rules.md).
func BenchmarkCompress64KiB(b *testing.B) {
	body := jsonBody(64 << 10)
	for _, e := range allEncodings {
		b.Run(e.String(), func(b *testing.B) {
			var w byteCounter
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				if _, err := CopyCompressed(&w, bytes.NewReader(body), e); err != nil {
					b.Fatal(err)
				}
			}
			cpu.report(b, len(body))
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

// BenchmarkZstdFloor compares CopyCompressed's zstd on the 64 KiB JSON body with the bare
// encoder (klauspost's EncodeAll with zstdOptions, no reader, no pool, no copy), the floor any
// use of the encoder pays: in each iteration the three run in turn (the order rotating), each
// timed in the process's CPU time, so that all see the same machine load. cpu-MB/s is
// CopyCompressed's throughput per core, floor-2x32KiB-cpu-MB/s the bare encoder's on the same
// 32 KiB units, floor-64KiB-cpu-MB/s its speed on the whole body in one frame, and
// vs-floor CopyCompressed's over the first floor (1.00 is the encoder alone).
func BenchmarkZstdFloor(b *testing.B) {
	body := jsonBody(64 << 10)
	enc, err := zstd.NewWriter(nil, zstdOptions()...)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]byte, 0, 2*compressOutBytes)
	var w byteCounter
	runs := [3]func(){
		func() { _, _ = CopyCompressed(&w, bytes.NewReader(body), Zstd) },
		func() {
			for u := body; len(u) > 0; u = u[min(len(u), compressUnitBytes):] {
				out = enc.EncodeAll(u[:min(len(u), compressUnitBytes)], out[:0])
			}
		},
		func() { out = enc.EncodeAll(body, out[:0]) },
	}
	var cpu [3]time.Duration
	for i := 0; b.Loop(); i++ {
		for k := range runs {
			j := (k + i) % len(runs)
			t0 := testnet.ProcessCPU()
			runs[j]()
			cpu[j] += testnet.ProcessCPU() - t0
		}
	}
	if cpu[0] > 0 && cpu[1] > 0 && cpu[2] > 0 {
		mb := float64(len(body)) * float64(b.N) / 1e6
		b.ReportMetric(mb/(float64(cpu[0])/1e9), "cpu-MB/s")
		b.ReportMetric(mb/(float64(cpu[1])/1e9), "floor-2x32KiB-cpu-MB/s")
		b.ReportMetric(mb/(float64(cpu[2])/1e9), "floor-64KiB-cpu-MB/s")
		b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "vs-floor")
	}
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
	cpu := startCPU()
	for b.Loop() {
		zw.Reset(&w)
		for u := body; len(u) > 0; u = u[min(len(u), unit):] {
			zw.Write(u[:min(len(u), unit)])
		}
		zw.Close()
	}
	cpu.report(b, len(body))
	b.ReportMetric(float64(int64(len(body))*int64(b.N))/float64(w.n), "ratio")
}

// BenchmarkZstdOptions measures each zstd encoder option Toron considered, on the 64 KiB JSON
// body, with the ratio: "toron" is zstdOptions in 32 KiB units, as CopyCompressed runs them
// (without its copy of the input); each other row changes one thing. Every iteration compresses
// the body with Toron's options and then with the row's, each timed in the process's CPU time,
// so both see the same machine load: cpu-MB/s is the row's throughput per core, toron-cpu-MB/s
// Toron's in the same iterations, speed-vs-toron the row's over Toron's (1.00 is as fast; the
// toron row against itself shows the noise). The writer rows are the streaming Writer, one
// frame per body, flushed after every unit: a better ratio (each unit sees the previous one),
// but a whole encoder per stream, past SPEC 20's memory bound (docs/traffic-rules.md).
func BenchmarkZstdOptions(b *testing.B) {
	body := jsonBody(64 << 10)
	with := func(o ...zstd.EOption) []zstd.EOption { return append(zstdOptions(), o...) }
	toron := zstdRun{opts: zstdOptions(), unit: compressUnitBytes}
	for _, c := range []struct {
		name string
		run  zstdRun
	}{
		{"toron", toron},
		{"unit-64KiB", zstdRun{opts: zstdOptions(), unit: 64 << 10}},
		{"unit-16KiB", zstdRun{opts: zstdOptions(), unit: 16 << 10}},
		{"lower-mem", zstdRun{opts: with(zstd.WithLowerEncoderMem(true)), unit: compressUnitBytes}},
		{"crc", zstdRun{opts: with(zstd.WithEncoderCRC(true)), unit: compressUnitBytes}},
		{"no-single-segment", zstdRun{opts: with(zstd.WithSingleSegment(false)), unit: compressUnitBytes}},
		{"window-512KiB", zstdRun{opts: with(zstd.WithWindowSize(512 << 10)), unit: compressUnitBytes}},
		{"all-literal-entropy", zstdRun{opts: with(zstd.WithAllLitEntropyCompression(true)), unit: compressUnitBytes}},
		{"no-entropy", zstdRun{opts: with(zstd.WithNoEntropyCompression(true)), unit: compressUnitBytes}},
		{"level-default", zstdRun{opts: with(zstd.WithEncoderLevel(zstd.SpeedDefault)), unit: compressUnitBytes}},
		{"writer", zstdRun{opts: zstdOptions(), unit: compressUnitBytes, writer: true}},
		{"writer-lower-mem", zstdRun{opts: with(zstd.WithLowerEncoderMem(true)), unit: compressUnitBytes, writer: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ref, row := toron.start(b), c.run.start(b)
			var refCPU, rowCPU time.Duration
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			pair := [2]*zstdRunning{ref, row}
			for i := 0; b.Loop(); i++ {
				// The order alternates, so that neither always runs on the other's warm caches.
				first := i & 1
				t0 := testnet.ProcessCPU()
				pair[first].compress(body)
				t1 := testnet.ProcessCPU()
				pair[1-first].compress(body)
				t2 := testnet.ProcessCPU()
				if first == 0 {
					refCPU, rowCPU = refCPU+t1-t0, rowCPU+t2-t1
				} else {
					rowCPU, refCPU = rowCPU+t1-t0, refCPU+t2-t1
				}
			}
			if refCPU > 0 && rowCPU > 0 {
				mb := float64(len(body)) * float64(b.N) / 1e6
				b.ReportMetric(mb/(float64(rowCPU)/1e9), "cpu-MB/s")
				b.ReportMetric(mb/(float64(refCPU)/1e9), "toron-cpu-MB/s")
				b.ReportMetric(float64(refCPU)/float64(rowCPU), "speed-vs-toron")
			}
			b.ReportMetric(float64(int64(len(body))*int64(b.N))/float64(row.w.n), "ratio")
		})
	}
}

// zstdRun is one way of compressing a body with zstd: EncodeAll per unit, or the streaming
// Writer flushed after every unit.
type zstdRun struct {
	opts   []zstd.EOption
	unit   int
	writer bool
}

// zstdRunning is a zstdRun with its encoder, its output buffer and the bytes it produced.
type zstdRunning struct {
	zstdRun
	enc *zstd.Encoder
	out []byte
	w   byteCounter
}

func (r zstdRun) start(b *testing.B) *zstdRunning {
	enc, err := zstd.NewWriter(nil, r.opts...)
	if err != nil {
		b.Fatal(err)
	}
	return &zstdRunning{zstdRun: r, enc: enc, out: make([]byte, 0, 2*compressOutBytes)}
}

func (r *zstdRunning) compress(body []byte) {
	if r.writer {
		r.enc.Reset(&r.w)
	}
	for u := body; len(u) > 0; u = u[min(len(u), r.unit):] {
		unit := u[:min(len(u), r.unit)]
		if r.writer {
			_, _ = r.enc.Write(unit)
			_ = r.enc.Flush()
			continue
		}
		r.out = r.enc.EncodeAll(unit, r.out[:0])
		r.w.n += int64(len(r.out))
	}
	if r.writer {
		_ = r.enc.Close()
	}
}

// cpuClock is the process's CPU time at a benchmark's start.
type cpuClock time.Duration

func startCPU() cpuClock { return cpuClock(testnet.ProcessCPU()) }

// report adds cpu-MB/s: the bytes per operation per second of the process's CPU time since
// the start.
func (c cpuClock) report(b *testing.B, bytesPerOp int) {
	if spent := testnet.ProcessCPU() - time.Duration(c); spent > 0 {
		b.ReportMetric(float64(bytesPerOp)*float64(b.N)/(float64(spent)/1e9)/1e6, "cpu-MB/s")
	}
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
