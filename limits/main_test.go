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
	goleak.VerifyTestMain(m)
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
	for r.client.Load() == nil {
		if time.Now().After(deadline) {
			tb.Fatalf("redis client not connected to %v within 10s", o.Addrs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r
}
