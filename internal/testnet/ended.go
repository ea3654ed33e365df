package testnet

import (
	"testing"
	"time"
)

// Ended waits up to limit for what (a goroutine, a server's Close) to report its end on done,
// and returns the error it reported; the test fails at once when it has not ended by then.
func Ended(t testing.TB, what string, limit time.Duration, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("%s did not end within %s", what, limit)
		return nil
	}
}
