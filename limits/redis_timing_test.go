package limits

import (
	"context"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"toron/internal/redistest"
	"toron/internal/testnet"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The client choice (docs/rate-limits.md): the same GCRA script run by 64 concurrent callers
// against one local redis-server, through rueidis (auto-pipelining) and through go-redis/v9 (a
// pooled connection per command). Reported per decision: this process's CPU, redis-server's
// CPU, and decisions per round trip (commands Redis processed per read syscall it made, from /proc/PID/io).

// redisStats is a sample of INFO counters.
type redisStats struct {
	commands, reads float64
	cpu             float64 // seconds, user + sys
}

func sampleRedis(tb testing.TB, s *redistest.Server) redisStats {
	tb.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	info, err := c.Do(context.Background(), c.B().Info().Section("everything").Build()).ToString()
	if err != nil {
		tb.Fatal(err)
	}
	var st redisStats
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(v, 64)
		switch k {
		case "cmdstat_evalsha", "cmdstat_eval":
			// calls=N,usec=...: the decisions (the script's own TIME, GET and SET count in
			// total_commands_processed, so that total is not used).
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			f, _ = strconv.ParseFloat(calls, 64)
			st.commands += f
		case "used_cpu_user", "used_cpu_sys":
			st.cpu += f
		}
	}
	// Read syscalls of redis-server: one per batch of commands that arrived together.
	io, err := os.ReadFile("/proc/" + strconv.Itoa(s.Process().Pid) + "/io")
	if err == nil {
		for _, line := range strings.Split(string(io), "\n") {
			if v, ok := strings.CutPrefix(line, "syscr: "); ok {
				st.reads, _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return st
}

// runDecisions runs b.N decisions from 64 goroutines and reports the figures.
func runDecisions(b *testing.B, s *redistest.Server, decide func(i int64) error) {
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/runtimeProcs()))
	var seq atomic.Int64
	var failed atomic.Int64
	before, cpu0 := sampleRedis(b, s), testnet.ProcessCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if decide(seq.Add(1)) != nil {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	cpu1, after := testnet.ProcessCPU(), sampleRedis(b, s)
	if failed.Load() > 0 {
		b.Fatalf("%d decisions failed", failed.Load())
	}
	n := float64(b.N)
	b.ReportMetric(float64(cpu1-cpu0)/n, "client-cpu-ns/op")
	b.ReportMetric((after.cpu-before.cpu)*1e9/n, "redis-cpu-ns/op")
	// The samples' own INFO commands and reads are negligible beside b.N.
	if reads := after.reads - before.reads; reads > 0 {
		b.ReportMetric((after.commands-before.commands)/reads, "decisions/roundtrip")
	}
}

// rueidisGCRA is the decision script for rueidis, the client Toron used before its own.
var rueidisGCRA = rueidis.NewLuaScript(gcraScript)

// newRueidis is a rueidis client of addr configured as Toron's was before its own client: one
// pipelined connection, 64 KiB buffers, a 20µs flush delay, no cache and no retries.
func newRueidis(b *testing.B, addr string) rueidis.Client {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true,
		DisableRetry: true, ReadBufferEachConn: 64 << 10, WriteBufferEachConn: 64 << 10,
		PipelineMultiplex: -1, MaxFlushDelay: 20 * time.Microsecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c
}

func BenchmarkRedisClient(b *testing.B) {
	s := redistest.Start(b)
	args := []string{"1000", "1000000"} // 1000/s, burst 1001: every decision writes
	keyOf := func(i int64) string { return "toron:rl:{bench}:" + strconv.FormatInt(i%1024, 16) }

	b.Run("toron", func(b *testing.B) {
		r := newTestRedis(b, RedisOptions{Addrs: []string{s.Addr}, Timeout: time.Second})
		runDecisions(b, s, func(i int64) error {
			_, err := r.decide("toron:rl:{bench}:", strconv.AppendInt(nil, i%1024, 16), args)
			return err
		})
	})
	b.Run("rueidis", func(b *testing.B) {
		c := newRueidis(b, s.Addr)
		runDecisions(b, s, func(i int64) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return rueidisGCRA.Exec(ctx, c, []string{keyOf(i)}, args).Error()
		})
	})
	b.Run("go-redis", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr})
		defer c.Close()
		script := goredis.NewScript(gcraScript)
		runDecisions(b, s, func(i int64) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return script.Run(ctx, c, []string{keyOf(i)}, args[0], args[1]).Err()
		})
	})
}

