package limits

import (
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"
)

func ip(s string) RateKey { return IPKey(netip.MustParseAddr(s).Unmap()) }

func TestRateLimiterBurstAndRefill(t *testing.T) {
	t.Parallel()
	l := NewRateLimiter(2, 3, 0) // 2/s, burst 3
	t0 := time.Now()
	k := ip("192.0.2.1")
	for i := range 3 {
		if ok, _ := l.Allow(k, t0); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, wait := l.Allow(k, t0)
	if ok {
		t.Fatal("fourth request at once allowed with burst 3")
	}
	if wait <= 0 || wait > 500*time.Millisecond {
		t.Errorf("wait = %s, want (0, 500ms]: one token every 500ms", wait)
	}
	if got := RetryAfterSeconds(wait); got != 1 {
		t.Errorf("Retry-After = %d, want 1", got)
	}
	// Refill: one token per 500ms.
	if ok, _ := l.Allow(k, t0.Add(499*time.Millisecond)); ok {
		t.Error("allowed before the first token was back")
	}
	if ok, _ := l.Allow(k, t0.Add(500*time.Millisecond)); !ok {
		t.Error("refused once a token was back")
	}
	// After 1.5s idle the bucket is full again: three at once.
	t1 := t0.Add(2 * time.Second)
	for i := range 3 {
		if ok, _ := l.Allow(k, t1); !ok {
			t.Fatalf("after the refill, request %d refused", i+1)
		}
	}
	if ok, _ := l.Allow(k, t1); ok {
		t.Error("the refill exceeded the burst")
	}
}

func TestRateLimiterFractionalRate(t *testing.T) {
	t.Parallel()
	l := NewRateLimiter(0.5, 1, 0) // one request every 2s
	t0 := time.Now()
	k := ip("192.0.2.1")
	if ok, _ := l.Allow(k, t0); !ok {
		t.Fatal("first request refused")
	}
	ok, wait := l.Allow(k, t0.Add(100*time.Millisecond))
	if ok || RetryAfterSeconds(wait) != 2 {
		t.Errorf("second request: allowed %v, Retry-After %d (wait %s), want refused, 2", ok, RetryAfterSeconds(wait), wait)
	}
	if ok, _ := l.Allow(k, t0.Add(2*time.Second)); !ok {
		t.Error("refused after 2s")
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int64{
		time.Nanosecond: 1, 999 * time.Millisecond: 1, time.Second: 1, time.Second + 1: 2, 2500 * time.Millisecond: 3,
	} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%s) = %d, want %d", d, got, want)
		}
	}
}

func TestRateLimiterKeys(t *testing.T) {
	t.Parallel()
	l := NewRateLimiter(1, 1, 0)
	t0 := time.Now()
	if ok, _ := l.Allow(ip("192.0.2.1"), t0); !ok {
		t.Fatal("refused")
	}
	// Independent keys: another address, another /64, a header value each have their own bucket.
	for _, k := range []RateKey{ip("192.0.2.2"), ip("2001:db8:0:1::1"), ip("2001:db8:0:2::1"), l.HeaderKey([]byte("tenant-a")), l.HeaderKey([]byte("tenant-b"))} {
		if ok, _ := l.Allow(k, t0); !ok {
			t.Errorf("key %v refused: it shares a bucket", k)
		}
	}
	// One /64 is one bucket.
	if ok, _ := l.Allow(ip("2001:db8:0:1:ffff:1234:5678:9abc"), t0); ok {
		t.Error("another address of the same /64 has its own bucket")
	}
	if ok, _ := l.Allow(l.HeaderKey([]byte("tenant-a")), t0); ok {
		t.Error("the same header value has two buckets")
	}
	// IPv4 and IPv6 keys never meet, and an IPv4 key is not a header key.
	if IPKey(netip.MustParseAddr("0.0.0.0")) == IPKey(netip.MustParseAddr("::")) {
		t.Error("0.0.0.0 and ::/64 share a key")
	}
	if k := IPKey(netip.MustParseAddr("0.0.0.1")); k.lo == headerKeyLo {
		t.Error("an IPv4 key looks like a header key")
	}
}

func TestRateLimiterForgetsFullBuckets(t *testing.T) {
	t.Parallel()
	l := NewRateLimiter(10, 5, 0)
	t0 := time.Now()
	for i := range 1000 {
		k := IPKey(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}))
		l.Allow(k, t0)
	}
	if n := l.keys.Load(); n != 1000 {
		t.Fatalf("keys = %d, want 1000", n)
	}
	// 0.1s later each bucket (one token spent) is full again and forgotten by the sweep.
	l.SweepIfDue(t0.Add(2 * time.Second))
	if n := l.keys.Load(); n != 0 {
		t.Errorf("keys after the refill = %d, want 0", n)
	}
	for i := range l.shards {
		if n := len(l.shards[i].tat); n != 0 {
			t.Errorf("shard %d still holds %d buckets", i, n)
		}
	}
}

