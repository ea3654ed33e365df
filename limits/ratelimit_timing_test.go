package limits

import (
	"net/netip"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/testnet"
)

// BenchmarkRateLimiterAllow is Allow on an existing key, the common case.
func BenchmarkRateLimiterAllow(b *testing.B) {
	l := NewRateLimiter(1e9, 1e9, 0)
	k := IPKey(netip.MustParseAddr("192.0.2.1"))
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		l.Allow(k, now)
	}
}

// BenchmarkRateLimiterAllowParallel is Allow from every core, each goroutine its own client.
func BenchmarkRateLimiterAllowParallel(b *testing.B) {
	l := NewRateLimiter(1e9, 1e9, 0)
	var n atomic.Int32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := IPKey(netip.AddrFrom4([4]byte{10, 0, 0, byte(n.Add(1))}))
		now := time.Now()
		for pb.Next() {
			l.Allow(k, now)
		}
	})
}

// BenchmarkRateLimiterNewKeys is Allow on a flood of distinct keys: the table fills to its
// 100,000 keys, then the overflow bucket takes the rest.
func BenchmarkRateLimiterNewKeys(b *testing.B) {
	l := NewRateLimiter(1, 1, 0)
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Allow(IPKey(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})), now)
		i++
	}
}

// BenchmarkRateLimiterMemory reports the heap and RSS growth of one route's table: 100,000
// active keys, and a flood of 1,000,000 distinct keys within one refill period (bounded by the
// table: the keys beyond share the overflow bucket). RSS is that of the first round (later
// rounds reuse the memory the runtime kept): run one sub-benchmark per process for it,
// -bench 'Memory/100000keys' -benchtime=1x.
func BenchmarkRateLimiterMemory(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(strconv.Itoa(n)+"keys", func(b *testing.B) {
			var heap, rss float64
			first := true
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				rss0 := rssBytes()
				l := NewRateLimiter(1, 1, 0)
				now := time.Now()
				for i := range n {
					l.Allow(IPKey(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})), now)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = float64(after.HeapAlloc) - float64(before.HeapAlloc)
				if first {
					rss, first = float64(rssBytes()-rss0), false
				}
				if l.keys.Load() != int64(min(n, DefaultRateLimitKeys)) {
					b.Fatalf("keys %d", l.keys.Load())
				}
				runtime.KeepAlive(l)
			}
			b.ReportMetric(heap/(1<<20), "heap-MiB")
			b.ReportMetric(rss/(1<<20), "rss-MiB")
		})
	}
}

// rssBytes is the process's resident set (testnet.RSSBytes); 0 where /proc cannot tell.
func rssBytes() int64 {
	n, _ := testnet.RSSBytes(0)
	return n
}
