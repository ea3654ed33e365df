package gateway

import (
	"io"
	"runtime"
	"testing"

	"github.com/valyala/fasthttp"
)

// startSinkUpstream is a fasthttp upstream that reads and discards request bodies as streams.
func startSinkUpstream(tb testing.TB) string {
	tb.Helper()
	return serveFast(tb, &fasthttp.Server{
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           1 << 30,
		Handler: func(ctx *fasthttp.RequestCtx) {
			if s := ctx.RequestBodyStream(); s != nil {
				_, _ = io.Copy(io.Discard, s)
			}
			ctx.SetBodyString("ok")
		},
	})
}

// zeroReader yields n zero bytes without allocating.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

func benchmarkUpload(b *testing.B, addr string, size int64, chunked bool) {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1, WriteBufferSize: 64 << 10}
	defer hc.CloseIdleConnections()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	b.SetBytes(size)
	b.ReportAllocs()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.Reset()
		req.SetRequestURI("http://" + addr + "/up/file")
		req.Header.SetMethod("POST")
		z := &zeroReader{n: size}
		if chunked {
			req.SetBodyStream(z, -1)
		} else {
			req.SetBodyStream(z, int(size))
		}
		if err := hc.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode() != 200 {
			b.Fatalf("status %d %s", resp.StatusCode(), resp.Body())
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	mib := float64(size) / (1 << 20) * float64(b.N)
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/mib, "allocs/MiB")
}

const benchUploadSize = 64 << 20

// BenchmarkStreamUploadDirect is the baseline: 64 MiB straight to the sink.
func BenchmarkStreamUploadDirect(b *testing.B) {
	benchmarkUpload(b, startSinkUpstream(b), benchUploadSize, false)
}

// BenchmarkStreamUpload is 64 MiB with a Content-Length through the gateway.
func BenchmarkStreamUpload(b *testing.B) {
	up := startSinkUpstream(b)
	gw := startGatewayB(b, "", upstreamRoute("/up", up, "max_body_bytes: 1GiB\nmax_concurrency: 8"), false)
	benchmarkUpload(b, gw.addr, benchUploadSize, false)
}

// BenchmarkStreamUploadChunked is 64 MiB chunked through the gateway (normalize: re-chunked).
func BenchmarkStreamUploadChunked(b *testing.B) {
	up := startSinkUpstream(b)
	gw := startGatewayB(b, "", upstreamRoute("/up", up, "max_body_bytes: 1GiB\nmax_concurrency: 8"), false)
	benchmarkUpload(b, gw.addr, benchUploadSize, true)
}

// BenchmarkStreamUploadChunkedDirect is the chunked baseline.
func BenchmarkStreamUploadChunkedDirect(b *testing.B) {
	benchmarkUpload(b, startSinkUpstream(b), benchUploadSize, true)
}