func TestRateLimiterOverflow(t *testing.T) {
	t.Parallel()
	l := NewRateLimiter(1, 2, 10)
	t0 := time.Now()
	active := make([]RateKey, 10)
	for i := range active {
		active[i] = IPKey(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
		l.Allow(active[i], t0)
	}
	// The table is full: new keys share one overflow bucket of burst 2.
	for i := range 2 {
		if ok, _ := l.Allow(IPKey(netip.AddrFrom4([4]byte{10, 1, 0, byte(i)})), t0); !ok {
			t.Errorf("overflow request %d refused", i)
		}
	}
	if ok, _ := l.Allow(IPKey(netip.AddrFrom4([4]byte{10, 1, 0, 9})), t0); ok {
		t.Error("a third new key got a token: the overflow bucket is not shared")
	}
	if n := l.keys.Load(); n != 10 {
		t.Errorf("keys = %d, want the bound 10", n)
	}
	// The active keys kept their own buckets (one token left of two).
	for _, k := range active {
		if ok, _ := l.Allow(k, t0); !ok {
			t.Error("an active key lost its bucket to make room")
		}
		if ok, _ := l.Allow(k, t0); ok {
			t.Error("an active key's bucket was reset")
		}
	}
	// Once their buckets are full again they make room for new keys.
	later := t0.Add(5 * time.Second)
	if ok, _ := l.Allow(IPKey(netip.AddrFrom4([4]byte{10, 2, 0, 1})), later); !ok {
		t.Error("refused after the table emptied")
	}
	if l.keys.Load() > 10 {
		t.Errorf("keys = %d above the bound", l.keys.Load())
	}
}

// TestRateLimiterMemoryBounded floods one limiter with 1,000,000 distinct client IPs within one
// refill period, as a botnet or a spoofing attacker would: the table stops at its 100,000 keys
// and the heap stays within what those keys cost.
func TestRateLimiterMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a million keys")
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l := NewRateLimiter(1, 1, 0)
	t0 := time.Now()
	for i := range 1_000_000 {
		k := IPKey(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
		l.Allow(k, t0.Add(time.Duration(i)*time.Microsecond)) // the whole flood within 1s
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := l.keys.Load(); n != DefaultRateLimitKeys {
		t.Errorf("keys = %d, want the bound %d", n, DefaultRateLimitKeys)
	}
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap for %d keys after a flood of 1,000,000: %.1f MiB (%.0f bytes a key)", l.keys.Load(), float64(grown)/(1<<20), float64(grown)/float64(l.keys.Load()))
	if grown > 16<<20 {
		t.Errorf("heap grew by %d bytes: more than 16 MiB for 100,000 keys", grown)
	}
	// A second later every bucket is full again and the table is empty and small again.
	l.SweepIfDue(t0.Add(3 * time.Second))
	runtime.GC()
	var freed runtime.MemStats
	runtime.ReadMemStats(&freed)
	if n := l.keys.Load(); n != 0 {
		t.Errorf("keys after the refill = %d, want 0", n)
	}
	if left := int64(freed.HeapAlloc) - int64(before.HeapAlloc); left > 2<<20 {
		t.Errorf("%d bytes still held once every bucket was full again", left)
	}
	runtime.KeepAlive(l)
}

func TestRateLimiterNoAllocation(t *testing.T) {
	l := NewRateLimiter(1e6, 1e6, 0)
	k := ip("192.0.2.1")
	hk := []byte("tenant")
	now := time.Now()
	l.Allow(k, now)
	l.Allow(l.HeaderKey(hk), now)
	if n := testing.AllocsPerRun(1000, func() {
		l.Allow(k, now)
		l.Allow(l.HeaderKey(hk), now)
	}); n != 0 {
		t.Errorf("Allow of an existing key allocates %.1f times", n)
	}
}

func TestRateLimiterConcurrent(t *testing.T) {
	t.Parallel()
	l := NewRateLimiter(1, 100, 50)
	now := time.Now()
	var wg sync.WaitGroup
	var allowed [8]int
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				k := IPKey(netip.AddrFrom4([4]byte{10, 0, byte(g), byte(i % 20)}))
				if ok, _ := l.Allow(k, now); ok {
					allowed[g]++
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, n := range allowed {
		total += n
	}
	// 160 keys asked 50 times each: the 50 in the table get all 50 (100 tokens each), the 110
	// others share one bucket of 100.
	if want := 50*50 + 100; total != want {
		t.Errorf("allowed %d requests, want %d", total, want)
	}
	if n := l.keys.Load(); n != 50 {
		t.Errorf("keys = %d, want 50", n)
	}
}

func TestRateLimiterExtremes(t *testing.T) {
	t.Parallel()
	now := time.Now()
	k := IPKey(netip.MustParseAddr("192.0.2.1"))
	// A huge burst at a small rate must not overflow into "always refused" (the bucket is
	// capped at 36 years of refill, a million tokens here).
	l := NewRateLimiter(1e-3, 1e9, 0)
	for i := range 100 {
		if ok, _ := l.Allow(k, now); !ok {
			t.Fatalf("request %d of a burst of 1e9 refused", i)
		}
	}
	// One request per ~30 years: the second waits, with a finite Retry-After.
	l = NewRateLimiter(1e-9, 1, 0)
	l.Allow(k, now)
	if ok, wait := l.Allow(k, now); ok || wait <= 0 || RetryAfterSeconds(wait) < 1 {
		t.Errorf("second request: allowed %v, wait %s", ok, wait)
	}
}
