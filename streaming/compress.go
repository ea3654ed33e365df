package streaming

import (
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	brotli "github.com/molecule-man/go-brrr"
)

// Compressing writers (SPEC 20). A response is compressed as it streams: each read of the
// upstream body is one unit, compressed and written to the client at once when the read came
// back short (the upstream paused, or its body ended), so a long-poll or an event stream
// arrives promptly and never waits for a buffer to fill.
//
// Memory is what decides the encoder of each coding (SPEC 20: at most 384 KiB of RSS per
// compressing stream on average, its connection included). Heap held per encoder between two
// writes, measured with klauspost/compress v1.20.3 and go-brrr v1.3.1 (docs/traffic-rules.md):
// zstd (low-memory, 64 KiB window, fastest) 576 KiB, gzip level 1 799 KiB, brotli quality 1 with
// a 64 KiB window 207 KiB, klauspost's stateless deflate 1 KiB. So:
//   - zstd: every unit is one complete zstd frame (RFC 8878 3: a stream is one or more frames),
//     made by a pooled encoder held only while it compresses that unit: about one encoder per
//     core for the process, none per stream. A unit of at most 32 KiB under a 64 KiB window
//     loses little by not seeing the unit before.
//   - gzip: one gzip member compressed by klauspost's stateless deflate: each unit becomes
//     complete, byte-aligned deflate blocks, so a stream holds a few hundred bytes.
//   - br: brotli keeps its window across units (the format has no concatenation), one pooled
//     go-brrr writer per stream, flushed at every pause.

// Encoding is a content coding Toron can produce (RFC 9110 8.4.1).
type Encoding uint8

const (
	// Identity is no compression.
	Identity Encoding = iota
	// Zstd is Zstandard (RFC 8878), token "zstd".
	Zstd
	// Brotli is Brotli (RFC 7932), token "br".
	Brotli
	// Gzip is gzip (RFC 1952), token "gzip".
	Gzip
)

// String returns the coding's token as it appears in Content-Encoding.
func (e Encoding) String() string {
	switch e {
	case Zstd:
		return "zstd"
	case Brotli:
		return "br"
	case Gzip:
		return "gzip"
	}
	return "identity"
}

// ParseEncoding returns the Encoding of a Content-Encoding token (zstd, br, gzip,
// case-insensitive); false for any other token, identity included.
func ParseEncoding(s string) (Encoding, bool) {
	for _, e := range [...]Encoding{Zstd, Brotli, Gzip} {
		if equalFoldASCII([]byte(s), e.String()) {
			return e, true
		}
	}
	return Identity, false
}

const (
	// compressUnitBytes is the most upstream bytes compressed as one unit: a zstd frame holds
	// at most this, and the output of one unit (at most a little more than its input) fits the
	// output buffer without growing it.
	compressUnitBytes = 32 << 10
	// compressOutBytes is the output buffer: one unit's worst case (incompressible input) plus
	// the framing of each coding.
	compressOutBytes = compressUnitBytes + 4<<10
	// zstdWindowBytes is the zstd window: SPEC 20's small window, which bounds what a client's
	// decoder must hold too (RFC 9659 allows up to 8 MiB).
	zstdWindowBytes = 64 << 10
	// brotliLGWin is brotli's window, 2^16 = 64 KiB (quality 1: the fastest level that still
	// finds repeated keys in JSON).
	brotliLGWin   = 16
	brotliQuality = 1
)

var (
	zstdPool = sync.Pool{New: newZstd}

	inPool     = sync.Pool{New: func() any { b := make([]byte, compressUnitBytes); return &b }}
	outPool    = sync.Pool{New: func() any { b := make([]byte, 0, compressOutBytes); return &b }}
	brotliPool sync.Pool // *brotli.Writer
	gzipPool   sync.Pool // *gzip.Writer
)

// newZstd makes a zstd encoder for EncodeAll with zstdOptions.
func newZstd() any {
	enc, err := zstd.NewWriter(nil, zstdOptions()...)
	if err != nil {
		panic("BUG: streaming: zstd options refused: " + err.Error())
	}
	return enc
}

// zstdOptions are the pooled encoders' options: one inner encoder, fastest level, 64 KiB
// window. Each was measured against its alternatives on 64 KiB of JSON in 32 KiB units
// (BenchmarkZstdOptions, docs/traffic-rules.md): only no entropy coding was clearly faster
// (12%), for a third less ratio.
func zstdOptions() []zstd.EOption {
	return []zstd.EOption{
		zstd.WithEncoderConcurrency(1),
		zstd.WithWindowSize(zstdWindowBytes),
		// Not WithLowerEncoderMem: these encoders are pooled per core, not held per stream,
		// so it would save little memory; it was no faster.
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		// TCP and TLS already check the bytes; 4 bytes per frame and a hash of the input are
		// saved.
		zstd.WithEncoderCRC(false),
		// An empty body still needs one valid frame.
		zstd.WithZeroFrames(true),
	}
}

