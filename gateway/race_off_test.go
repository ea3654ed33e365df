//go:build !race

package gateway

// raceEnabled: the race detector instruments allocations too, so allocation counts mean nothing.
const raceEnabled = false
