package limits

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"toron/internal/redistest"
	"toron/internal/testnet"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"
)

// inspect returns a plain rueidis client of addrs for looking at what the limiter stored.
func inspect(t *testing.T, o rueidis.ClientOption) rueidis.Client {
	t.Helper()
	o.DisableCache = true
	c, err := rueidis.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// instance is one simulated Toron process: its own client of Redis and its own limiter.
type instance struct {
	r      *Redis
	g      *GlobalLimiter
	errors *metrics.Counter
	set    *metrics.Set
}

func newInstance(t *testing.T, o RedisOptions, route string, rate, burst float64, onError OnError) *instance {
	t.Helper()
	set := metrics.NewSet()
	in := &instance{r: newTestRedis(t, o), set: set,
		errors: set.NewCounter(`toron_ratelimit_backend_errors_total{route="` + route + `"}`)}
	in.g = NewGlobalLimiter(in.r, rate, burst, GlobalOptions{Route: route, Local: NewRateLimiter(rate, burst, 0),
		OnError: onError, Errors: in.errors})
	return in
}

func TestGlobalKeyLayoutAndExpiry(t *testing.T) {
	s := redistest.Start(t)
	in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: time.Second}, "/api", 2, 3, OnErrorDeny)
	a := netip.MustParseAddr("192.0.2.7")
	for i := 0; i < 3; i++ {
		if ok, _ := in.g.AllowIP(a, time.Now()); !ok {
			t.Fatalf("decision %d of a burst of 3 refused", i+1)
		}
	}
	ok, wait := in.g.AllowIP(a, time.Now())
	if ok || wait <= 0 || wait > 600*time.Millisecond {
		t.Fatalf("4th decision: ok=%v wait=%s, want a refusal of about 500ms", ok, wait)
	}
	if !in.r.Up() || in.errors.Get() != 0 {
		t.Fatalf("up=%v errors=%d after answered decisions", in.r.Up(), in.errors.Get())
	}

	c := inspect(t, rueidis.ClientOption{InitAddress: []string{s.Addr}})
	ctx := context.Background()
	keys, err := c.Do(ctx, c.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	k := IPKey(a)
	in17 := []byte{'i'}
	in17 = fmt.Appendf(in17, "%s", []byte{byte(k.hi >> 56), byte(k.hi >> 48), byte(k.hi >> 40), byte(k.hi >> 32),
		byte(k.hi >> 24), byte(k.hi >> 16), byte(k.hi >> 8), byte(k.hi), byte(k.lo >> 56), byte(k.lo >> 48),
		byte(k.lo >> 40), byte(k.lo >> 32), byte(k.lo >> 24), byte(k.lo >> 16), byte(k.lo >> 8), byte(k.lo)})
	sum := sha256.Sum256(in17)
	want := "toron:rl:{/api}:" + hex.EncodeToString(sum[:8])
	if len(keys) != 1 || keys[0] != want {
		t.Fatalf("keys in redis %q, want [%q]", keys, want)
	}
	if strings.Contains(keys[0], "192.0.2.7") {
		t.Fatalf("the client IP is stored in redis: %q", keys[0])
	}
	// Three tokens taken at 2/s: the bucket is full again in about 1.5 s, and so the key expires.
	pttl, err := c.Do(ctx, c.B().Pttl().Key(want).Build()).AsInt64()
	if err != nil || pttl <= 1000 || pttl > 1600 {
		t.Fatalf("PTTL %d ms (%v), want about 1500", pttl, err)
	}

	// A header key: hashed the same way, never stored in the clear.
	if ok, _ := in.g.AllowHeader([]byte("secret-api-key"), time.Now()); !ok {
		t.Fatal("first decision of a header key refused")
	}
	keys, _ = c.Do(ctx, c.B().Keys().Pattern("*").Build()).AsStrSlice()
	if len(keys) != 2 || strings.Contains(strings.Join(keys, " "), "secret") {
		t.Fatalf("keys after a header key: %q", keys)
	}
	// The script is gone from the cache (a restarted server): EVALSHA falls back to EVAL.
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := in.g.AllowIP(netip.MustParseAddr("2001:db8:1:2::5"), time.Now()); !ok || in.errors.Get() != 0 {
		t.Fatalf("decision after SCRIPT FLUSH: ok=%v errors=%d", ok, in.errors.Get())
	}
	// IPv6 clients share their /64.
	for i := 0; i < 2; i++ {
		in.g.AllowIP(netip.MustParseAddr(fmt.Sprintf("2001:db8:1:2::%x", 100+i)), time.Now())
	}
	if ok, _ := in.g.AllowIP(netip.MustParseAddr("2001:db8:1:2:ffff::1"), time.Now()); ok {
		t.Fatal("a 4th address of one /64 was admitted: the /64 shares one bucket of 3")
	}
}