// zstdEncodeAll appends src as one zstd frame to dst. The encoder is taken from the pool for
// this unit only: sync.Pool keeps one per P, so a core reuses its own (warm) encoder, and the
// encoders in use never outnumber the goroutines compressing at this instant.
func zstdEncodeAll(src, dst []byte) []byte {
	enc := zstdPool.Get().(*zstd.Encoder)
	dst = enc.EncodeAll(src, dst)
	zstdPool.Put(enc)
	return dst
}

// collector is where the stateful encoders write: their output is gathered and sent to the
// client once per unit, as one write (one chunk on a chunked response), not in the encoders'
// small pieces.
type collector struct{ b *[]byte }

func (c collector) Write(p []byte) (int, error) {
	*c.b = append(*c.b, p...)
	return len(p), nil
}

// flusher is a destination that buffers (a bufio.Writer): it is flushed at every pause.
type flusher interface{ Flush() error }

// CopyCompressed copies src to dst compressed with e (Zstd, Brotli or Gzip) until src returns
// io.EOF, then ends the compressed stream. It returns the compressed bytes written to dst. A
// read that fills less than the unit buffer is a pause: what was read is compressed, flushed
// and written (and dst flushed when it buffers) before the next read waits. An error from src
// other than io.EOF, or from dst, is returned without ending the stream, so a client sees a
// truncated transfer, never a clean end. Buffers and encoders are pooled.
func CopyCompressed(dst io.Writer, src io.Reader, e Encoding) (int64, error) {
	inp := inPool.Get().(*[]byte)
	defer inPool.Put(inp)
	outp := outPool.Get().(*[]byte)
	defer putOut(outp)
	in := *inp
	*outp = (*outp)[:0]
	out := collector{outp}

	var br *brotli.Writer
	var gz *gzip.Writer
	switch e {
	case Brotli:
		br = getBrotli(out)
		defer putBrotli(br)
	case Gzip:
		gz = getGzip(out)
		defer putGzip(gz)
	case Zstd:
	default:
		panic("BUG: streaming: CopyCompressed without a compressing Encoding")
	}

	var written int64
	send := func(flush bool) error {
		if len(*outp) > 0 {
			n, err := dst.Write(*outp)
			written += int64(n)
			*outp = (*outp)[:0]
			if err != nil {
				return err
			}
		}
		if f, ok := dst.(flusher); ok && flush {
			return f.Flush()
		}
		return nil
	}

	filled := 0
	encoded := false
	for {
		n, rerr := src.Read(in[filled:])
		short := n < len(in)-filled
		filled += n
		if filled > 0 && (filled == len(in) || short || rerr != nil) {
			unit := in[:filled]
			filled = 0
			encoded = true
			pause := short && rerr == nil
			switch e {
			case Zstd:
				*outp = zstdEncodeAll(unit, *outp)
			case Brotli:
				_, _ = br.Write(unit) // writes into the collector: no error but the encoder's own
				if pause {
					if err := br.Flush(); err != nil {
						return written, err
					}
				}
			case Gzip:
				if _, err := gz.Write(unit); err != nil {
					return written, err
				}
			}
			// The last unit (read with io.EOF) is sent with the end of the stream below, in
			// one write: the response's last (a client connection joins it with the end of
			// the chunked framing).
			if rerr != io.EOF {
				if err := send(pause); err != nil {
					return written, err
				}
			}
		}
		if rerr == io.EOF {
			switch e {
			case Zstd:
				if !encoded {
					*outp = zstdEncodeAll(nil, *outp)
				}
			case Brotli:
				if err := br.Close(); err != nil {
					return written, err
				}
			case Gzip:
				if err := gz.Close(); err != nil {
					return written, err
				}
			}
			return written, send(true)
		}
		if rerr != nil {
			return written, rerr
		}
	}
}

// putOut returns an output buffer unless an encoder grew it far past its size.
func putOut(b *[]byte) {
	if cap(*b) <= 2*compressOutBytes {
		outPool.Put(b)
	}
}

func getBrotli(w io.Writer) *brotli.Writer {
	if v := brotliPool.Get(); v != nil {
		bw := v.(*brotli.Writer)
		bw.Reset(w)
		return bw
	}
	bw, err := brotli.NewWriterOptions(w, brotliQuality, brotli.WriterOptions{LGWin: brotliLGWin})
	if err != nil {
		panic("BUG: streaming: brotli options refused: " + err.Error())
	}
	// Reset now, so that Close keeps the encoder's tables for the next stream (go-brrr
	// releases them on the Close of a writer never reset).
	bw.Reset(w)
	return bw
}

func putBrotli(bw *brotli.Writer) {
	bw.Reset(nil)
	brotliPool.Put(bw)
}

func getGzip(w io.Writer) *gzip.Writer {
	if v := gzipPool.Get(); v != nil {
		gz := v.(*gzip.Writer)
		gz.Reset(w)
		return gz
	}
	gz, err := gzip.NewWriterLevel(w, gzip.StatelessCompression)
	if err != nil {
		panic("BUG: streaming: gzip level refused: " + err.Error())
	}
	return gz
}

func putGzip(gz *gzip.Writer) {
	gz.Reset(nil)
	gzipPool.Put(gz)
}

// equalFoldASCII reports whether b equals the lower-case ASCII token s, ignoring case.
func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
