package tracing

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when an export goroutine or a collector connection outlives its
// test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
