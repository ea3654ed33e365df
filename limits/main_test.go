package limits

import (
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine of the Redis client or of a test's fake Redis
// outlives its test.
func TestMain(m *testing.M) {
	// rueidis closes the connections a cluster refresh replaced 5 s later, from a goroutine
	// that even Close does not end (cluster.go, _refresh), and delays a cluster's lazy refresh
	// by up to a second in another (singleflight.go, DelayDo); both end by themselves.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// newTestRedis returns a client of o closed at the end of the test, after waiting (up to 10 s)
// until its background connector reached the server.
func newTestRedis(tb testing.TB, o RedisOptions) *Redis {
	tb.Helper()
	r, err := NewRedis(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	deadline := time.Now().Add(10 * time.Second)
	for !r.Connected() {
		if time.Now().After(deadline) {
			tb.Fatalf("redis client not connected to %v within 10s", o.Addrs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r
}