// BenchmarkGlobalLimiter is one decision of the limiter itself (key hashing, the script, the
// verdict) under 64 concurrent callers, against BenchmarkLocalLimiter64, the same through the
// per-instance limiter.
func BenchmarkGlobalLimiter(b *testing.B) {
	s := redistest.Start(b)
	r := newTestRedis(b, RedisOptions{Addrs: []string{s.Addr}, Timeout: time.Second})
	g := NewGlobalLimiter(r, 1e6, 1e6, GlobalOptions{Route: "bench", Local: NewRateLimiter(1e6, 1e6, 0)})
	now := time.Now()
	runDecisions(b, s, func(i int64) error {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		if ok, _ := g.AllowIP(a, now); !ok {
			return errBadVerdict
		}
		return nil
	})
	if !r.Up() {
		b.Fatal("redis was down during the benchmark")
	}
}

// BenchmarkLocalLimiter64 is BenchmarkGlobalLimiter's baseline: the per-instance limiter.
func BenchmarkLocalLimiter64(b *testing.B) {
	l := NewRateLimiter(1e6, 1e6, 0)
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/runtimeProcs()))
	var seq atomic.Int64
	cpu0 := testnet.ProcessCPU()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			l.Allow(IPKey(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})), time.Now())
		}
	})
	b.ReportMetric(float64(testnet.ProcessCPU()-cpu0)/float64(b.N), "client-cpu-ns/op")
}

// BenchmarkRedisPaced is the case of a route at a few thousand requests per second: one caller,
// one decision every 200µs (5,000 per second), so decisions come one at a time and nothing is
// pipelined. Each op is a round of 500 decisions through each of: Toron's client, rueidis, a
// bare round trip (EVALSHA written and its reply read on a plain connection in the caller's
// goroutine, the floor of any client that waits for Redis), and no call at all (the pacing's
// own cost). Reported: the medians over the rounds of the CPU and the thread context switches
// per decision of this process, the pacing's subtracted.
func BenchmarkRedisPaced(b *testing.B) {
	s := redistest.Start(b)
	r := newTestRedis(b, RedisOptions{Addrs: []string{s.Addr}, Timeout: time.Second})
	rc := newRueidis(b, s.Addr)
	bare, _, err := r.dialNode(s.Addr, false)
	if err != nil {
		b.Fatal(err)
	}
	defer bare.Close()
	args := []string{"1000", "1000000"}
	cmd := scriptCmd{"EVALSHA", gcraSHA, "toron:rl:{bench}:", []byte("0123456789abcdef"), args}.append(nil)
	rbuf := make([]byte, 512)
	variants := []struct {
		name string
		call func() error
	}{
		{"toron", func() error { _, err := r.decide("toron:rl:{bench}:", []byte("0123456789abcdef"), args); return err }},
		{"rueidis", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return rueidisGCRA.Exec(ctx, rc, []string{"toron:rl:{bench}:0123456789abcdef"}, args).Error()
		}},
		{"bare", func() error {
			_ = bare.SetDeadline(time.Now().Add(time.Second))
			if _, err := bare.Write(cmd); err != nil {
				return err
			}
			got := 0
			for {
				n, err := bare.Read(rbuf[got:])
				if err != nil {
					return err
				}
				got += n
				if _, m, err := parseVerdict(rbuf[:got]); err != nil || m > 0 {
					return err
				}
			}
		}},
		{"idle", func() error { return nil }},
	}
	const perRound = 500
	cpu := make([][]float64, len(variants))
	csw := make([][]float64, len(variants))
	b.ResetTimer()
	for range b.N {
		for vi, v := range variants {
			c0, s0 := testnet.ProcessCPU(), ctxSwitches()
			next := time.Now()
			for range perRound {
				next = next.Add(200 * time.Microsecond)
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				if err := v.call(); err != nil {
					b.Fatalf("%s: %v", v.name, err)
				}
			}
			cpu[vi] = append(cpu[vi], float64(testnet.ProcessCPU()-c0)/perRound)
			csw[vi] = append(csw[vi], float64(ctxSwitches()-s0)/perRound)
		}
	}
	b.StopTimer()
	idle := len(variants) - 1
	for vi, v := range variants[:idle] {
		var dc, ds []float64
		for i := range cpu[vi] {
			dc = append(dc, cpu[vi][i]-cpu[idle][i])
			ds = append(ds, csw[vi][i]-csw[idle][i])
		}
		b.ReportMetric(median(dc), v.name+"-cpu-ns/decision")
		b.ReportMetric(median(ds), v.name+"-ctxsw/decision")
	}
	b.ReportMetric(median(cpu[idle]), "pacing-cpu-ns/decision")
}

// ctxSwitches is the number of thread context switches of this process so far.
func ctxSwitches() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Nvcsw + ru.Nivcsw
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