// TestGlobalSharedAcrossInstances: three limiters with their own clients (three Toron
// processes) share one Redis; over T seconds one key is admitted at most R·T + B times in
// total and at least 99% of it, whichever instance each request reached.
func TestGlobalSharedAcrossInstances(t *testing.T) {
	s := redistest.Start(t)
	const rate, burst = 100.0, 20.0
	var ins []*instance
	for i := 0; i < 3; i++ {
		ins = append(ins, newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: time.Second}, "/shared", rate, burst, OnErrorDeny))
	}
	a := netip.MustParseAddr("198.51.100.1")
	var calls []func() (bool, error)
	for _, in := range ins {
		calls = append(calls, func() (bool, error) { ok, _ := in.g.AllowIP(a, time.Now()); return ok, nil })
	}
	stopped, total, admitted, _ := redistest.Drive(calls, 2*time.Second, time.Millisecond)
	redistest.CheckAdmitted(t, admitted, rate, burst, stopped, total)
	for i, in := range ins {
		if in.errors.Get() != 0 || !in.r.Up() {
			t.Fatalf("instance %d: %d backend errors, up=%v", i, in.errors.Get(), in.r.Up())
		}
	}
}

// TestGlobalCluster: a Redis Cluster of three masters; one client is given every seed, another
// a single node (the cluster is found from it). Keys of two routes land in their routes' slots
// and each key's budget is shared.
func TestGlobalCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	const burst = 3
	var ins []*instance
	for _, addrs := range [][]string{cl.Addrs(), {cl.Nodes[1].Addr}} {
		for _, route := range []string{"/a", "/b"} {
			ins = append(ins, newInstance(t, RedisOptions{Addrs: addrs, Timeout: time.Second}, route, 0.001, burst, OnErrorDeny))
		}
	}
	for k := 0; k < 20; k++ {
		a := netip.AddrFrom4([4]byte{10, 0, 0, byte(k)})
		for ri, route := range []string{"/a", "/b"} {
			n := 0
			for rep := 0; rep < 3; rep++ {
				for _, in := range []*instance{ins[ri], ins[2+ri]} {
					if ok, _ := in.g.AllowIP(a, time.Now()); ok {
						n++
					}
				}
			}
			if n != burst {
				t.Fatalf("route %s key %d: %d of 6 decisions admitted across two clients, want %d", route, k, n, burst)
			}
		}
	}
	for i, in := range ins {
		if in.errors.Get() != 0 {
			t.Fatalf("instance %d: %d backend errors", i, in.errors.Get())
		}
	}
	// Each route's 20 keys sit together on one node, the one serving its hash tag's slot.
	c := inspect(t, rueidis.ClientOption{InitAddress: cl.Addrs()})
	ctx := context.Background()
	for _, route := range []string{"/a", "/b"} {
		var where []string
		for addr, node := range c.Nodes() {
			keys, err := node.Do(ctx, node.B().Keys().Pattern("toron:rl:{"+route+"}:*").Build()).AsStrSlice()
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) > 0 {
				where = append(where, fmt.Sprintf("%s:%d", addr, len(keys)))
			}
		}
		if len(where) != 1 || !strings.HasSuffix(where[0], ":20") {
			t.Fatalf("route %s: keys per node %v, want all 20 on one node", route, where)
		}
	}
}

