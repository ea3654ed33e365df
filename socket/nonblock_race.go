//go:build race

package socket

import (
	"runtime"
	"unsafe"
)

// Under the race detector the raw calls tell it what syscall.Read and syscall.Write would: the
// bytes the kernel wrote into a read's buffer and read from a write's, and an order from every
// write to every later read (through raceIOSync, as the syscall package does through its own).
// Without this, a race on a buffer handed to the kernel would go unseen.

var raceIOSync int64

// raceRead follows a read or peek that succeeded with n bytes.
func raceRead(p []byte, n int) {
	if n > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&p[0]), n)
	}
	runtime.RaceAcquire(unsafe.Pointer(&raceIOSync))
}

// raceWrite precedes a write of p.
func raceWrite(p []byte) {
	runtime.RaceReleaseMerge(unsafe.Pointer(&raceIOSync))
	if len(p) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(&p[0]), len(p))
	}
}
