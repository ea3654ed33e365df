package upstream

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a checker goroutine outlives its test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