func TestGlobalAuthTLSAndDB(t *testing.T) {
	t.Run("password", func(t *testing.T) {
		s := redistest.Start(t, "--requirepass", "s3cret")
		in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Password: "s3cret", DB: 3, Timeout: time.Second}, "/p", 1, 1, OnErrorDeny)
		if ok, _ := in.g.AllowIP(netip.MustParseAddr("192.0.2.1"), time.Now()); !ok || in.errors.Get() != 0 {
			t.Fatalf("ok=%v errors=%d", ok, in.errors.Get())
		}
		c := inspect(t, rueidis.ClientOption{InitAddress: []string{s.Addr}, Password: "s3cret", SelectDB: 3})
		if n, err := c.Do(context.Background(), c.B().Dbsize().Build()).AsInt64(); err != nil || n != 1 {
			t.Fatalf("db 3 holds %d keys (%v), want 1", n, err)
		}
		// A wrong password never connects: every decision follows on_error.
		r, err := NewRedis(RedisOptions{Addrs: []string{s.Addr}, Password: "wrong", Timeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		g := NewGlobalLimiter(r, 1, 1, GlobalOptions{Route: "/p", Local: NewRateLimiter(1, 1, 0), OnError: OnErrorDeny})
		time.Sleep(100 * time.Millisecond)
		if ok, wait := g.AllowIP(netip.MustParseAddr("192.0.2.2"), time.Now()); ok || wait != time.Second || r.Up() {
			t.Fatalf("wrong password: ok=%v wait=%s up=%v, want the deny verdict", ok, wait, r.Up())
		}
	})
	t.Run("acl-user", func(t *testing.T) {
		s := redistest.Start(t, "--user", "toron", "on", ">pw", "~toron:*", "+@all", "--user", "default", "off")
		in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Username: "toron", Password: "pw", Timeout: time.Second}, "/u", 1, 1, OnErrorDeny)
		if ok, _ := in.g.AllowIP(netip.MustParseAddr("192.0.2.1"), time.Now()); !ok || in.errors.Get() != 0 {
			t.Fatalf("ok=%v errors=%d", ok, in.errors.Get())
		}
	})
	t.Run("tls", func(t *testing.T) {
		s := redistest.StartTLS(t)
		in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, TLS: s.TLS, Timeout: time.Second}, "/t", 1, 1, OnErrorDeny)
		a := netip.MustParseAddr("192.0.2.1")
		if ok, _ := in.g.AllowIP(a, time.Now()); !ok {
			t.Fatalf("first decision over TLS refused (errors %d)", in.errors.Get())
		}
		if ok, _ := in.g.AllowIP(a, time.Now()); ok || in.errors.Get() != 0 {
			t.Fatalf("second decision over TLS: ok=%v errors=%d, want a refusal from redis", ok, in.errors.Get())
		}
	})
}

// failTimeout is the decision timeout of the failure tests, and failSlack the scheduling slack
// a decision may take beyond it on a busy machine (generous: the bound tested is that no
// decision waits for a dial, a handshake or a frozen server, which would take 1 s (the
// background dial's bound) or 2 s (a connection's reply timeout); on the shared 2-core machine
// a request that never touches Redis was seen to take 430 ms under -race).
const (
	failTimeout = 50 * time.Millisecond
	failSlack   = 400 * time.Millisecond
)

// decisions is the outcome of decideConcurrently.
type decisions struct {
	n, admitted int64
	slowest     time.Duration
	took        time.Duration
}

// decideConcurrently runs callers goroutines, each making each decisions for a (as requests of
// that many connections would), and reports how many were admitted and the longest wait.
func decideConcurrently(g *GlobalLimiter, callers, each int, a netip.Addr) decisions {
	var wg sync.WaitGroup
	var slowest, admitted atomic.Int64
	t0 := time.Now()
	for i := 0; i < callers; i++ {
		wg.Go(func() {
			for j := 0; j < each; j++ {
				d0 := time.Now()
				if ok, _ := g.AllowIP(a, d0); ok {
					admitted.Add(1)
				}
				d := int64(time.Since(d0))
				for m := slowest.Load(); d > m && !slowest.CompareAndSwap(m, d); m = slowest.Load() {
				}
			}
		})
	}
	wg.Wait()
	return decisions{n: int64(callers * each), admitted: admitted.Load(), slowest: time.Duration(slowest.Load()), took: time.Since(t0)}
}

// waitRedisDecision makes decisions for a every 5 ms until one comes from Redis (admitted, with
// the client up) and returns how long that took; beyond 5 s it fails the test, when saying at
// what point of the test the decision was awaited.
func waitRedisDecision(t *testing.T, in *instance, a netip.Addr, when string) time.Duration {
	t.Helper()
	return testnet.Within(t, "a decision from redis "+when, 5*time.Second, func() bool {
		ok, _ := in.g.AllowIP(a, time.Now())
		return ok && in.r.Up()
	})
}

