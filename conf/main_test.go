package conf

import (
	"testing"

	"go.uber.org/goleak"
)

// The watcher starts goroutines: none may outlive its Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
