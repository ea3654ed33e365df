package testnet

import (
	"context"
	"testing"
	"time"
)

// ShutdownAtEnd calls shutdown (a server's or a tracer's Shutdown) when the test ends, with
// 5 s to finish; what it returns is not the test's concern.
func ShutdownAtEnd(t testing.TB, shutdown func(context.Context) error) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx)
	})
}