// maxRecovery bounds the time from Redis being back to a decision from it: the breaker's pause
// (the next probe), the background redial's pause, and slack for a busy machine.
const maxRecovery = redisBreakerPause + redisRedialPause + 500*time.Millisecond

// TestGlobalRedisKilled kills Redis mid-run under each on_error mode, with 16 callers deciding
// at once before, during and after: no decision waits longer than the timeout (the client
// reconnects in the background, and a decision that finds it reconnecting fails at once), the
// verdicts follow the mode, every failure is counted, and decisions come from Redis again within
// about a second of its restart.
func TestGlobalRedisKilled(t *testing.T) {
	for _, mode := range []struct {
		name string
		m    OnError
	}{{"local", OnErrorLocal}, {"allow", OnErrorAllow}, {"deny", OnErrorDeny}} {
		t.Run(mode.name, func(t *testing.T) {
			s := redistest.Start(t)
			in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: failTimeout}, "/k", 1000, 1000, mode.m)
			// The local fallback is tighter, so that its verdicts can be told apart.
			in.g.local.SetRate(0.001, 2)
			a := netip.MustParseAddr("203.0.113.9")
			// Before the kill, decisions from Redis (a busy machine may miss the first timeout).
			waitRedisDecision(t, in, a, "before the kill")
			errs0 := in.errors.Get()
			s.Stop()
			d := decideConcurrently(in.g, 16, 20, a)
			t.Logf("%d decisions with redis killed: %s in all, slowest %s", d.n, d.took, d.slowest)
			if d.slowest > failTimeout+failSlack {
				t.Fatalf("a decision waited %s with redis killed, timeout %s", d.slowest, failTimeout)
			}
			want := map[OnError]int64{OnErrorLocal: 2, OnErrorAllow: d.n, OnErrorDeny: 0}[mode.m]
			if d.admitted != want {
				t.Fatalf("%d of %d admitted with redis down, want %d", d.admitted, d.n, want)
			}
			// Every decision failed and was counted; past the first failure of each connection
			// they found the client reconnecting and did not wait.
			if up, n := in.r.Up(), in.errors.Get()-errs0; up || n != uint64(d.n) {
				t.Fatalf("with redis down: up=%v errors=%d, want down and %d", up, n, d.n)
			}
			// Restarted while callers keep deciding: still bounded, and Redis decides again soon.
			s.Restart()
			done := make(chan decisions)
			go func() { done <- decideConcurrently(in.g, 16, 20, netip.MustParseAddr("203.0.113.11")) }()
			took := waitRedisDecision(t, in, netip.MustParseAddr("203.0.113.10"), "after its restart")
			d = <-done
			t.Logf("decisions from redis again %s after it came back; %d decisions meanwhile, slowest %s", took, d.n, d.slowest)
			if d.slowest > failTimeout+failSlack {
				t.Fatalf("a decision waited %s while redis came back, timeout %s", d.slowest, failTimeout)
			}
			if took > maxRecovery {
				t.Fatalf("recovery took %s, want within %s", took, maxRecovery)
			}
		})
	}
}

