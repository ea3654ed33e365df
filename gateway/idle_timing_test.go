package gateway

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// BenchmarkIdleConnectionMemory opens idleConns keep-alive connections that make one small
// proxied GET each and then wait, and reports the heap and goroutine stack the gateway holds
// per idle connection (SPEC 22; make bench-idle measures the process's RSS beside nginx's and
// HAProxy's). The client's own sockets are in the figure too (a few hundred bytes each).
func BenchmarkIdleConnectionMemory(b *testing.B) {
	const idleConns = 2000
	up := startUpstream(b, nil)
	tg := startGatewayB(b, "max_connections: 10000\nidle_timeout: 120s\n", upstreamRoute("/api", up.addr, ""), false)
	req := []byte("GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")
	buf := make([]byte, 4096)
	var heap, stack float64
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		conns := make([]net.Conn, 0, idleConns)
		for j := 0; j < idleConns; j++ {
			c, err := net.Dial("tcp", tg.addr)
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
			if _, err := c.Write(req); err != nil {
				b.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := c.Read(buf); err != nil || n == 0 {
				b.Fatalf("connection %d: %v", j, err)
			}
		}
		time.Sleep(200 * time.Millisecond) // every connection has gone idle
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m1)
		heap += float64(int64(m1.HeapInuse)-int64(m0.HeapInuse)) / idleConns / 1024
		stack += float64(int64(m1.StackInuse)-int64(m0.StackInuse)) / idleConns / 1024
		for _, c := range conns {
			_ = c.Close()
		}
	}
	b.ReportMetric(heap/float64(b.N), "heap-KiB/conn")
	b.ReportMetric(stack/float64(b.N), "stack-KiB/conn")
}
