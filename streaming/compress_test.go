package streaming

import (
	"bytes"
	stdgzip "compress/gzip"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
	"github.com/valyala/fasthttp"
)

// jsonBody returns about n bytes of JSON shaped like an API's list answer.
func jsonBody(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"items":[`)
	for i := 0; sb.Len() < n-2; i++ {
		fmt.Fprintf(&sb, `{"id":%d,"name":"user-%d","email":"u%d@example.com","active":%t,"score":%d},`, i, i*7, i, i%3 == 0, i*31%1000)
	}
	s := sb.String()
	return []byte(s[:len(s)-1] + "]}")
}

// decompress decodes body with an independent decoder: the standard library's for gzip,
// klauspost's zstd decoder, andybalholm's brotli reader (not go-brrr, which encoded it).
func decompress(t testing.TB, e Encoding, r io.Reader) []byte {
	t.Helper()
	var dr io.Reader
	switch e {
	case Gzip:
		zr, err := stdgzip.NewReader(r)
		if err != nil {
			t.Fatalf("gzip header: %v", err)
		}
		dr = zr
	case Zstd:
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		dr = zr
	case Brotli:
		dr = brotli.NewReader(r)
	}
	out, err := io.ReadAll(dr)
	if err != nil {
		t.Fatalf("%s: decoding: %v", e, err)
	}
	return out
}

var allEncodings = []Encoding{Zstd, Brotli, Gzip}

func TestCompressRoundTrip(t *testing.T) {
	random := make([]byte, 200<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	bodies := map[string][]byte{
		"empty":      nil,
		"tiny":       []byte(`{"ok":true}`),
		"json3k":     jsonBody(3000),
		"json64k":    jsonBody(64 << 10),
		"json300k":   jsonBody(300 << 10),
		"random200k": random,
	}
	readers := map[string]func(io.Reader) io.Reader{
		"whole": func(r io.Reader) io.Reader { return r },
		"half":  iotest.HalfReader,
		"byte":  iotest.OneByteReader,
	}
	for _, e := range allEncodings {
		for bname, body := range bodies {
			for rname, wrap := range readers {
				if rname == "byte" && len(body) > 4<<10 {
					continue // one byte per unit: slow under -race, and adds nothing over 3 KiB
				}
				t.Run(e.String()+"/"+bname+"/"+rname, func(t *testing.T) {
					var dst bytes.Buffer
					n, err := CopyCompressed(&dst, wrap(bytes.NewReader(body)), e)
					if err != nil {
						t.Fatal(err)
					}
					if n != int64(dst.Len()) {
						t.Fatalf("reported %d bytes written, wrote %d", n, dst.Len())
					}
					got := decompress(t, e, &dst)
					if !bytes.Equal(got, body) {
						t.Fatalf("decoded %d bytes, want %d, equal prefix %d", len(got), len(body), commonPrefix(got, body))
					}
					if bname == "json64k" && rname == "whole" && dst.Len() > len(body)/4 {
						t.Fatalf("64 KiB of JSON compressed to %d bytes: not compressed", dst.Len())
					}
				})
			}
		}
	}
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// errAfter returns data, then err instead of io.EOF.
type errAfter struct {
	r   io.Reader
	err error
}

func (e *errAfter) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		return n, e.err
	}
	return n, err
}

// TestCompressUpstreamErrorNoEnd: an upstream that fails mid-body leaves the compressed stream
// unterminated, so the client's decoder reports a truncated stream, never a clean end.
func TestCompressUpstreamErrorNoEnd(t *testing.T) {
	boom := errors.New("upstream reset")
	for _, e := range allEncodings {
		t.Run(e.String(), func(t *testing.T) {
			var dst bytes.Buffer
			_, err := CopyCompressed(&dst, &errAfter{bytes.NewReader(jsonBody(10 << 10)), boom}, e)
			if !errors.Is(err, boom) {
				t.Fatalf("err = %v, want the upstream's", err)
			}
			var dr io.Reader
			switch e {
			case Gzip:
				zr, err := stdgzip.NewReader(&dst)
				if err != nil {
					t.Fatal(err)
				}
				dr = zr
			case Zstd:
				// Every unit is a complete frame: a zstd client sees the units sent, and the
				// missing end is seen by HTTP's framing (no terminating chunk).
				return
			case Brotli:
				dr = brotli.NewReader(&dst)
			}
			if _, err := io.ReadAll(dr); err == nil {
				t.Fatal("a truncated stream decoded as complete")
			}
		})
	}
}

// TestCompressFlushesOnPause: what the upstream sent before a pause reaches the client,
// decodable, while the upstream is still silent.
func TestCompressFlushesOnPause(t *testing.T) {
	first := jsonBody(3000)
	second := []byte(`{"last":true}`)
	for _, e := range allEncodings {
		t.Run(e.String(), func(t *testing.T) {
			upR, upW := io.Pipe()
			cliR, cliW := io.Pipe()
			done := make(chan error, 1)
			go func() {
				_, err := CopyCompressed(cliW, upR, e)
				cliW.CloseWithError(err)
				done <- err
			}()
			decoded := make(chan []byte, 1)
			decErr := make(chan error, 1)
			go func() {
				var dr io.Reader
				switch e {
				case Gzip:
					zr, err := stdgzip.NewReader(cliR)
					if err != nil {
						decErr <- err
						return
					}
					dr = zr
				case Zstd:
					zr, err := zstd.NewReader(cliR, zstd.WithDecoderConcurrency(1))
					if err != nil {
						decErr <- err
						return
					}
					defer zr.Close()
					dr = zr
				case Brotli:
					dr = brotli.NewReader(cliR)
				}
				buf := make([]byte, len(first))
				if _, err := io.ReadFull(dr, buf); err != nil {
					decErr <- err
					return
				}
				decoded <- buf
				rest, err := io.ReadAll(dr)
				if err != nil {
					decErr <- err
					return
				}
				decoded <- rest
			}()
			if _, err := upW.Write(first); err != nil {
				t.Fatal(err)
			}
			select {
			case got := <-decoded:
				if !bytes.Equal(got, first) {
					t.Fatal("first part decoded wrong")
				}
			case err := <-decErr:
				t.Fatal(err)
			case <-time.After(5 * time.Second):
				t.Fatal("the part sent before the pause did not arrive while the upstream paused")
			}
			upW.Write(second)
			upW.Close()
			select {
			case got := <-decoded:
				if !bytes.Equal(got, second) {
					t.Fatalf("second part %q", got)
				}
			case err := <-decErr:
				t.Fatal(err)
			case <-time.After(5 * time.Second):
				t.Fatal("end not seen")
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestNegotiate(t *testing.T) {
	route := []Encoding{Zstd, Brotli, Gzip}
	cases := []struct {
		accept string
		want   Encoding
	}{
		{"", Identity},
		{"gzip", Gzip},
		{"gzip, deflate, br", Brotli},
		{"gzip, deflate, br, zstd", Zstd},
		{"br;q=0.9, gzip", Gzip},
		{"zstd;q=0, br;q=0, gzip;q=0", Identity},
		{"*", Zstd},
		{"*;q=0.5, gzip", Gzip},
		{"*, zstd;q=0", Brotli},
		{"*;q=0", Identity},
		{"identity", Identity},
		{"GZIP", Gzip},
		{"x-gzip", Gzip},
		{"br;q=0.5, gzip;q=0.5", Brotli},
		{"gzip;q=1.5, br;q=abc", Identity},
		{"gzip ; q=0.001", Gzip},
		{"  br  ,  ", Brotli},
		{"deflate", Identity},
		{"gzip;q=0.8;level=1", Gzip},
	}
	for _, c := range cases {
		if got := Negotiate([]byte(c.accept), route); got != c.want {
			t.Errorf("Accept-Encoding %q: %s, want %s", c.accept, got, c.want)
		}
	}
	if got := Negotiate([]byte("br, gzip"), []Encoding{Gzip, Brotli}); got != Gzip {
		t.Errorf("route order did not break the tie: %s", got)
	}
}

func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{"gzip", "br;q=0.9, gzip", "*;q=0", "zstd;q=0, *", "gzip;q=1.000", "x-gzip;q=0."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, accept string) {
		e := Negotiate([]byte(accept), []Encoding{Zstd, Brotli, Gzip})
		if e > Gzip {
			t.Fatalf("unknown coding %d", e)
		}
		if e != Identity && qValue([]byte(accept), e) == 0 {
			t.Fatalf("chose %s, which %q refuses", e, accept)
		}
	})
}

func defaultPolicy() *CompressPolicy {
	return &CompressPolicy{Encodings: []Encoding{Zstd, Brotli, Gzip}, MinBytes: DefaultCompressMinBytes, Types: DefaultCompressTypes}
}

func TestCompressPolicyApply(t *testing.T) {
	cases := []struct {
		name     string
		method   string
		accept   string
		status   int
		ct       string
		cl       int64
		extra    [][2]string
		want     Encoding
		wantVary bool
	}{
		{name: "json", accept: "gzip", ct: "application/json", cl: -1, want: Gzip, wantVary: true},
		{name: "charset", accept: "br", ct: "text/html; charset=utf-8", cl: 5000, want: Brotli, wantVary: true},
		{name: "no accept", ct: "application/json", cl: -1, want: Identity, wantVary: true},
		{name: "q0", accept: "gzip;q=0", ct: "application/json", cl: -1, want: Identity, wantVary: true},
		{name: "star", accept: "*", ct: "application/json", cl: -1, want: Zstd, wantVary: true},
		{name: "image", accept: "gzip", ct: "image/png", cl: -1, want: Identity},
		{name: "no type", accept: "gzip", cl: -1, want: Identity},
		{name: "event stream", accept: "gzip", ct: "text/event-stream", cl: -1, want: Identity},
		{name: "head", method: "HEAD", accept: "gzip", ct: "application/json", cl: 5000, want: Identity, wantVary: true},
		{name: "204", accept: "gzip", status: 204, ct: "application/json", cl: -1, want: Identity},
		{name: "206", accept: "gzip", status: 206, ct: "application/json", cl: 5000, want: Identity},
		{name: "304", accept: "gzip", status: 304, ct: "application/json", cl: -1, want: Identity},
		{name: "101", accept: "gzip", status: 101, ct: "application/json", cl: -1, want: Identity},
		{name: "short", accept: "gzip", ct: "application/json", cl: 1023, want: Identity, wantVary: true},
		{name: "min", accept: "gzip", ct: "application/json", cl: 1024, want: Gzip, wantVary: true},
		{name: "encoded", accept: "gzip", ct: "application/json", cl: -1, extra: [][2]string{{"Content-Encoding", "br"}}, want: Identity, wantVary: true},
		{name: "no-transform", accept: "gzip", ct: "application/json", cl: -1, extra: [][2]string{{"Cache-Control", "public, No-Transform"}}, want: Identity, wantVary: true},
		{name: "vary kept", accept: "gzip", ct: "application/json", cl: -1, extra: [][2]string{{"Vary", "Origin, accept-encoding"}}, want: Gzip},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var req fasthttp.RequestHeader
			req.SetMethod(cmpOr(c.method, "GET"))
			if c.accept != "" {
				req.Set("Accept-Encoding", c.accept)
			}
			var resp fasthttp.ResponseHeader
			resp.SetNoDefaultContentType(true)
			resp.SetStatusCode(cmpOr(c.status, 200))
			if c.ct != "" {
				resp.SetContentType(c.ct)
			}
			resp.Set("ETag", `"abc"`)
			resp.Set("Accept-Ranges", "bytes")
			for _, h := range c.extra {
				resp.Add(h[0], h[1])
			}
			got := defaultPolicy().Apply(&req, &resp, c.cl)
			if got != c.want {
				t.Fatalf("Apply = %s, want %s", got, c.want)
			}
			vary := 0
			for _, v := range resp.PeekAll("Vary") {
				if strings.Contains(strings.ToLower(string(v)), "accept-encoding") {
					vary++
				}
			}
			if c.wantVary && vary != 1 || !c.wantVary && c.name != "vary kept" && vary != 0 {
				t.Fatalf("Vary: Accept-Encoding appears %d times; want it: %v", vary, c.wantVary)
			}
			if c.name == "vary kept" && len(resp.PeekAll("Vary")) != 1 {
				t.Fatal("Vary added twice")
			}
			if got != Identity {
				if string(resp.ContentEncoding()) != got.String() {
					t.Fatalf("Content-Encoding %q", resp.ContentEncoding())
				}
				if resp.Peek("Accept-Ranges") != nil {
					t.Fatal("Accept-Ranges kept")
				}
				if string(resp.Peek("ETag")) != `W/"abc"` {
					t.Fatalf("ETag %q", resp.Peek("ETag"))
				}
			} else if string(resp.Peek("ETag")) != `"abc"` || string(resp.Peek("Accept-Ranges")) != "bytes" {
				t.Fatal("an uncompressed answer's headers changed")
			}
		})
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func TestCompressPolicyApplyAllocs(t *testing.T) {
	p := defaultPolicy()
	var req fasthttp.RequestHeader
	req.Set("Accept-Encoding", "gzip, deflate, br;q=0.9, zstd")
	var resp fasthttp.ResponseHeader
	allocs := testing.AllocsPerRun(200, func() {
		resp.Reset()
		resp.SetContentType("application/json")
		resp.Set("ETag", `"v1"`)
		if p.Apply(&req, &resp, -1) != Zstd {
			t.Fatal("not compressed")
		}
	})
	if allocs != 0 {
		t.Fatalf("Apply allocates %.1f times per response", allocs)
	}
}