// TestGlobalSilentRedis: a server that accepts connections and never answers (not even HELLO).
// Decisions of 16 callers at once wait at most the timeout, then on_error decides; after 5 the
// breaker skips Redis, so they cost nothing.
func TestGlobalSilentRedis(t *testing.T) {
	s := startSilentRedis(t)
	r, err := NewRedis(RedisOptions{Addrs: []string{s.Addr}, Timeout: failTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	errs := metrics.NewSet().NewCounter(`toron_ratelimit_backend_errors_total{route="/s"}`)
	g := NewGlobalLimiter(r, 1, 1, GlobalOptions{Route: "/s", Local: NewRateLimiter(1, 1, 0), OnError: OnErrorAllow, Errors: errs})
	d := decideConcurrently(g, 16, 20, netip.MustParseAddr("192.0.2.99"))
	t.Logf("%d decisions against a silent redis: %s in all, slowest %s", d.n, d.took, d.slowest)
	if d.admitted != d.n {
		t.Fatalf("%d of %d admitted under on_error allow", d.admitted, d.n)
	}
	if d.slowest > failTimeout+failSlack {
		t.Fatalf("a decision waited %s, timeout %s", d.slowest, failTimeout)
	}
	if d.took > 2*time.Second {
		t.Fatalf("%d decisions took %s: the breaker did not skip the silent redis", d.n, d.took)
	}
	if errs.Get() != uint64(d.n) || r.Up() {
		t.Fatalf("errors=%d up=%v, want %d and down", errs.Get(), r.Up(), d.n)
	}
}

// TestGlobalKeyFlood: a million distinct keys leave the process's heap flat. While Redis is down
// every decision is the local fallback's, bounded at DefaultRateLimitKeys buckets; while it is
// up, the process keeps nothing per key at all.
func TestGlobalKeyFlood(t *testing.T) {
	s := redistest.Start(t)
	in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: time.Second}, "/flood", 1, 1, OnErrorLocal)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	key := func(i int) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)})
	}
	// Up: 20,000 keys through Redis.
	h0 := heap()
	for i := 0; i < 20_000; i++ {
		in.g.AllowIP(key(i), time.Now())
	}
	h1 := heap()
	if in.errors.Get() != 0 {
		t.Fatalf("%d backend errors with redis up", in.errors.Get())
	}
	s.Stop()
	// Down: the first 200,000 keys fill the fallback's table, the next 800,000 change nothing.
	now := time.Now()
	for i := 0; i < 200_000; i++ {
		in.g.AllowIP(key(1<<24+i), now)
	}
	h2 := heap()
	for i := 200_000; i < 1_000_000; i++ {
		in.g.AllowIP(key(1<<24+i), now)
	}
	h3 := heap()
	t.Logf("heap: %d KiB, after 20k keys through redis %d KiB, after 200k local %d KiB, after 1M %d KiB; local keys %d",
		h0>>10, h1>>10, h2>>10, h3>>10, in.g.local.keys.Load())
	if grow := int64(h1) - int64(h0); grow > 4<<20 {
		t.Fatalf("20k keys through redis grew the heap by %d KiB", grow>>10)
	}
	if grow := int64(h3) - int64(h2); grow > 4<<20 {
		t.Fatalf("800k more keys grew the heap by %d KiB: the fallback is not bounded", grow>>10)
	}
	if n := in.g.local.keys.Load(); n > DefaultRateLimitKeys {
		t.Fatalf("fallback holds %d keys, bound %d", n, DefaultRateLimitKeys)
	}
}

// TestGlobalFrozenRedis: a connected Redis stops answering mid-run (SIGSTOP: its socket still
// accepts connections and bytes, nothing comes back). Decisions of 16 callers at once end at the
// timeout, the breaker then skips Redis, its probes (a reconnection: HELLO on a connection that
// never answers) still end at the timeout, and once Redis runs again (SIGCONT) it decides within
// about a second.
func TestGlobalFrozenRedis(t *testing.T) {
	s := redistest.Start(t)
	in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: failTimeout}, "/f", 1000, 1000, OnErrorDeny)
	a := netip.MustParseAddr("192.0.2.50")
	// Before the freeze, one decision from Redis (a busy machine may miss the first timeout).
	waitRedisDecision(t, in, a, "before the freeze")
	errsBefore := in.errors.Get()
	s.Freeze()
	d := decideConcurrently(in.g, 16, 10, a)
	// Past the breaker's pause: the probes reconnect to the frozen server.
	time.Sleep(redisBreakerPause)
	d2 := decideConcurrently(in.g, 16, 10, a)
	t.Logf("decisions against a frozen redis: %d in %s, slowest %s; after the pause %d in %s, slowest %s",
		d.n, d.took, d.slowest, d2.n, d2.took, d2.slowest)
	if slowest := max(d.slowest, d2.slowest); slowest > failTimeout+failSlack {
		t.Fatalf("a decision waited %s, timeout %s", slowest, failTimeout)
	}
	if n := d.n + d2.n; d.admitted+d2.admitted != 0 || in.errors.Get()-errsBefore != uint64(n) || in.r.Up() {
		t.Fatalf("admitted %d, errors %d, up %v: want the deny verdict %d times and redis down",
			d.admitted+d2.admitted, in.errors.Get()-errsBefore, in.r.Up(), n)
	}
	s.Thaw()
	took := waitRedisDecision(t, in, a, "after it runs again")
	t.Logf("decisions from redis again %s after it ran again", took)
	if took > maxRecovery {
		t.Fatalf("recovery took %s, want within %s", took, maxRecovery)
	}
}
