package streaming

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

func decodeAll(input string, oneByte bool) (string, error) {
	var src io.Reader = strings.NewReader(input)
	if oneByte {
		src = iotest.OneByteReader(src)
	}
	var d ChunkedReader
	d.Reset(src, make([]byte, BufferSize))
	var out bytes.Buffer
	_, err := d.WriteTo(&out)
	return out.String(), err
}

func readAll(input string) (string, error) {
	var d ChunkedReader
	d.Reset(iotest.HalfReader(strings.NewReader(input)), make([]byte, 2*MaxChunkLineBytes))
	b, err := io.ReadAll(&d)
	return string(b), err
}

func TestChunkedValid(t *testing.T) {
	cases := []struct{ in, want string }{
		{"0\r\n\r\n", ""},
		{"5\r\nhello\r\n0\r\n\r\n", "hello"},
		{"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world"},
		{"A\r\n0123456789\r\n0\r\n\r\n", "0123456789"},
		{"a;name=value\r\n0123456789\r\n0\r\n\r\n", "0123456789"},
		{"5 ; ext = \"quoted \\\" value\"\r\nhello\r\n0\r\n\r\n", "hello"},
		{"5;a;b=c\r\nhello\r\n0;last\r\n\r\n", "hello"},
		{"5\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n", "hello"},
		{"0005\r\nhello\r\n0\r\n\r\n", "hello"},
	}
	for _, tc := range cases {
		for _, oneByte := range []bool{false, true} {
			got, err := decodeAll(tc.in, oneByte)
			if err != nil || got != tc.want {
				t.Errorf("WriteTo(%q, oneByte=%v) = %q, %v; want %q", tc.in, oneByte, got, err, tc.want)
			}
		}
		got, err := readAll(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Read(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestChunkedInvalid(t *testing.T) {
	cases := []struct{ name, in, wantData string }{
		{"non-hex size", "g\r\nx\r\n0\r\n\r\n", ""},
		{"sign", "+5\r\nhello\r\n0\r\n\r\n", ""},
		{"minus", "-5\r\nhello\r\n0\r\n\r\n", ""},
		{"0x prefix", "0x5\r\nhello\r\n0\r\n\r\n", ""},
		{"leading space", " 5\r\nhello\r\n0\r\n\r\n", ""},
		{"overflow", "fffffffffffffffff\r\nx\r\n0\r\n\r\n", ""},
		{"bare LF size", "5\nhello\r\n0\r\n\r\n", ""},
		{"bare CR size", "5\rX\r\nhello\r\n0\r\n\r\n", ""},
		{"missing CRLF after data", "5\r\nhelloX\r\n0\r\n\r\n", "hello"},
		{"bare LF after data", "5\r\nhello\n0\r\n\r\n", "hello"},
		{"data longer than size", "3\r\nhello\r\n0\r\n\r\n", "hel"},
		{"long line", "5;" + strings.Repeat("a", 5000) + "\r\nhello\r\n0\r\n\r\n", ""},
		{"bad extension", "5;=x\r\nhello\r\n0\r\n\r\n", ""},
		{"ext control byte", "5;a=\x01\r\nhello\r\n0\r\n\r\n", ""},
		{"unterminated quote", "5;a=\"x\r\nhello\r\n0\r\n\r\n", ""},
		{"trailer content-length", "5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n", "hello"},
		{"trailer transfer-encoding", "5\r\nhello\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n", "hello"},
		{"trailer obs-fold", "5\r\nhello\r\n0\r\nX-A: 1\r\n  2\r\n\r\n", "hello"},
		{"trailer space before colon", "5\r\nhello\r\n0\r\nX-A : 1\r\n\r\n", "hello"},
		{"trailer bare LF", "5\r\nhello\r\n0\r\nX-A: 1\n\r\n", "hello"},
		{"empty size", "\r\nhello\r\n0\r\n\r\n", ""},
		{"trailing space", "5 \r\nhello\r\n0\r\n\r\n", ""},
		{"trailing space after extension", "5;a=b \r\nhello\r\n0\r\n\r\n", ""},
	}
	for _, tc := range cases {
		got, err := decodeAll(tc.in, false)
		if !errors.Is(err, ErrFraming) {
			t.Errorf("%s: err %v, want ErrFraming", tc.name, err)
		}
		// WriteTo may hold back the valid data gathered before the error; it never forwards
		// anything else.
		if !strings.HasPrefix(tc.wantData, got) {
			t.Errorf("%s: forwarded %q before the error, want a prefix of %q", tc.name, got, tc.wantData)
		}
		// Read hands out exactly the valid data before the error.
		var d ChunkedReader
		d.Reset(strings.NewReader(tc.in), make([]byte, BufferSize))
		rgot, rerr := io.ReadAll(&d)
		if !errors.Is(rerr, ErrFraming) || string(rgot) != tc.wantData {
			t.Errorf("%s: Read gave %q, %v; want %q and ErrFraming", tc.name, rgot, rerr, tc.wantData)
		}
	}
}

func TestChunkedTruncated(t *testing.T) {
	for _, in := range []string{"", "5\r\nhel", "5\r\nhello\r\n", "5\r\nhello\r\n0\r\n"} {
		_, err := decodeAll(in, false)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%q: err %v, want unexpected EOF", in, err)
		}
	}
}

// TestChunkedLargeConstantMemory decodes 64 MiB in 1 MiB chunks through one 64 KiB buffer and
// measures the heap it allocated meanwhile: whatever the body size, the decoder holds no more
// than its buffer (SPEC 6). The input is generated as it is read, so that it is not in memory
// either.
func TestChunkedLargeConstantMemory(t *testing.T) {
	const chunks, chunkSize = 64, 1 << 20
	src := &chunkedGenerator{chunks: chunks, size: chunkSize}
	var d ChunkedReader
	buf := make([]byte, BufferSize)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d.Reset(src, buf)
	n, err := d.WriteTo(io.Discard)
	runtime.ReadMemStats(&after)
	if err != nil || n != chunks*chunkSize {
		t.Fatalf("n=%d err=%v", n, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
		t.Errorf("decoding %d MiB allocated %d KiB on the heap, want at most 64 KiB whatever the size", n>>20, alloc>>10)
	}
}

// chunkedGenerator produces a chunked body of chunks chunks of size 'x' bytes, then the last
// chunk, without holding it.
type chunkedGenerator struct {
	chunks, size int
	i, off       int  // chunk being written, offset in its framing
	done         bool // the last chunk was written
	head         string
}

func (g *chunkedGenerator) Read(p []byte) (int, error) {
	if g.done {
		return 0, io.EOF
	}
	if g.head == "" {
		g.head = strconvHex(g.size) + "\r\n"
	}
	head := g.head
	frame := len(head) + g.size + 2
	n := 0
	for n < len(p) {
		if g.i == g.chunks {
			last := "0\r\n\r\n"
			m := copy(p[n:], last[g.off:])
			n += m
			g.off += m
			if g.off == len(last) {
				g.done = true
				break
			}
			continue
		}
		var m int
		switch {
		case g.off < len(head):
			m = copy(p[n:], head[g.off:])
		case g.off < len(head)+g.size:
			m = min(len(p)-n, len(head)+g.size-g.off)
			for k := range m {
				p[n+k] = 'x'
			}
		default:
			m = copy(p[n:], "\r\n"[g.off-len(head)-g.size:])
		}
		n += m
		g.off += m
		if g.off == frame {
			g.i, g.off = g.i+1, 0
		}
	}
	return n, nil
}

func FuzzChunkedReader(f *testing.F) {
	for _, s := range []string{"0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n", "5;a=b\r\nhello\r\n0\r\nX: y\r\n\r\n", "+5\r\nhello\r\n0\r\n\r\n", "5\nhello\n0\n\n", "fffffffffffffffff\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var d ChunkedReader
		d.Reset(bytes.NewReader(in), make([]byte, 2*MaxChunkLineBytes))
		out, err := io.ReadAll(&d)
		if len(out) > len(in) {
			t.Fatalf("decoded %d bytes from %d", len(out), len(in))
		}
		if err == nil {
			// A body accepted must re-encode to something the decoder accepts again.
			var re bytes.Buffer
			if len(out) > 0 {
				re.WriteString(strings.ToUpper(strconvHex(len(out))) + "\r\n")
				re.Write(out)
				re.WriteString("\r\n")
			}
			re.WriteString("0\r\n\r\n")
			var d2 ChunkedReader
			d2.Reset(&re, make([]byte, 2*MaxChunkLineBytes))
			out2, err2 := io.ReadAll(&d2)
			if err2 != nil || !bytes.Equal(out, out2) {
				t.Fatalf("re-encoded body not accepted: %v", err2)
			}
		}
	})
}

func strconvHex(n int) string {
	const digits = "0123456789abcdef"
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{digits[n%16]}, b...)
		n /= 16
	}
	return string(b)
}

type countingWriter struct {
	writes int
	bytes.Buffer
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	return c.Buffer.Write(p)
}

// TestChunkedWriteToGathers: small chunks are forwarded in one write per read from the source,
// not one write per chunk.
func TestChunkedWriteToGathers(t *testing.T) {
	var in strings.Builder
	var want strings.Builder
	for i := 0; i < 1000; i++ {
		in.WriteString("a\r\n0123456789\r\n")
		want.WriteString("0123456789")
	}
	in.WriteString("0\r\n\r\n")
	var d ChunkedReader
	d.Reset(strings.NewReader(in.String()), make([]byte, BufferSize))
	var out countingWriter
	n, err := d.WriteTo(&out)
	if err != nil || n != 10000 || out.String() != want.String() {
		t.Fatalf("n=%d err=%v, body ok %v", n, err, out.String() == want.String())
	}
	if out.writes > 2 {
		t.Errorf("%d writes for 1000 chunks read in one go", out.writes)
	}
}
